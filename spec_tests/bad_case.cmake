# Runs `partita run CASE` at 2 ranks and checks that the exit status is 2
# (a bad case file, not a conformance failure) and that every rank reports
# "ERROR CASE: EXPECT" (EXPECT names the field and what was expected).
execute_process(COMMAND ${MPIEXEC} -n 2 ${PROGRAM} run ${CASE}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
set(all "${out}${err}")
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "exit status ${rc}, expected 2:\n${all}")
endif()
foreach(rank 0 1)
  string(FIND "${all}" "rank ${rank}: ERROR ${CASE}: ${EXPECT}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "rank ${rank} did not report \"${CASE}: ${EXPECT}\":\n${all}")
  endif()
endforeach()
if(all MATCHES "c10::|Exception raised from|frame #")
  message(FATAL_ERROR "a raw LibTorch error leaked:\n${all}")
endif()
message(STATUS "exit 2, every rank: ${EXPECT}")
