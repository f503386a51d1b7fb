# Runs PROGRAM with ARGS (a ;-list) and compares stdout+stderr with GOLDEN
# (and, given EXPECT_RC, the exit status with it).
execute_process(COMMAND ${PROGRAM} ${ARGS}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(DEFINED EXPECT_RC AND NOT rc STREQUAL EXPECT_RC)
  message(FATAL_ERROR "exit status ${rc}, expected ${EXPECT_RC}:\n${out}${err}")
endif()
file(READ ${GOLDEN} expected)
set(actual "${out}${err}")
if(NOT actual STREQUAL expected)
  message(FATAL_ERROR "output differs from ${GOLDEN} (exit ${rc}):\n--- got\n${actual}--- expected\n${expected}")
endif()
message(STATUS "matches ${GOLDEN}")
