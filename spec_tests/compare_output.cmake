# Runs PROGRAM with ARGS (a ;-list) and compares stdout+stderr with GOLDEN.
execute_process(COMMAND ${PROGRAM} ${ARGS}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
file(READ ${GOLDEN} expected)
set(actual "${out}${err}")
if(NOT actual STREQUAL expected)
  message(FATAL_ERROR "output differs from ${GOLDEN} (exit ${rc}):\n--- got\n${actual}--- expected\n${expected}")
endif()
message(STATUS "matches ${GOLDEN}")
