# The doctests (docs/contributing-docs.md): every C++ block of README.md and
# docs/ is extracted by tools/doctest/extract.py when CMake configures (again
# whenever a Markdown file changes) and compiled by the ctest doctest_build;
# each block marked `program` or `gtest` then runs under mpiexec at the rank
# counts it names, one ctest each (doc_<file>_<line>_npN). The blocks are not
# part of the default build: a broken block fails its named test, it does
# not stop the build of the library.
set(PARTITA_DOC_DIR ${CMAKE_BINARY_DIR}/doctest)
file(GLOB_RECURSE PARTITA_DOC_MARKDOWN CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/docs/*.md)
# The glob's CONFIGURE_DEPENDS notices a page added or removed; listing
# every page here makes an edit of one configure again too.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PARTITA_DOC_MARKDOWN}
             ${CMAKE_SOURCE_DIR}/README.md ${CMAKE_SOURCE_DIR}/tools/doctest/extract.py)
find_package(Python3 REQUIRED COMPONENTS Interpreter)
execute_process(COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tools/doctest/extract.py
                        ${CMAKE_SOURCE_DIR} ${PARTITA_DOC_DIR}
                RESULT_VARIABLE doc_rc OUTPUT_VARIABLE doc_out ERROR_VARIABLE doc_err)
if(NOT doc_rc EQUAL 0)
  message(FATAL_ERROR "tools/doctest/extract.py failed:\n${doc_out}${doc_err}")
endif()
message(STATUS "${doc_out}")

add_library(partita_doc_fragments OBJECT EXCLUDE_FROM_ALL ${PARTITA_DOC_DIR}/fragments.cpp)
target_include_directories(partita_doc_fragments PRIVATE ${CMAKE_SOURCE_DIR}/tools/doctest)
target_link_libraries(partita_doc_fragments PRIVATE partita_testing partita_smp)
partita_use_torch(partita_doc_fragments)
set(PARTITA_DOC_TARGETS partita_doc_fragments)

# One documented program: NAME KIND ("program" or "gtest") WHERE (file:line)
# RANKS...
function(partita_doc_program name kind where)
  add_executable(${name} EXCLUDE_FROM_ALL ${PARTITA_DOC_DIR}/${name}.cpp)
  if(kind STREQUAL "gtest")
    target_link_libraries(${name} PRIVATE partita_testing)
  else()
    target_link_libraries(${name} PRIVATE partita_smp)
  endif()
  partita_use_torch(${name})
  # The worked example of docs/testing-library.md tests the layer of
  # examples/custom_layer.
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/examples/custom_layer)
  set_property(DIRECTORY APPEND PROPERTY PARTITA_DOC_PROGRAMS ${name})
  foreach(n IN LISTS ARGN)
    add_test(NAME ${name}_np${n} COMMAND ${PARTITA_MPIEXEC} -n ${n} $<TARGET_FILE:${name}>)
    set_tests_properties(${name}_np${n} PROPERTIES
      TIMEOUT 300 PROCESSORS 2 LABELS "doctest;mpi;np${n}" FIXTURES_REQUIRED doctest_build
      ENVIRONMENT "${PARTITA_STUCK_WAIT_ENV};OMP_NUM_THREADS=1")
  endforeach()
endfunction()
include(${PARTITA_DOC_DIR}/doctests.cmake)
get_property(doc_programs DIRECTORY PROPERTY PARTITA_DOC_PROGRAMS)
add_custom_target(partita_doctests DEPENDS partita_doc_fragments ${doc_programs})

add_test(NAME doctest_build
         COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target partita_doctests)
set_tests_properties(doctest_build PROPERTIES
  TIMEOUT 1200 PROCESSORS 2 LABELS doctest FIXTURES_SETUP doctest_build)
