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

# Every MPI test (issue 18, docs/testing.md): a wait that has not finished
# after PARTITA_DEADLINE seconds (times ranks per core) fails its case with
# the case and a replay line; one stuck for PARTITA_WAIT_TIMEOUT seconds
# where no deadline reaches aborts the job (the watchdog); ctest's timeout
# is the last resort. No test waits more than 60 s on a stuck operation.
set(PARTITA_STUCK_WAIT_ENV "PARTITA_DEADLINE=5;PARTITA_WAIT_TIMEOUT=55")

# An MPI GoogleTest binary (its own main: partita_mpi_gtest_main) registered
# as one ctest per rank count: partita_add_mpi_test(name RANKS 1 2 4 SOURCES ...)
# CONFORMANCE lists it in `partita conformance`, at RANKS and also at
# CONFORMANCE_RANKS (rank counts too slow for every ctest run on 2 cores).
function(partita_add_mpi_test name)
  cmake_parse_arguments(ARG "CONFORMANCE" "TIMEOUT" "RANKS;CONFORMANCE_RANKS;SOURCES;ENV" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT ${PARTITA_MPI_TIMEOUT})
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE partita_harness)
  set(labels mpi)
  if(ARG_CONFORMANCE)
    list(APPEND labels conformance)  # ctest -L conformance --output-junit FILE
    string(REPLACE ";" ", " ranks_json "${ARG_RANKS};${ARG_CONFORMANCE_RANKS}")
    string(REGEX REPLACE ", $" "" ranks_json "${ranks_json}")
    set_property(GLOBAL APPEND PROPERTY PARTITA_CONFORMANCE_SUITES
      "{\"name\": \"${name}\", \"binary\": \"$<TARGET_FILE:${name}>\", \"ranks\": [${ranks_json}]}")
  endif()
  foreach(n IN LISTS ARG_RANKS)
    add_test(NAME ${name}_np${n}
             COMMAND ${PARTITA_MPIEXEC} -n ${n} $<TARGET_FILE:${name}>)
    set_tests_properties(${name}_np${n} PROPERTIES
      TIMEOUT ${ARG_TIMEOUT}
      PROCESSORS 2
      LABELS "${labels};np${n}"
      ENVIRONMENT "${PARTITA_STUCK_WAIT_ENV};OMP_NUM_THREADS=1;${ARG_ENV}")
  endforeach()
endfunction()

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
function(partita_write_conformance_manifest)
  get_property(suites GLOBAL PROPERTY PARTITA_CONFORMANCE_SUITES)
  foreach(p IN LISTS PARTITA_UNIMPLEMENTED)
    list(APPEND suites "{\"name\": \"${p}\", \"unimplemented\": \"no implementation yet\"}")
  endforeach()
  string(REPLACE ";" ",\n  " body "${suites}")
  file(GENERATE OUTPUT $<TARGET_FILE_DIR:partita>/conformance_suites.json
       CONTENT "{\"mpiexec\": \"${PARTITA_MPIEXEC}\", \"suites\": [\n  ${body}\n]}\n")
endfunction()
