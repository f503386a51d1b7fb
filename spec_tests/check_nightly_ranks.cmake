# partita_add_mpi_test's NIGHTLY_RANKS (docs/testing-library.md): a rank
# count that is not among RANKS stops the configure with a message naming
# it. Run in script mode, so the call stops before any target is made.
#   cmake -DSOURCE_DIR=... -P check_nightly_ranks.cmake
cmake_minimum_required(VERSION 3.20)
include(${SOURCE_DIR}/cmake/PartitaTestHelpers.cmake)
partita_add_mpi_test(demo SOURCES demo.cpp RANKS 1 2 4 NIGHTLY_RANKS 3)
message(FATAL_ERROR "NIGHTLY_RANKS 3 outside RANKS 1 2 4 was accepted")
