# A planted bug must be caught, and its replay line must reproduce it:
# runs PROGRAM at RANKS with PARTITA_EXAMPLE_PLANT=PLANT, expects a failure
# with a "replay:" line, runs that line (with the plant) and expects the
# same failing case and the same check to fail again. EXPECT: the words
# some rank's failing check must start with (e.g. "layer_norm backward").
foreach(v MPIEXEC PROGRAM PLANT RANKS EXPECT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_plant.cmake needs -D${v}=")
  endif()
endforeach()

function(run_suite out_var)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env PARTITA_EXAMPLE_PLANT=${PLANT} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "the suite passed with the planted bug '${PLANT}':\n${out}${err}")
  endif()
  set(${out_var} "${out}${err}" PARENT_SCOPE)
endfunction()

# The first failing case (printed at once) and the checks that failed in it:
# the "  case:" line and the first "  rank N:" line after the first "case
# failed" line. Other ranks' lines may come between them (mpiexec merges the
# ranks' output as it reads it), so each is looked for on its own.
function(first_failure text case_var why_var)
  string(FIND "${text}" "case failed at " at)
  if(at EQUAL -1)
    message(FATAL_ERROR "no failing case in the output:\n${text}")
  endif()
  string(SUBSTRING "${text}" ${at} -1 rest)
  foreach(field case rank)
    if(field STREQUAL "case")
      set(pattern "\n  case: ")
    else()
      set(pattern "\n  rank ")
    endif()
    string(FIND "${rest}" "${pattern}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "no '${pattern}' line after the failing case:\n${rest}")
    endif()
    string(SUBSTRING "${rest}" ${at} -1 rest)
    string(REGEX MATCH "^\n  (case|rank [0-9]+): ([^;\n]*)" line "${rest}")
    set(${field}_text "${CMAKE_MATCH_2}")
    string(SUBSTRING "${rest}" 1 -1 rest)
  endforeach()
  set(${case_var} "${case_text}" PARENT_SCOPE)
  # Numbers differ in their last digits between runs only if the run is
  # not deterministic; the check's name and words must be the same.
  string(REGEX REPLACE "[0-9][-+0-9.e]*" "#" why "${rank_text}")
  set(${why_var} "${why}" PARENT_SCOPE)
endfunction()

run_suite(first ${MPIEXEC} -n ${RANKS} ${PROGRAM})
message(STATUS "planted '${PLANT}', first run:\n${first}")
if(NOT first MATCHES "replay: RC_PARAMS=\"([^\"]*)\" ([^\n]*)")
  message(FATAL_ERROR "no replay line in the output")
endif()
set(params "${CMAKE_MATCH_1}")
separate_arguments(command UNIX_COMMAND "${CMAKE_MATCH_2}")
first_failure("${first}" case1 why1)
# Some rank's failure in the first failing case names the expected check.
if(NOT first MATCHES "rank [0-9]+: ([^\n]*; )?${EXPECT}")
  message(FATAL_ERROR "the plant '${PLANT}' was caught, but no rank failed '${EXPECT}'")
endif()

run_suite(second RC_PARAMS=${params} ${command})
message(STATUS "replayed:\n${second}")
first_failure("${second}" case2 why2)
if(NOT case1 STREQUAL case2 OR NOT why1 STREQUAL why2)
  message(FATAL_ERROR "the replay failed differently:\n  ${case1}: ${why1}\n  ${case2}: ${why2}")
endif()
message(STATUS "PLANT CAUGHT AND REPLAYED: '${PLANT}' fails case ${case1}: ${why1}")
