# A rank that dies (issue 35 item 3): launches PROGRAM MODE on RANKS ranks
# with MPIEXEC (MPICH's Hydra, -print-all-exitcodes) and judges the job:
#
#  - it ends within 30 s (a hang is killed at 30 s and fails the test);
#  - the launcher's exit status is non-zero;
#  - every other rank reached the operation ("rank R waits in MODE") and
#    none returned from it ("rank R finished MODE");
#  - the lost rank (VICTIM, world rank) is named, as NAMING says:
#    guard     every rank runs under partita_rank_guard (GUARD); exactly
#              one line "partita: world rank R (pid P on H) was lost: ..."
#              appears and R is the victim. Hydra alone does not single it
#              out: it names a pid, in 2 of 4 runs a survivor's that it
#              ended in its own clean-up (docs/testing.md). Also Hydra's
#              per-rank exit codes (-print-all-exitcodes) must show 9
#              (SIGKILL) at the victim's position;
#    throw     a surviving rank's error says "world rank VICTIM failed".
#    watchdog  the victim is stuck, not dead: every other rank's watchdog
#              says "partita: rank R waited S s (PARTITA_WAIT_TIMEOUT) in
#              WHAT" (PARTITA_WAIT_TIMEOUT comes from the test's
#              environment), WHAT naming an AllSumReduce.
#
# cmake -DMPIEXEC=... -DPROGRAM=... -DGUARD=... -DMODE=... -DRANKS=3 -DVICTIM=1 -DNAMING=guard -P run_death.cmake
include(${CMAKE_CURRENT_LIST_DIR}/death_verdict.cmake)
foreach(v MPIEXEC PROGRAM GUARD MODE RANKS VICTIM NAMING)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_death.cmake: -D${v}=... is required")
  endif()
endforeach()

string(TIMESTAMP t0 "%s")
# timeout sends SIGTERM to the launcher at 30 s (Hydra then ends every rank)
# and SIGKILL 5 s later if it is still there.
set(launcher_options -print-all-exitcodes)
execute_process(COMMAND timeout -k 5 30 ${MPIEXEC} ${launcher_options} -n ${RANKS} ${GUARD} ${PROGRAM} ${MODE}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
string(TIMESTAMP t1 "%s")
math(EXPR seconds "${t1} - ${t0}")
set(all "${out}\n${err}")
set(report "mode ${MODE} (${NAMING}), ${RANKS} ranks, rank ${VICTIM} lost: exit status ${rc} after ${seconds} s\n--- output ---\n${all}")

set(problems "")
if(rc EQUAL 124 OR rc EQUAL 137)
  string(APPEND problems "the job did not end within 30 s (killed by timeout); ")
elseif(rc EQUAL 0)
  string(APPEND problems "the launcher's exit status is 0; ")
endif()

if(NAMING STREQUAL "throw")
  # A survivor's error names the rank whose user code threw.
  if(NOT all MATCHES "rank [0-9]+ raised: [^\n]*world rank ${VICTIM} failed")
    string(APPEND problems "no surviving rank's error names world rank ${VICTIM}; ")
  endif()
elseif(NAMING STREQUAL "guard")
  # The guard of the victim, and no other, says its rank was lost.
  string(REGEX MATCHALL "partita: world rank [^ ]+ \\(pid [0-9]+ on [^)]*\\) was lost" lost "${all}")
  list(LENGTH lost n_lost)
  if(n_lost EQUAL 0)
    string(APPEND problems "no line names a lost rank; ")
  elseif(NOT n_lost EQUAL 1)
    string(APPEND problems "${n_lost} ranks are named lost, not only the victim; ")
  elseif(NOT lost MATCHES "world rank ${VICTIM} ")
    string(APPEND problems "the rank named lost is not rank ${VICTIM}: ${lost}; ")
  endif()
  # Hydra's "Exit codes: [host] c0,c1,..." lists every rank's exit code in
  # rank order: the victim's is 9 (SIGKILL).
  if(all MATCHES "Exit codes: \\[[^]]*\\] ([0-9,]+)")
    string(REPLACE "," ";" codes "${CMAKE_MATCH_1}")
    list(LENGTH codes n)
    if(NOT n EQUAL RANKS)
      string(APPEND problems "the launcher listed ${n} exit codes for ${RANKS} ranks; ")
    else()
      list(GET codes ${VICTIM} code)
      if(NOT code EQUAL 9)
        string(APPEND problems "rank ${VICTIM}'s exit code is ${code}, not 9 (SIGKILL); ")
      endif()
    endif()
  else()
    string(APPEND problems "the launcher's output names no rank's exit code; ")
  endif()
elseif(NAMING STREQUAL "watchdog")
  math(EXPR last_rank "${RANKS} - 1")
  foreach(r RANGE ${last_rank})
    if(NOT r EQUAL VICTIM AND NOT all MATCHES "partita: rank ${r} waited [0-9.]+ s \\(PARTITA_WAIT_TIMEOUT\\) in AllSumReduce")
      string(APPEND problems "rank ${r}'s watchdog did not name its AllSumReduce; ")
    endif()
  endforeach()
else()
  message(FATAL_ERROR "run_death.cmake: NAMING is guard, throw or watchdog, not '${NAMING}'")
endif()

math(EXPR last "${RANKS} - 1")
set(survivors "")
foreach(r RANGE ${last})
  if(NOT r EQUAL VICTIM)
    list(APPEND survivors ${r})
  endif()
endforeach()
death_check_survivors("its peer" ${survivors})
death_verdict()
