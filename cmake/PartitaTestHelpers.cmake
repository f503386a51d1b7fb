# CMake helpers of partita::testing (docs/testing-library.md), installed with
# the package and used by partita's own suites: one line per MPI test binary.
#
#   partita_add_mpi_test(NAME SOURCES a.cpp ... RANKS 1 2 4
#                        [LIBRARIES lib ...] [TIMEOUT seconds] [ENV VAR=value ...]
#                        [CONFORMANCE [CONFORMANCE_RANKS 6 8]]
#                        [NIGHTLY_RANKS 8])
#
# builds NAME from SOURCES against partita::testing (whose main() starts MPI,
# runs GoogleTest on every rank and agrees one exit status) and registers one
# ctest per rank count, NAME_npN, run by MPICH's mpiexec with a timeout and
# the deadline settings below. CONFORMANCE also lists the suite in the
# manifest that partita_write_conformance_manifest() writes for
# `partita conformance --suites FILE`, at RANKS and CONFORMANCE_RANKS.
# NIGHTLY_RANKS (a subset of RANKS) labels those rank counts' ctests
# `nightly`, out of the default run (`ctest -L nightly` runs them); the
# conformance manifest still lists them.
include_guard(GLOBAL)

# MPICH's launcher by name: with OpenMPI beside it, `mpiexec` may be OpenMPI's.
if(NOT PARTITA_MPIEXEC)
  find_program(PARTITA_MPIEXEC NAMES mpiexec.mpich mpiexec REQUIRED)
endif()
set(PARTITA_MPI_TIMEOUT 600 CACHE STRING "Seconds before an mpirun test is killed")

# A wait that has not finished after PARTITA_DEADLINE seconds (times ranks per
# core) fails its case with the case and a replay line; one stuck for
# PARTITA_WAIT_TIMEOUT seconds where no deadline reaches aborts the job (the
# watchdog); ctest's timeout is the last resort.
set(PARTITA_STUCK_WAIT_ENV "PARTITA_DEADLINE=5;PARTITA_WAIT_TIMEOUT=55")

function(partita_add_mpi_test name)
  cmake_parse_arguments(ARG "CONFORMANCE" "TIMEOUT" "RANKS;CONFORMANCE_RANKS;NIGHTLY_RANKS;SOURCES;ENV;LIBRARIES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "partita_add_mpi_test(${name}): SOURCES is required")
  endif()
  if(NOT ARG_RANKS)
    message(FATAL_ERROR "partita_add_mpi_test(${name}): RANKS is required (e.g. RANKS 1 2 4)")
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT ${PARTITA_MPI_TIMEOUT})
  endif()
  foreach(n IN LISTS ARG_NIGHTLY_RANKS)
    list(FIND ARG_RANKS ${n} at)
    if(at EQUAL -1)
      message(FATAL_ERROR "partita_add_mpi_test(${name}): NIGHTLY_RANKS ${n} is not among RANKS")
    endif()
  endforeach()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE partita::testing ${ARG_LIBRARIES})
  set(labels mpi)
  if(ARG_CONFORMANCE)
    list(APPEND labels conformance)  # ctest -L conformance --output-junit FILE
    string(REPLACE ";" ", " ranks_json "${ARG_RANKS};${ARG_CONFORMANCE_RANKS}")
    string(REGEX REPLACE ", $" "" ranks_json "${ranks_json}")
    set_property(GLOBAL APPEND PROPERTY PARTITA_CONFORMANCE_SUITES
      "{\"name\": \"${name}\", \"binary\": \"$<TARGET_FILE:${name}>\", \"ranks\": [${ranks_json}]}")
  endif()
  foreach(n IN LISTS ARG_RANKS)
    set(test_labels "${labels};np${n}")
    list(FIND ARG_NIGHTLY_RANKS ${n} at)
    if(NOT at EQUAL -1)
      list(APPEND test_labels nightly)
    endif()
    add_test(NAME ${name}_np${n}
             COMMAND ${PARTITA_MPIEXEC} -n ${n} $<TARGET_FILE:${name}>)
    set_tests_properties(${name}_np${n} PROPERTIES
      TIMEOUT ${ARG_TIMEOUT}
      PROCESSORS 2
      LABELS "${test_labels}"
      ENVIRONMENT "${PARTITA_STUCK_WAIT_ENV};OMP_NUM_THREADS=1;${ARG_ENV}")
  endforeach()
endfunction()

# The manifest of every CONFORMANCE suite declared so far, for
# `partita conformance --suites FILE`: call once, after the suites.
#   partita_write_conformance_manifest(FILE path [UNIMPLEMENTED name ...])
function(partita_write_conformance_manifest)
  cmake_parse_arguments(ARG "" "FILE;SIMNODES" "UNIMPLEMENTED" ${ARGN})
  if(NOT ARG_FILE)
    message(FATAL_ERROR "partita_write_conformance_manifest: FILE is required")
  endif()
  get_property(suites GLOBAL PROPERTY PARTITA_CONFORMANCE_SUITES)
  foreach(p IN LISTS ARG_UNIMPLEMENTED)
    list(APPEND suites "{\"name\": \"${p}\", \"unimplemented\": \"no implementation yet\"}")
  endforeach()
  string(REPLACE ";" ",\n  " body "${suites}")
  # SIMNODES: the simulated-node launcher `partita conformance --nodes` runs
  # the suites through (tools/simnodes.sh).
  set(simnodes "")
  if(ARG_SIMNODES)
    set(simnodes "\"simnodes\": \"${ARG_SIMNODES}\", ")
  endif()
  file(GENERATE OUTPUT ${ARG_FILE}
       CONTENT "{\"mpiexec\": \"${PARTITA_MPIEXEC}\", ${simnodes}\"suites\": [\n  ${body}\n]}\n")
endfunction()
