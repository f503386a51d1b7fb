// Not a suite of its own: tests that fail on chosen ranks only, run by
// check_summary.cmake to see what rank 0's final summary says about them
// (testing/src/mpi_gtest_main.cpp). Each failure is a real one, so the run
// must end with status 1.
#include <gtest/gtest.h>

#include "partita/mpi/runtime.hpp"

namespace {

TEST(Summary, PassesEverywhere) { EXPECT_GT(partita::mpi::world_size(), 0); }

TEST(Summary, FailsOnRankOne) {
  EXPECT_NE(partita::mpi::world_rank(), 1) << "this test fails on rank 1 only";
}

TEST(Summary, FailsOffRankZero) {
  EXPECT_EQ(partita::mpi::world_rank(), 0) << "this test fails on every rank but 0";
}

}  // namespace
