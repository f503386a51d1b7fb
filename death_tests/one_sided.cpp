// One rank throws inside a test body while its peers go on into a
// collective (docs/testing.md, "A one-sided exception"): a GoogleTest suite
// on partita::testing's main(), each situation a test, each followed in the
// same run by OneSided.Next, which must run and pass. run_one_sided.cmake
// runs one situation and Next and judges the job.
//
// Rank 1 throws; every other rank then:
//   InBody      sums over the ranks with sum_over_ranks (a helper's
//               collective in the test body);
//   InVerdict   agrees a verdict with PARTITA_EXPECT_AGREED;
//   InLayer     calls again an AllSumReduce over the world that every rank
//               called once (its header exchange, on the header board
//               where the ranks share a node, is abandoned: partita's
//               world communicator must be renewed before Next);
//   RawCall     calls a raw MPI_Allreduce of its own (no deadline reaches
//               it: the watchdog between partita's waits ends the job,
//               naming the test and the rank).
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <stdexcept>

#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/all_sum_reduce.hpp"
#include "partita/testing/checks.hpp"

namespace {

namespace mpi = partita::mpi;

void rank_one_throws() {
  if (mpi::world_rank() == 1) throw std::runtime_error("rank 1 left the test by an exception");
}

TEST(OneSided, InBody) {
  rank_one_throws();
  EXPECT_EQ(partita::testing::sum_over_ranks(1.0), mpi::world_size());
}

TEST(OneSided, InVerdict) {
  rank_one_throws();
  PARTITA_EXPECT_AGREED(std::string());
}

TEST(OneSided, InLayer) {
  partita::nn::AllSumReduce sum(mpi::Partition::world(), std::vector<int>{0});
  sum(torch::ones({2}, torch::kDouble));  // every rank: the world's exchange is set up
  rank_one_throws();
  const at::Tensor y = sum(torch::ones({2}, torch::kDouble));
  EXPECT_TRUE(torch::equal(y, torch::full({2}, double(mpi::world_size()), torch::kDouble)));
}

TEST(OneSided, RawCall) {
  rank_one_throws();
  int one = 1, all = 0;
  // raw-mpi-ok: the user code this test stands for; the watchdog must end it
  MPI_Allreduce(&one, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
}

// After any of the above: a layer over the world and the helpers work again.
TEST(OneSided, Next) {
  partita::nn::AllSumReduce sum(mpi::Partition::world(), std::vector<int>{0});
  const at::Tensor y = sum(torch::ones({3}, torch::kDouble));
  EXPECT_TRUE(torch::equal(y, torch::full({3}, double(mpi::world_size()), torch::kDouble)));
  EXPECT_EQ(partita::testing::sum_over_ranks(2.0), 2.0 * mpi::world_size());
  PARTITA_EXPECT_AGREED(std::string());
}

}  // namespace
