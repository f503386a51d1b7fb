# The API reference (docs/api.md): Doxygen over the public headers through
# tools/doxygen/filter.py, into build/api/html. `cmake --build build --target
# partita_api_reference` makes it; the ctest api_reference makes it too and
# fails on any warning (WARN_AS_ERROR), so a header comment Doxygen cannot
# read fails the tests. Without Doxygen (apt-get install doxygen) neither
# exists.
find_package(Doxygen QUIET)
if(NOT DOXYGEN_FOUND)
  message(STATUS "doxygen not found: no API reference (tools/setup.sh installs it)")
  return()
endif()
find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(PARTITA_DOXYGEN_OUT ${CMAKE_BINARY_DIR}/api)
configure_file(${CMAKE_SOURCE_DIR}/tools/doxygen/Doxyfile.in ${PARTITA_DOXYGEN_OUT}/Doxyfile @ONLY)
add_custom_target(partita_api_reference
  COMMAND ${DOXYGEN_EXECUTABLE} ${PARTITA_DOXYGEN_OUT}/Doxyfile
  WORKING_DIRECTORY ${PARTITA_DOXYGEN_OUT}
  COMMENT "Doxygen: the API reference in ${PARTITA_DOXYGEN_OUT}/html")
add_test(NAME api_reference COMMAND ${DOXYGEN_EXECUTABLE} ${PARTITA_DOXYGEN_OUT}/Doxyfile
         WORKING_DIRECTORY ${PARTITA_DOXYGEN_OUT})
set_tests_properties(api_reference PROPERTIES TIMEOUT 300 LABELS "serial;docs"
  FAIL_REGULAR_EXPRESSION "warning:|error:")
