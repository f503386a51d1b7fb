// Lockstep properties of the data-movement primitives: for random cases,
// every rank's MPI forward and backward equal the reference's for that rank,
// and the adjoint identity holds for both (tools/case_runner.cpp decides).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "case_runner.hpp"
#include "harness/lockstep.hpp"
#include "partita/mpi/runtime.hpp"
#include "partition_cases.hpp"

namespace partita::testing {
namespace {

constexpr const char* kDtypes[] = {"float64", "float32", "bfloat16", "float16", "int64",
                                   "int32",   "int16",   "int8",     "uint8"};

// What a drawn case covers (issue 9: a property fails when a run of 100
// cases never drew one of these where it applies).
std::vector<std::string> features(const Case& c) {
  std::vector<std::string> f{"dtype " + c.dtype};
  if (c.options.preserve_batch) f.push_back("preserve_batch");
  if (c.options.transpose_src || c.options.transpose_dest) f.push_back("transposed partition");
  if (!c.unused_outputs.empty()) f.push_back("some outputs unused");
  if (c.data_seed && c.fill == "normal") f.push_back("random normal fill");
  if (c.distdl) f.push_back("DistDL's axes");
  if (c.distdl && !c.distdl->scale_backward.empty()) f.push_back("scale_backward");
  bool zero = false, uneven = false;
  const Shape first = c.input_shape(c.P_x.ranks.front());
  for (int r : c.P_x.ranks) {
    const Shape s = c.input_shape(r);
    zero = zero || volume(s) == 0;
    uneven = uneven || s != first;
  }
  if (zero) f.push_back("zero-volume worker");
  if (uneven) f.push_back("uneven tiling");
  return f;
}

// The features a run of `primitive` must have drawn at `world` ranks.
std::vector<std::string> required_features(const std::string& primitive, int world) {
  std::vector<std::string> need{"some outputs unused", "random normal fill", "zero-volume worker"};
  for (const char* d : kDtypes) need.push_back(std::string("dtype ") + d);
  if (primitive == "broadcast" || primitive == "sum_reduce" || primitive == "all_sum_reduce")
    need.push_back("preserve_batch");
  if (primitive == "broadcast" || primitive == "sum_reduce") need.push_back("transposed partition");
  if (primitive == "all_gather" || primitive == "reduce_scatter") need.push_back("DistDL's axes");
  if (primitive == "all_gather") need.push_back("scale_backward");
  // One worker holds one piece; reduce-scatter's pieces are equal by its rule.
  if (world >= 2 && primitive != "reduce_scatter") need.push_back("uneven tiling");
  return need;
}

void check_primitive(const std::string& primitive) {
  torch::set_num_threads(1);
  // What the cases exercised, so a run that only ever hit errors or empty
  // tensors shows itself.
  std::map<std::string, int> kinds, drawn;
  int cases = 0;
  const bool ok = check_lockstep<Case>(
      primitive + " against the reference", gen_primitive_case(mpi::world_size(), {primitive}),
      [&](const Case& c, Verdict& v) {
        ++cases;
        try {
          for (const auto& f : features(c)) ++drawn[f];
        } catch (const std::exception&) {  // a malformed tiling: run_case reports it
        }
        const auto outcome = tools::run_case(c);
        v.expect(outcome.ok, outcome.summary);
        ++kinds[!outcome.expected_error.empty() ? "rejected (both raised)"
                : outcome.y.numel() > 0         ? "data moved"
                                                : "zero-volume on this rank"];
      });
  if (mpi::world_rank() == 0) {
    std::cout << "  rank 0 saw:";
    for (const auto& [k, n] : kinds) std::cout << " " << k << " " << n << ";";
    std::cout << "\n  drawn:";
    for (const auto& [k, n] : drawn) std::cout << " " << k << " " << n << ";";
    std::cout << std::endl;
  }
  EXPECT_TRUE(ok);
  // Coverage (every rank drew the same cases, so every rank agrees).
  if (!ok || cases < 100) return;
  for (const auto& f : required_features(primitive, mpi::world_size())) {
    EXPECT_GT(drawn[f], 0) << primitive << ": " << cases << " cases at " << mpi::world_size()
                           << " ranks never drew " << f;
  }
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
