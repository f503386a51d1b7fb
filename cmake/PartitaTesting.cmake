# One helper per kind of test.
find_package(GTest REQUIRED)
find_package(rapidcheck REQUIRED)

# A one-process GoogleTest binary (reference spec tests, unit tests).
function(partita_add_serial_test name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE GTest::gtest GTest::gtest_main partita_reference)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS serial)
endfunction()

# Every MPI test binary (issue 18, docs/testing.md): partita_add_mpi_test and
# the deadline settings come from the helpers partita::testing installs for
# its users (cmake/PartitaTestHelpers.cmake), so partita's suites are
# registered exactly as a user's are.
include(${CMAKE_CURRENT_LIST_DIR}/PartitaTestHelpers.cmake)

# The property suites' nightly form (issue 9): `ctest -L soak` runs NAME at
# each of RANKS with a fresh seed (printed) and ten times the cases; the
# default ctest run leaves them out (tools/test.sh: -LE soak).
function(partita_add_soak_test name)
  cmake_parse_arguments(ARG "" "CASES" "RANKS" ${ARGN})
  foreach(n IN LISTS ARG_RANKS)
    add_test(NAME ${name}_soak_np${n}
             COMMAND ${PARTITA_MPIEXEC} -n ${n} $<TARGET_FILE:${name}>)
    set_tests_properties(${name}_soak_np${n} PROPERTIES
      TIMEOUT 3600 PROCESSORS 2 LABELS "soak;np${n}"
      ENVIRONMENT "${PARTITA_STUCK_WAIT_ENV};OMP_NUM_THREADS=1;PARTITA_PROP_CASES=${ARG_CASES}")
  endforeach()
endfunction()

# Primitives of the specification that have no suite yet: reported as
# UNIMPLEMENTED by `partita conformance` until their issue lands (none now;
# kept so that a new primitive is listed before its suites exist).
set(PARTITA_UNIMPLEMENTED "")

# conformance_suites.json beside the partita binary: what `partita
# conformance` runs. Called once, after every suite is declared.
function(partita_write_partita_manifest)
  partita_write_conformance_manifest(FILE $<TARGET_FILE_DIR:partita>/conformance_suites.json
                                     SIMNODES ${PROJECT_SOURCE_DIR}/tools/simnodes.sh
                                     UNIMPLEMENTED ${PARTITA_UNIMPLEMENTED})
endfunction()
