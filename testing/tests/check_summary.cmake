# Rank 0's final summary must tell the ranks' agreed result (docs/testing.md,
# "The summary of an MPI test run"): runs PROGRAM (summary_demo.cpp) with
# MPIEXEC and checks what it prints.
foreach(v MPIEXEC PROGRAM)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_summary.cmake needs -D${v}=")
  endif()
endforeach()

# run(RANKS FILTER EXPECT_FAIL out_var)
function(run ranks filter expect_fail out_var)
  execute_process(COMMAND ${MPIEXEC} -n ${ranks} ${PROGRAM} --gtest_filter=${filter}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(text "${out}${err}")
  message(STATUS "${ranks} ranks, --gtest_filter=${filter}: exit ${rc}\n${text}")
  if(expect_fail AND rc EQUAL 0)
    message(FATAL_ERROR "the run passed although a test failed on some rank")
  elseif(NOT expect_fail AND NOT rc EQUAL 0)
    message(FATAL_ERROR "the run failed although every test passed")
  endif()
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

function(expect_line text line)
  string(FIND "${text}" "\n${line}\n" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "no line '${line}' in the output")
  endif()
endfunction()

function(expect_no_passed text)
  if(text MATCHES "\\[  PASSED  \\]")
    message(FATAL_ERROR "a [  PASSED  ] line although a test failed on some rank")
  endif()
endfunction()

# Tests that fail on rank 1 only: rank 0 passed them both.
run(2 "Summary.*" TRUE two)
expect_no_passed("${two}")
expect_line("${two}" "[  FAILED  ] Summary.FailsOnRankOne on rank 1")
expect_line("${two}" "[  FAILED  ] Summary.FailsOffRankZero on rank 1")
expect_line("${two}" " 2 FAILED TESTS (on any rank)")

# The ranks are listed, in order.
run(3 "Summary.FailsOffRankZero" TRUE three)
expect_no_passed("${three}")
expect_line("${three}" "[  FAILED  ] Summary.FailsOffRankZero on ranks 1,2")
expect_line("${three}" " 1 FAILED TEST (on any rank)")

# When nothing failed anywhere gtest's own summary stays.
run(2 "Summary.PassesEverywhere" FALSE passing)
expect_line("${passing}" "[  PASSED  ] 1 test.")
if(passing MATCHES "FAILED")
  message(FATAL_ERROR "a FAILED line although every test passed")
endif()
message(STATUS "rank 0's summary names the tests that failed on other ranks")
