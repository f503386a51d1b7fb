# A one-sided exception (docs/testing.md): runs OneSided.SITUATION and
# OneSided.Next of PROGRAM on RANKS ranks and judges the job.
#
#  - every situation: the job ends within LIMIT seconds, with a non-zero exit
#    status, and the agreed summary names OneSided.SITUATION as failed;
#  - InBody, InVerdict, InLayer: the run goes on: OneSided.Next runs and
#    passes (rank 0's "[       OK ] OneSided.Next", and it is not in the
#    summary's list of failures);
#  - RawCall: the rank stuck in the raw call is named by the watchdog with
#    the test ("partita: rank 0 made no progress ... in test
#    OneSided.RawCall").
#
# cmake -DMPIEXEC=... -DPROGRAM=... -DSITUATION=InBody -DRANKS=2 -DLIMIT=20 -P run_one_sided.cmake
include(${CMAKE_CURRENT_LIST_DIR}/death_verdict.cmake)
foreach(v MPIEXEC PROGRAM SITUATION RANKS LIMIT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_one_sided.cmake: -D${v}=... is required")
  endif()
endforeach()
string(TIMESTAMP t0 "%s")
execute_process(COMMAND timeout -k 5 120 ${MPIEXEC} -n ${RANKS} ${PROGRAM}
                        --gtest_filter=OneSided.${SITUATION}:OneSided.Next
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
string(TIMESTAMP t1 "%s")
math(EXPR seconds "${t1} - ${t0}")
set(all "${out}\n${err}")
set(problems "")
if(seconds GREATER ${LIMIT})
  string(APPEND problems "the job took ${seconds} s, more than ${LIMIT} s; ")
endif()
if(rc EQUAL 0)
  string(APPEND problems "the exit status is 0; ")
endif()
if(SITUATION STREQUAL "RawCall")
  if(NOT all MATCHES "partita: rank [0-9]+ made no progress for [0-9.]+ s \\(PARTITA_WAIT_TIMEOUT\\) in test OneSided.RawCall")
    string(APPEND problems "no rank's watchdog names the test and the rank stuck in it; ")
  endif()
else()
  if(NOT all MATCHES "\\[  FAILED  \\] OneSided.${SITUATION} on rank")
    string(APPEND problems "the summary does not name OneSided.${SITUATION} as failed; ")
  endif()
  if(NOT all MATCHES "\\[       OK \\] OneSided.Next")
    string(APPEND problems "OneSided.Next did not run and pass on rank 0; ")
  endif()
  if(all MATCHES "FAILED  \\] OneSided.Next")
    string(APPEND problems "OneSided.Next failed; ")
  endif()
endif()
set(report "OneSided.${SITUATION} at ${RANKS} ranks: exit status ${rc} after ${seconds} s\n--- output ---\n${all}")
death_verdict()
