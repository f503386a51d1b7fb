// Lockstep properties of the data-movement primitives and the Linear
// layers: for random cases,
// every rank's MPI forward and backward equal the reference's for that rank,
// and the adjoint identity holds for both (testing/src/case_runner.cpp decides).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstring>
#include <functional>
#include <iostream>
#include <sstream>
#include <map>
#include <string>
#include <vector>

#include "partita/testing/case_runner.hpp"
#include "partita/testing/lockstep.hpp"
#include "partita/errors.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/all_gather.hpp"
#include "partita/nn/broadcast.hpp"
#include "partita/nn/repartition.hpp"
#include "partita/nn/sum_reduce.hpp"
#include "partita/tensor_rules.hpp"
#include "partita/tiling.hpp"
#include "partita/testing/partition_cases.hpp"

namespace partita::testing {
namespace {

constexpr const char* kDtypes[] = {"float64", "float32", "bfloat16", "float16", "int64",
                                   "int32",   "int16",   "int8",     "uint8"};

// What a drawn case covers (issue 9: a property fails when a run of 100
// cases never drew one of these where it applies).
std::vector<std::string> features(const Case& c) {
  std::vector<std::string> f{"dtype " + c.dtype};
  if (c.options.preserve_batch() && !c.is_linear()) f.push_back("preserve_batch");
  if (c.options.transpose_src() || c.options.transpose_dest()) f.push_back("transposed partition");
  if (!c.unused_outputs.empty()) f.push_back("some outputs unused");
  if (c.data_seed && c.fill == "normal") f.push_back("random normal fill");
  if (c.distdl) f.push_back("DistDL's axes");
  if (c.in_place) f.push_back("in place");
  if (c.is_linear() && !c.bias) f.push_back("no bias");
  if (c.is_linear() && c.primitive != "linear" && c.P_y) f.push_back("separate partitions");
  if (c.is_linear() && c.in_features) f.push_back("x does not fit the layer");
  // A scale_backward that divides by more than 1 a gradient that exists.
  if (c.distdl && !c.distdl->scale_backward().empty() && at::isFloatingType(parse_dtype(c.dtype)))
    f.push_back("scale_backward");
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
  if (primitive.rfind("linear", 0) == 0) {
    for (const char* d : {"float64", "float32", "bfloat16"}) need.push_back(std::string("dtype ") + d);
    need.push_back("no bias");
    need.push_back("x does not fit the layer");
    if (primitive != "linear") need.push_back("separate partitions");
    if (world >= 2) need.push_back("uneven tiling");
    return need;
  }
  for (const char* d : kDtypes) need.push_back(std::string("dtype ") + d);
  if (primitive == "broadcast" || primitive == "sum_reduce" || primitive == "all_sum_reduce")
    need.push_back("preserve_batch");
  if (primitive == "broadcast" || primitive == "sum_reduce") need.push_back("transposed partition");
  if (primitive == "all_gather" || primitive == "reduce_scatter") need.push_back("DistDL's axes");
  if (primitive == "halo_exchange") need.push_back("in place");
  // A dividing scale_backward needs a dimension of 2+ workers: at 1 rank
  // there is none, at 2 it is drawn too rarely for 100 cases.
  if (primitive == "all_gather" && world >= 3) need.push_back("scale_backward");
  // One worker holds one piece; reduce-scatter's pieces are equal by its rule.
  if (world >= 2 && primitive != "reduce_scatter") need.push_back("uneven tiling");
  return need;
}

// A run of 100 fresh cases misses a feature drawn once in 13 cases (each
// of the seven rarer dtypes) about once in 3,000; a conformance run makes
// about 300 such checks (seven properties, six rank counts), so one in ten
// runs would fail on coverage alone. While a required feature is missing,
// up to this many more rounds of the same number of cases are drawn (seeds
// seed+1, seed+2, ...; each round prints its own replay line). A generator
// that cannot draw the feature still fails; one that draws it rarely needs
// it within 400 cases.
constexpr uint64_t kExtraCoverageRounds = 3;

void check_primitive(const std::string& primitive) {
  torch::set_num_threads(1);
  // What the cases exercised, so a run that only ever hit errors or empty
  // tensors shows itself.
  std::map<std::string, int> kinds, drawn;
  int cases = 0;
  const auto gen = primitive.rfind("linear", 0) == 0
                       ? gen_linear_case(mpi::world_size(), {primitive})
                       : gen_primitive_case(mpi::world_size(), {primitive});
  const auto need = required_features(primitive, mpi::world_size());
  bool ok = true;
  std::vector<std::string> missing;
  for (uint64_t round = 0;; ++round) {
    const int before = cases;
    ok = check_lockstep<Case>(
        primitive + " against the reference", gen,
        [&](const Case& c, Verdict& v) {
          ++cases;
          try {
            for (const auto& f : features(c)) ++drawn[f];
          } catch (const std::exception&) {  // a malformed tiling: run_case reports it
          }
          const auto outcome = run_case(c);
          v.expect(outcome.ok, outcome.summary);
          ++kinds[!outcome.expected_error.empty() ? "rejected (both raised)"
                  : outcome.y.numel() > 0         ? "data moved"
                                                  : "zero-volume on this rank"];
        },
        nullptr, round);
    // Coverage counts only after a passing run of at least 100 cases
    // (every rank drew the same cases, so every rank agrees).
    if (!ok) missing.clear();
    if (!ok || cases - before < 100) break;
    missing.clear();
    for (const auto& f : need)
      if (drawn[f] == 0) missing.push_back(f);
    if (missing.empty() || round == kExtraCoverageRounds) break;
    if (mpi::world_rank() == 0) {
      std::cout << "  coverage: " << cases << " cases never drew";
      for (const auto& f : missing) std::cout << " '" << f << "'";
      std::cout << "; another round" << std::endl;
    }
  }
  if (mpi::world_rank() == 0) {
    std::cout << "  rank 0 saw:";
    for (const auto& [k, n] : kinds) std::cout << " " << k << " " << n << ";";
    std::cout << "\n  drawn:";
    for (const auto& [k, n] : drawn) std::cout << " " << k << " " << n << ";";
    std::cout << std::endl;
  }
  EXPECT_TRUE(ok);
  for (const auto& f : missing)
    ADD_FAILURE() << primitive << ": " << cases << " cases at " << mpi::world_size()
                  << " ranks never drew " << f;
}

TEST(PrimitiveProperty, Broadcast) { check_primitive("broadcast"); }
TEST(PrimitiveProperty, SumReduce) { check_primitive("sum_reduce"); }
TEST(PrimitiveProperty, AllSumReduce) { check_primitive("all_sum_reduce"); }
TEST(PrimitiveProperty, AllGather) { check_primitive("all_gather"); }
TEST(PrimitiveProperty, ReduceScatter) { check_primitive("reduce_scatter"); }
TEST(PrimitiveProperty, Repartition) { check_primitive("repartition"); }
TEST(PrimitiveProperty, HaloExchange) { check_primitive("halo_exchange"); }

// Seed 002's layers (issue 11) against their serial twins: y, dx, the
// stored blocks of W and b and their gradients, both adjoint identities.
TEST(LinearProperty, General) { check_primitive("linear"); }
TEST(LinearProperty, AllGather) { check_primitive("linear_all_gather"); }
TEST(LinearProperty, ReduceScatter) { check_primitive("linear_reduce_scatter"); }
TEST(LinearProperty, AllGatherZero) { check_primitive("linear_all_gather_zero"); }
TEST(LinearProperty, ReduceScatterZero) { check_primitive("linear_reduce_scatter_zero"); }

// A repartition case's drawn (uneven) tiling made balanced: the same
// global shape, every P_x worker holding its balanced piece. The reverse
// layer's output is always the balanced tiling over its P_y, so only then
// can it equal the forward's backward, which has the input's shapes.
bool balance_tiling(Case& c) {  // true when a piece changed
  if (c.local_shapes.empty()) return false;
  const auto drawn = c.local_shapes;
  const size_t d = c.local_shapes.begin()->second.size();
  const Shape grid = padded_shape(c.P_x.shape, d);
  std::vector<Index> at;
  for (size_t r = 0; r < c.P_x.ranks.size(); ++r) at.push_back(unravel(static_cast<int64_t>(r), grid));
  // Along k, the slabs' extents read off the workers at index 0 elsewhere.
  Shape global(d, 0);
  for (size_t k = 0; k < d; ++k)
    for (size_t r = 0; r < at.size(); ++r) {
      bool on_axis = true;
      for (size_t e = 0; e < d; ++e) on_axis = on_axis && (e == k || at[r][e] == 0);
      if (on_axis) global[k] += c.local_shapes.at(c.P_x.ranks[r]).at(k);
    }
  for (size_t r = 0; r < at.size(); ++r)
    for (size_t k = 0; k < d; ++k)
      c.local_shapes[c.P_x.ranks[r]][k] = local_length(global[k], grid[k], at[r][k]);
  return c.local_shapes != drawn;
}

// Issue 9 B6: a second adjoint check that does not go through the
// reference. Broadcast's backward is SumReduce's forward on the mirrored
// partitions, AllGather's backward is ReduceScatter's forward on the same
// teams (when the gathered pieces are the balanced split), Repartition's
// backward is the reverse Repartition's forward (on balanced tilings): the
// same integer cotangents through both must give bit-identical tensors.
void check_adjoint_pair(const std::string& primitive) {
  torch::set_num_threads(1);
  int compared = 0, with_data = 0, rebalanced = 0;
  const bool ok = check_lockstep<Case>(
      primitive + "'s backward is its pair's forward",
      gen_primitive_case(mpi::world_size(), {primitive}), [&](const Case& drawn, Verdict& v) {
        Case c = drawn;
        if (!at::isFloatingType(parse_dtype(c.dtype))) c.dtype = "float64";  // a gradient
        c.fill = "integers";  // exact sums in any order
        const auto world = mpi::Partition::world();
        auto part = [&](const PartitionSpec& s) {
          return world.create_partition_inclusive(s.ranks).create_cartesian_topology_partition(s.shape);
        };
        const int me = mpi::world_rank();
        const bool gather_pair = c.primitive == "all_gather";
        if (c.primitive == "repartition" && balance_tiling(c)) ++rebalanced;
        if (gather_pair && (!c.local_shapes.empty() ||
                            (c.distdl && !c.distdl->scale_backward().empty())))
          return;  // uneven pieces or a scaled backward: not the plain pair
        at::Tensor x = case_input(c, me).requires_grad_(true), y;
        std::function<at::Tensor(const at::Tensor&)> pair;
        try {
          const auto px = part(c.P_x);
          if (gather_pair) {
            nn::AllGather f = c.distdl ? nn::AllGather(px, *c.distdl) : nn::AllGather(px, c.axis, c.dim);
            nn::ReduceScatter g =
                c.distdl ? nn::ReduceScatter(px, *c.distdl) : nn::ReduceScatter(px, c.axis, c.dim);
            y = f(x);
            pair = [g](const at::Tensor& t) mutable { return g(t); };
          } else if (c.primitive == "repartition") {
            const auto py = part(*c.P_y);
            nn::Repartition f(px, py);
            nn::Repartition g(py, px);
            y = f(x);
            pair = [g](const at::Tensor& t) mutable { return g(t); };
          } else {
            const auto py = part(*c.P_y);
            Options mirrored = c.options;
            std::swap(mirrored.transpose_src(), mirrored.transpose_dest());
            nn::Broadcast f(px, py, c.options);
            nn::SumReduce g(py, px, mirrored);
            y = f(x);
            pair = [g](const at::Tensor& t) mutable { return g(t); };
          }
        } catch (const Error&) {
          return;  // a case the layers reject (checked by the other properties)
        }
        const at::Tensor dy = case_cotangent(c, me, y.sizes());
        if (y.requires_grad()) torch::autograd::backward({y}, {dy});
        const at::Tensor dx = x.grad().defined() ? x.grad() : at::zeros_like(x);
        const at::Tensor z = pair(dy);
        ++compared;
        if (x.numel() == 0) {  // outside P_x: nothing comes back either way
          v.expect(dx.numel() == 0 && z.numel() == 0, "outside P_x: a non-empty result");
          return;
        }
        ++with_data;
        const bool same = dx.sizes() == z.sizes() && dx.scalar_type() == z.scalar_type() &&
                          std::memcmp(dx.contiguous().data_ptr(), z.contiguous().data_ptr(),
                                      dx.numel() * dx.element_size()) == 0;
        std::ostringstream os;
        if (!same) os << "backward " << dx.sizes() << " != pair's forward " << z.sizes() << "\n" << dx << "\n" << z;
        v.expect(same, os.str());
      });
  if (mpi::world_rank() == 0)
    std::cout << "  pairs compared: " << compared << " (with data on rank 0: " << with_data
              << "; drawn tilings rebalanced: " << rebalanced << ")" << std::endl;
  EXPECT_TRUE(ok);
  EXPECT_GT(compared, 0) << "no case was compared";
}

TEST(AdjointPair, BroadcastBackwardIsSumReduce) { check_adjoint_pair("broadcast"); }
TEST(AdjointPair, AllGatherBackwardIsReduceScatter) { check_adjoint_pair("all_gather"); }
TEST(AdjointPair, RepartitionBackwardIsTheReverseRepartition) { check_adjoint_pair("repartition"); }

}  // namespace
}  // namespace partita::testing
