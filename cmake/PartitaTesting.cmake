# One helper per kind of test (STYLE.md).
find_package(GTest REQUIRED)
find_package(rapidcheck REQUIRED)

# A one-process GoogleTest binary (reference spec tests, unit tests).
function(partita_add_serial_test name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE GTest::gtest GTest::gtest_main partita_reference)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS serial)
endfunction()

# An MPI GoogleTest binary (its own main: partita_mpi_gtest_main) registered
# as one ctest per rank count: partita_add_mpi_test(name RANKS 1 2 4 SOURCES ...)
function(partita_add_mpi_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "RANKS;SOURCES;ENV" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT ${PARTITA_MPI_TIMEOUT})
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE partita_harness)
  foreach(n IN LISTS ARG_RANKS)
    add_test(NAME ${name}_np${n}
             COMMAND ${PARTITA_MPIEXEC} -n ${n} $<TARGET_FILE:${name}>)
    # The watchdog aborts a rank stuck in a wait well before ctest's timeout
    # would kill the job silently.
    math(EXPR watchdog "${ARG_TIMEOUT} - 30")
    set_tests_properties(${name}_np${n} PROPERTIES
      TIMEOUT ${ARG_TIMEOUT}
      PROCESSORS 2
      LABELS "mpi;np${n}"
      ENVIRONMENT "PARTITA_WAIT_TIMEOUT=${watchdog};OMP_NUM_THREADS=1;${ARG_ENV}")
  endforeach()
endfunction()
