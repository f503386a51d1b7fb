# A lost node (docs/testing.md, "A lost node"): launches GUARD PROGRAM MODE
# [cut] over 3 simulated nodes of 1 rank each, every node in its own network
# namespace (SIMNODES --netns), and judges the job. The node of world rank 1
# (node1) is lost in the middle of MODE:
#
#   HOW=kill  its rank is SIGKILLed; partita_rank_guard must name it,
#             alone: "partita: world rank 1 (pid P on node1) was lost";
#   HOW=cut   its link is set down while its rank lives on, unreachable;
#             every other rank's peer check must end it with "partita: rank
#             R on node nodeR waited S s in WHAT and lost contact with world
#             rank 1 (pid P) on node node1", P being rank 1's pid.
#   HOW=slow  nothing is lost: rank 1 joins MODE (slow) 8 s late, or
#             finishes at once (early), and the test sets
#             PARTITA_PEER_CHECK=2, so the others probe; a late rank
#             answers, a finished one said so, and the job must end with
#             status 0, every rank through the operation, no line of a lost
#             contact.
#
# kill and cut: the job ends within LIMIT seconds (default 30) with a
# non-zero status, and ranks 0 and 2 reached the operation ("rank R waits
# in MODE") and never returned from it.
#
# cmake -DSIMNODES=... -DPROGRAM=... -DGUARD=... -DMODE=... -DHOW=kill|cut -P run_lost_node.cmake
include(${CMAKE_CURRENT_LIST_DIR}/death_verdict.cmake)
foreach(v SIMNODES PROGRAM GUARD MODE HOW)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_lost_node.cmake: -D${v}=... is required")
  endif()
endforeach()
if(NOT DEFINED LIMIT)
  set(LIMIT 30)
endif()
set(args ${MODE})
if(HOW STREQUAL "cut")
  list(APPEND args cut)
elseif(NOT HOW STREQUAL "kill" AND NOT HOW STREQUAL "slow")
  message(FATAL_ERROR "run_lost_node.cmake: HOW is kill, cut or slow, not '${HOW}'")
endif()

string(TIMESTAMP t0 "%s")
# The launcher's own timeout (LIMIT + 20 s) ends a stuck job and cleans up;
# a job that ends after LIMIT seconds fails all the same.
math(EXPR launcher_timeout "${LIMIT} + 20")
execute_process(COMMAND ${SIMNODES} --nodes 3 --ranks-per-node 1 --netns --no-finalize
                        --timeout ${launcher_timeout} -- ${GUARD} ${PROGRAM} ${args}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
string(TIMESTAMP t1 "%s")
math(EXPR seconds "${t1} - ${t0}")
set(all "${out}\n${err}")
set(report "mode ${MODE}, node1 lost (${HOW}): exit status ${rc} after ${seconds} s\n--- output ---\n${all}")
if(rc EQUAL 77)
  message(STATUS "skipped: the launcher cannot make namespaces here\n${report}")
  return()
endif()

set(problems "")
if(HOW STREQUAL "slow")
  if(NOT rc EQUAL 0)
    string(APPEND problems "the job's exit status is ${rc}, not 0; ")
  endif()
  if(all MATCHES "lost contact")
    string(APPEND problems "a rank took its late, reachable peer as lost; ")
  endif()
  foreach(r 0 1 2)
    if(NOT all MATCHES "rank ${r} finished ${MODE}")
      string(APPEND problems "rank ${r} did not finish ${MODE}; ")
    endif()
  endforeach()
  death_verdict()
  return()
endif()
if(seconds GREATER LIMIT)
  string(APPEND problems "the job took ${seconds} s, more than ${LIMIT} s; ")
endif()
if(rc EQUAL 0)
  string(APPEND problems "the job's exit status is 0; ")
endif()

if(NOT all MATCHES "rank 1 is pid ([0-9]+)")
  string(APPEND problems "rank 1 never said its pid; ")
endif()
set(victim_pid "${CMAKE_MATCH_1}")
if(HOW STREQUAL "kill")
  string(REGEX MATCHALL "partita: world rank [^ ]+ \\(pid [0-9]+ on [^)]*\\) was lost" lost "${all}")
  list(LENGTH lost n_lost)
  if(NOT n_lost EQUAL 1)
    string(APPEND problems "${n_lost} ranks are named lost, not only rank 1: ${lost}; ")
  elseif(NOT lost MATCHES "world rank 1 \\(pid ${victim_pid} on node1\\)")
    string(APPEND problems "the rank named lost is not rank 1 (pid ${victim_pid}) on node1: ${lost}; ")
  endif()
else()
  foreach(r 0 2)
    if(NOT all MATCHES "partita: rank ${r} on node node${r} waited [0-9.]+ s in [^\n]* and lost contact with world rank 1 \\(pid ${victim_pid}\\) on node node1: ")
      string(APPEND problems "rank ${r}'s peer check did not name rank 1 (pid ${victim_pid}) on node1 alone; ")
    endif()
  endforeach()
endif()

death_check_survivors(node1 0 2)
death_verdict()
