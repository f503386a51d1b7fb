// Lockstep properties of the data-movement primitives: for random cases,
// every rank's MPI forward and backward equal the reference's for that rank,
// and the adjoint identity holds for both (tools/case_runner.cpp decides).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <iostream>
#include <map>

#include "case_runner.hpp"
#include "harness/lockstep.hpp"
#include "partita/mpi/runtime.hpp"
#include "partition_cases.hpp"

namespace partita::testing {
namespace {

void check_primitive(const std::string& primitive) {
  torch::set_num_threads(1);
  // What the cases exercised, so a run that only ever hit errors or empty
  // tensors shows itself.
  std::map<std::string, int> kinds;
  const bool ok = check_lockstep<Case>(
      primitive + " against the reference", gen_primitive_case(mpi::world_size(), {primitive}),
      [&kinds](const Case& c, Verdict& v) {
        const auto outcome = tools::run_case(c);
        v.expect(outcome.ok, outcome.summary);
        if (std::getenv("PARTITA_SHOW_REJECTED") && !outcome.expected_error.empty() && mpi::world_rank() == 0) std::cout << outcome.expected_error << "\n";
        if (!c.unused_outputs.empty()) ++kinds["some outputs unused"];
        ++kinds[!outcome.expected_error.empty() ? "rejected (both raised)"
                : outcome.y.numel() > 0         ? "data moved"
                                                : "zero-volume on this rank"];
      });
  if (mpi::world_rank() == 0) {
    std::cout << "  rank 0 saw:";
    for (const auto& [k, n] : kinds) std::cout << " " << k << " " << n << ";";
    std::cout << std::endl;
  }
  EXPECT_TRUE(ok);
}

TEST(PrimitiveProperty, Broadcast) { check_primitive("broadcast"); }
TEST(PrimitiveProperty, SumReduce) { check_primitive("sum_reduce"); }
TEST(PrimitiveProperty, AllSumReduce) { check_primitive("all_sum_reduce"); }
TEST(PrimitiveProperty, AllGather) { check_primitive("all_gather"); }
TEST(PrimitiveProperty, ReduceScatter) { check_primitive("reduce_scatter"); }
TEST(PrimitiveProperty, Repartition) { check_primitive("repartition"); }
TEST(PrimitiveProperty, HaloExchange) { check_primitive("halo_exchange"); }

}  // namespace
}  // namespace partita::testing
