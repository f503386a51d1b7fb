# ctest install_consumer_np2 (issue 10): installs the build into a prefix,
# configures and builds examples/consumer against it with nothing but
# find_package(partita) and partita::core, and runs it at 2 ranks.
# With -DPROJECT=custom_layer (ctest install_custom_layer, issue 30): builds
# examples/custom_layer against the install (partita::testing and its
# partita_add_mpi_test helper) and runs its ctest suite.
if(NOT DEFINED PROJECT)
  set(PROJECT consumer)
endif()
foreach(v BUILD_DIR SOURCE_DIR WORK MPIEXEC MPI_CXX_COMPILER)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "test_consumer.cmake needs -D${v}=")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()
if(LIBRARY_ONLY)
  # The library-only build: configured from the sources with GoogleTest,
  # RapidCheck and CLI11 hidden from find_package (it must need none of
  # them), built, and installed into the clean prefix in place of BUILD_DIR.
  step(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK}/library -G Ninja -DCMAKE_BUILD_TYPE=Release
       -DPARTITA_BUILD_TESTS=OFF -DPARTITA_UNITY_BUILD=ON -DMPI_CXX_COMPILER=${MPI_CXX_COMPILER}
       -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_rapidcheck=ON
       -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON)
  step(${CMAKE_COMMAND} --build ${WORK}/library)
  set(BUILD_DIR ${WORK}/library)
endif()
step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK}/prefix)
if(LIBRARY_ONLY AND (EXISTS ${WORK}/prefix/bin/partita OR EXISTS ${WORK}/prefix/include/partita/testing))
  message(FATAL_ERROR "the library-only install holds partita::testing or the partita command")
endif()
step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/${PROJECT} -B ${WORK}/build -G Ninja
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK}/prefix
     -DMPI_CXX_COMPILER=${MPI_CXX_COMPILER})
step(${CMAKE_COMMAND} --build ${WORK}/build)
if(PROJECT STREQUAL "custom_layer")
  step(${CMAKE_CTEST_COMMAND} --test-dir ${WORK}/build --output-on-failure -V)
  message(STATUS "${step_output}")
  if(NOT step_output MATCHES "100% tests passed, 0 tests failed out of 6")
    message(FATAL_ERROR "examples/custom_layer's suite did not pass its 6 tests")
  endif()
  # The installed `partita conformance` on the user's own manifest.
  step(${WORK}/prefix/bin/partita conformance --suites ${WORK}/build/conformance_suites.json --ranks 1,2)
  message(STATUS "${step_output}")
  if(NOT step_output MATCHES "CONFORMANCE PASSED")
    message(FATAL_ERROR "partita conformance did not pass the example's manifest")
  endif()
  return()
endif()
step(${MPIEXEC} -n 2 ${WORK}/build/app)
message(STATUS "${step_output}")
foreach(r 0 1)
  if(NOT step_output MATCHES "rank ${r}: OK")
    message(FATAL_ERROR "rank ${r} did not say OK:\n${step_output}")
  endif()
endforeach()
