# Runs the libFuzzer target FUZZER (named NAME in messages) for RUNS
# executions from the checked-in CORPUS (read only: new inputs go to WORK)
# with a fixed seed, and the libFuzzer dictionary DICT if given. Fails on
# any finding (a crash, a sanitizer report, an exception the reader does not
# promise, a broken property the target checks) and if the corpus was not
# loaded.
if(NOT NAME)
  set(NAME "fuzzer")
endif()
set(dict_arg "")
if(DICT)
  set(dict_arg -dict=${DICT})
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND ${FUZZER} -runs=${RUNS} -seed=1 -max_len=4096 -timeout=20 -rss_limit_mb=4096
                        ${dict_arg} -artifact_prefix=${WORK}/ ${WORK} ${CORPUS}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
string(REGEX MATCH "INFO: seed corpus: files: ([0-9]+)" seeded "${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NAME} failed (exit ${rc}); artifacts in ${WORK}\n${err}")
endif()
if(NOT seeded OR CMAKE_MATCH_1 EQUAL 0)
  message(FATAL_ERROR "${NAME}: the fuzzer did not load the corpus ${CORPUS}\n${err}")
endif()
string(REGEX MATCH "Done [0-9]+ runs in [0-9]+ second" done "${err}")
message(STATUS "${NAME}: ${seeded}; ${done}")
