// Bad inputs at every public entry point that takes user data (issue 35
// item 4): one test per row of docs/bad-inputs.md. Each row tries one bad
// input and asserts, on every rank:
//
//  - every rank involved raises the documented partita error class, whose
//    message (or rule code) names what is wrong, within 5 s (timed here;
//    a hang would also run into PARTITA_DEADLINE and fail);
//  - ranks not involved (named in the row) are left alone;
//  - then the next call on the same communicator, layer or object (a
//    correct one) works and gives the right values;
//  - the verdict is agreed by every rank (one rank's failure fails all).
//
// Many rows restate in this uniform form what a suite of its own tests in
// more detail (docs/bad-inputs.md names them). ctest: 2 and 3 ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include <c10/core/CPUAllocator.h>

#include "detail/layer_checks.hpp"
#include "detail/team_comm.hpp"
#include "partita/errors.hpp"
#include "partita/mpi/communicator.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/all_gather.hpp"
#include "partita/nn/all_sum_reduce.hpp"
#include "partita/nn/broadcast.hpp"
#include "partita/nn/halo_exchange.hpp"
#include "partita/nn/linear.hpp"
#include "partita/nn/repartition.hpp"
#include "partita/nn/sum_reduce.hpp"
#include "partita/smp.hpp"
#include "partita/smp/communicators.hpp"
#include "partita/smp/message.hpp"
#include "partita/smp/pipeline.hpp"
#include "partita/smp/schedule.hpp"
#include "partita/smp/step.hpp"
#include "partita/testing/case.hpp"
#include "partita/testing/pipeline_checks.hpp"

namespace partita::spec {
namespace {

constexpr double kLimit = 5.0;  // seconds: issue 35 item 4

int n() { return mpi::world_size(); }
int me() { return mpi::world_rank(); }
bool agreed(bool local) { return mpi::all_true(local, mpi::world_comm()); }

mpi::CartesianPartition cartesian(const Ranks& ranks, const Shape& shape) {
  return mpi::Partition::world().create_partition_inclusive(ranks).create_cartesian_topology_partition(shape);
}
Ranks all_ranks() {
  Ranks r;
  for (int i = 0; i < n(); ++i) r.push_back(i);
  return r;
}

std::string differs(const at::Tensor& got, const at::Tensor& want) {
  if (got.sizes() == want.sizes() && got.scalar_type() == want.scalar_type() && at::equal(got, want)) return "";
  std::ostringstream os;
  os << "got " << got.sizes() << " " << got.scalar_type() << ", want " << want.sizes() << " " << want.scalar_type();
  return os.str();
}

// One row. `bad` must raise E on this rank when `involved`, its what()
// containing `needle` (or its rule code equal to it), within kLimit
// seconds; then `next` (the next, correct call) must return "" on every
// rank. Every rank takes part in both, so collective `bad` and `next` are
// fine.
template <typename E>
void row(const std::string& needle, const std::function<void()>& bad, const std::function<std::string()>& next,
         bool involved = true) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string got = "nothing was raised";
  bool right = false;
  try {
    bad();
  } catch (const E& e) {
    got = e.what();
    const auto* pe = dynamic_cast<const Error*>(&e);
    right = got.find(needle) != std::string::npos || (pe && pe->rule() == needle);
  } catch (const std::exception& e) {
    got = std::string("another exception (") + typeid(e).name() + "): " + e.what();
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool ok_bad = !involved || (right && took < kLimit);
  // What each rank involved saw (docs/bad-inputs.md quotes it).
  if (involved)
    std::printf("  rank %d saw (%.3f s): %s\n", me(), took, got.c_str());
  if (involved) {
    EXPECT_TRUE(right) << "rank " << me() << ": expected " << typeid(E).name() << " naming '" << needle
                       << "', got: " << got;
    EXPECT_LT(took, kLimit) << "rank " << me() << ": the error took " << took << " s";
  }
  std::string after;
  try {
    after = next();
  } catch (const std::exception& e) {
    after = std::string("raised: ") + e.what();
  }
  EXPECT_EQ(after, "") << "rank " << me() << ": the next call after the bad one failed";
  EXPECT_TRUE(agreed(ok_bad && after.empty())) << "some rank failed this row (see its output)";
}

// The next call on the world communicator: a one-element allreduce.
std::string world_still_works() {
  return differs(mpi::Communicator::world().allreduce(at::ones({1}, at::kDouble), ReduceOp::kSum),
                 at::full({1}, static_cast<double>(n()), at::kDouble));
}

// ---- case files (partita run, partita::testing::Case) ------------------------------------

const char* kGoodCase =
    R"({"primitive": "all_sum_reduce", "P_x": {"ranks": [0], "shape": [1]}, "axes": [0],
        "global_shape": [3], "dtype": "float64"})";

TEST(BadInput, CaseFileNotJson) {
  row<CaseError>(
      "case.json: not valid JSON", [] { testing::Case::parse(R"({"primitive": "broadcast", )", "case.json"); },
      []() -> std::string { return testing::Case::parse(kGoodCase, "good.json").primitive == "all_sum_reduce" ? "" : "parsed wrong"; });
}

TEST(BadInput, CaseFileWrongField) {
  row<CaseError>(
      "field \"P_x.shape\"",
      [] {
        testing::Case::parse(R"({"primitive": "broadcast", "P_x": {"ranks": [0], "shape": "2"},
                                 "P_y": {"ranks": [0], "shape": [1]}, "global_shape": [3]})",
                             "case.json");
      },
      []() -> std::string { return testing::Case::parse(kGoodCase, "good.json").primitive == "all_sum_reduce" ? "" : "parsed wrong"; });
}

TEST(BadInput, CaseFileNumberOutOfRange) {
  row<CaseError>(
      "field \"axis\": expected a non-negative integer (a dimension of P_x), got 4294967296 (above 2^30)",
      [] {
        testing::Case::parse(R"({"primitive": "all_gather", "P_x": {"ranks": [0], "shape": [1]},
                                 "axis": 4294967296, "dim": 0, "global_shape": [3]})",
                             "case.json");
      },
      []() -> std::string { return testing::Case::parse(kGoodCase, "good.json").primitive == "all_sum_reduce" ? "" : "parsed wrong"; });
}

// ---- the smp configuration ------------------------------------------------------------

smp::Config partitions(int p, int microbatches = 1) {
  smp::Config c;
  c.partitions(p);
  c.microbatches(microbatches);
  return c;
}
std::string smp_still_works() {
  smp::init(partitions(1));
  smp::barrier();
  const auto all = smp::allgather<int64_t>(smp::rank(), smp::WORLD);
  for (int i = 0; i < n(); ++i)
    if (all[i] != i) return "allgather after init gave the wrong values";
  return smp::dp_size() == n() ? "" : "dp_size wrong after init";
}

TEST(BadInput, SmpConfigJsonField) {
  row<smp::ConfigError>(
      "cfg: field \"microbatches\": expected a positive integer, got 0",
      [] { smp::Config::from_json(R"({"microbatches": 0})", "cfg"); },
      []() -> std::string { return smp::Config::from_json(R"({"microbatches": 2})", "cfg").microbatches() == 2 ? "" : "wrong"; });
}

TEST(BadInput, SmpInitWorldNotDivisible) {
  row<smp::ConfigError>("is not divisible into", [] { smp::init(partitions(n() + 1)); }, smp_still_works);
}

TEST(BadInput, SmpInitBadOnOneRank) {
  row<smp::ConfigError>("smp::init: rank " + std::to_string(n() - 1) + ": ",
                        [] { smp::init(partitions(1, me() == n() - 1 ? 0 : 1)); }, smp_still_works);
}

TEST(BadInput, SmpInitRanksDisagree) {
  row<smp::ConfigError>("the ranks disagree about the configuration",
                        [] { smp::init(partitions(1, me() == n() - 1 ? 2 : 1)); }, smp_still_works);
}

// ---- smp objects --------------------------------------------------------------------------

TEST(BadInput, SmpRecvWrongType) {
  smp::init(partitions(1));
  // Rank 0 sends an int32; rank 1 asks for a double: only the receiver
  // raises (the synchronous send was matched and returns).
  row<smp::MessageError>(
      "the message holds int (4 bytes), double (8 bytes) was asked for",
      [] {
        if (me() == 0) smp::send(int32_t{5}, 1, smp::WORLD_RANK);
        if (me() == 1) smp::recv_from<double>(0, smp::WORLD_RANK);
      },
      []() -> std::string {
        if (me() == 0) smp::send(2.5, 1, smp::WORLD_RANK);
        if (me() == 1 && smp::recv_from<double>(0, smp::WORLD_RANK) != 2.5) return "received the wrong value";
        return "";
      },
      me() == 1);
}

TEST(BadInput, SmpBroadcastUnencodable) {
  smp::init(partitions(1));
  // A sparse tensor cannot travel: the sender and every receiver raise.
  row<smp::MessageError>(
      "cannot send the tensor",
      [] {
        if (me() == 0) smp::broadcast(c10::IValue(at::eye(3, at::kDouble).to_sparse()), smp::WORLD);
        else smp::recv_from(0, smp::WORLD_RANK);
      },
      []() -> std::string {
        if (me() == 0) smp::broadcast(std::string("next"), smp::WORLD);
        else if (smp::recv_from<std::string>(0, smp::WORLD_RANK) != "next") return "received the wrong value";
        return "";
      });
}

TEST(BadInput, SmpAllgatherMixedTypes) {
  smp::init(partitions(1));
  row<smp::MessageError>(
      "wrong type requested",
      [] {
        if (me() == 0) smp::allgather(std::string("zero"), smp::WORLD);
        else smp::allgather<int64_t>(me(), smp::WORLD);
      },
      []() -> std::string {
        const auto all = smp::allgather<int64_t>(10 + me(), smp::WORLD);
        for (int i = 0; i < n(); ++i)
          if (all[i] != 10 + i) return "allgather gave the wrong values";
        return "";
      });
}

TEST(BadInput, SmpCorruptedBytes) {
  smp::init(partitions(1));
  std::string flipped = smp::message::encode_ivalue(c10::IValue(int64_t{3}));
  flipped[flipped.size() / 2] ^= 0x10;
  row<smp::MessageError>(
      "corrupted: checksum mismatch",
      [&] {
        if (me() == 0) {
          MPI_Request r;
          MPI_Issend(flipped.data(), static_cast<int>(flipped.size()), MPI_BYTE, 1, smp::kObjectTag,
                     smp::communicator(smp::WORLD), &r);
          mpi::wait(r, "bad_inputs: raw send");
        } else if (me() == 1) {
          smp::recv_from(0, smp::WORLD_RANK);
        }
      },
      []() -> std::string {
        if (me() == 0) smp::send(c10::IValue(int64_t{4}), 1, smp::WORLD_RANK);
        if (me() == 1 && smp::recv_from(0, smp::WORLD_RANK).toInt() != 4) return "received the wrong value";
        return "";
      },
      me() == 1);
}

TEST(BadInput, SmpRankOutOfRange) {
  smp::init(partitions(1));
  row<smp::UsageError>(
      "WORLD_RANK " + std::to_string(n()) + " does not exist",
      [] { smp::send(c10::IValue(int64_t{1}), n(), smp::WORLD_RANK); }, smp_still_works);
}

// ---- partitions and layer constructors -----------------------------------------------------

TEST(BadInput, PartitionShapeVolume) {
  row<PartitionError>(
      rule_code::kShapeVolume, [] { mpi::Partition::world().create_cartesian_topology_partition({n() + 1}); },
      []() -> std::string {
        nn::AllSumReduce all(mpi::Partition::world().create_cartesian_topology_partition({n()}), std::vector<int>{0});
        return differs(all(at::ones({2}, at::kDouble)), at::full({2}, static_cast<double>(n()), at::kDouble));
      });
}

TEST(BadInput, PartitionArgumentsDiffer) {
  row<PartitionError>(
      rule_code::kArgumentsDiffer, [] { mpi::Partition::world().create_partition_inclusive({me() == 0 ? 0 : 1}); },
      []() -> std::string { return mpi::Partition::world().create_partition_inclusive({0}).active() == (me() == 0) ? "" : "wrong"; });
}

TEST(BadInput, BroadcastPartitionsBreakTheRules) {
  // dim(P_x) > dim(P_y).
  row<PartitionError>(
      rule_code::kBroadcastDims, [] { nn::Broadcast(cartesian(all_ranks(), {n(), 1}), cartesian(all_ranks(), {n()})); },
      world_still_works);
}

TEST(BadInput, HaloWidthsDiffer) {
  const auto px = cartesian({0, 1}, {2});
  row<PartitionError>(
      "different ghost widths", [&] { nn::HaloExchange(px, Shape{me() == 1 ? 2 : 1}, Shape{1}); },
      [&]() -> std::string {
        nn::HaloExchange halo(px, Shape{1}, Shape{1});
        const at::Tensor y = halo(px.active() ? at::full({4}, me() + 1.0, at::kDouble) : at::zeros({0}, at::kDouble));
        // Each worker's ghost facing the other holds the other's bulk.
        if (me() == 0) return differs(y.slice(0, 3, 4), at::full({1}, 2.0, at::kDouble));
        if (me() == 1) return differs(y.slice(0, 0, 1), at::full({1}, 1.0, at::kDouble));
        return y.numel() == 0 ? "" : "non-empty output outside P_x";
      },
      me() < 2);
}

TEST(BadInput, AllGatherAxisOutOfRange) {
  const auto P = mpi::Partition::world().create_cartesian_topology_partition({n()});
  row<PartitionError>(
      "axis 3 outside", [&] { nn::AllGather(P, 3, 0); },
      [&]() -> std::string {
        nn::AllGather ag(P, 0, 0);
        return differs(ag(at::full({1}, static_cast<double>(me()), at::kDouble)), at::arange(n(), at::kDouble));
      });
}

TEST(BadInput, LinearPartitionsDoNotFit) {
  // All-gather's P_y must be D x ... x 1 x M.
  row<PartitionError>(
      "D x ... x 1 x M", [] { nn::DistributedLinearAllGather(mpi::Partition(), cartesian(all_ranks(), {1, n(), 1}), 4 * n(), n()); },
      []() -> std::string {
        nn::DistributedLinearAllGather ag(mpi::Partition(), cartesian(all_ranks(), {1, 1, n()}), 4 * n(), n());
        const at::Tensor y = ag(at::randn({2, 3, 4}));
        return y.sizes() == at::IntArrayRef({2, 3, 1}) ? "" : "wrong output shape";
      });
}

TEST(BadInput, LinearFeaturesDifferAcrossRanks) {
  row<PartitionError>(
      "different arguments",
      [] { nn::DistributedLinearAllGather(mpi::Partition(), cartesian(all_ranks(), {1, 1, n()}), 4 * n() + (me() == 1), n()); },
      world_still_works);
}

// ---- layer calls ------------------------------------------------------------------------------

TEST(BadInput, BroadcastDataOutsidePx) {
  nn::Broadcast layer(cartesian({0}, {1}), mpi::Partition::world().create_cartesian_topology_partition({n()}));
  row<ShapeError>(
      rule_code::kOutsideNotEmpty, [&] { layer(at::ones({3}, at::kDouble)); },
      [&]() -> std::string { return differs(layer(me() == 0 ? at::ones({3}, at::kDouble) : at::zeros({0}, at::kDouble)), at::ones({3}, at::kDouble)); });
}

TEST(BadInput, SumReduceShapesDiffer) {
  nn::SumReduce layer(mpi::Partition::world().create_cartesian_topology_partition({n()}), cartesian({0}, {1}));
  row<ShapeError>(
      rule_code::kTeamShapes, [&] { layer(at::ones({2, 1 + me()}, at::kDouble)); },
      [&]() -> std::string {
        const at::Tensor y = layer(at::ones({2, 2}, at::kDouble));
        return me() == 0 ? differs(y, at::full({2, 2}, static_cast<double>(n()), at::kDouble))
                         : (y.numel() == 0 ? "" : "non-empty output outside P_y");
      });
}

TEST(BadInput, AllSumReduceDtypesDiffer) {
  nn::AllSumReduce all(mpi::Partition::world().create_cartesian_topology_partition({n()}), std::vector<int>{0});
  row<ShapeError>(
      rule_code::kDtypeMismatch, [&] { all(at::ones({4}, me() == 1 ? at::kFloat : at::kDouble)); },
      [&]() -> std::string { return differs(all(at::ones({4}, at::kDouble)), at::full({4}, static_cast<double>(n()), at::kDouble)); });
}

TEST(BadInput, AllSumReduceUnsupportedDtype) {
  nn::AllSumReduce all(mpi::Partition::world().create_cartesian_topology_partition({n()}), std::vector<int>{0});
  row<ShapeError>(
      rule_code::kDtypeUnsupported, [&] { all(at::zeros({4}, at::kBool)); },
      [&]() -> std::string { return differs(all(at::ones({4}, at::kFloat)), at::full({4}, static_cast<float>(n()), at::kFloat)); });
}

TEST(BadInput, RepartitionPiecesDoNotTile) {
  // One row slab over every rank: rank 1 claims another height.
  const auto px = cartesian(all_ranks(), {1, n()});
  nn::Repartition layer(px, cartesian({0}, {1, 1}));
  row<ShapeError>(
      rule_code::kTilingUneven, [&] { layer(at::ones({me() == 1 ? 3 : 2, 2}, at::kDouble)); },
      [&]() -> std::string {
        const at::Tensor y = layer(at::full({2, 2}, static_cast<double>(me()), at::kDouble));
        if (me() != 0) return y.numel() == 0 ? std::string() : std::string("non-empty output outside P_y");
        return differs(y, at::arange(n(), at::kDouble).repeat_interleave(2).expand({2, 2 * n()}).contiguous());
      });
}

TEST(BadInput, HaloGhostWiderThanTheBulk) {
  const auto px = cartesian({0, 1}, {2});
  nn::HaloExchange halo(px, Shape{2}, Shape{2});
  // Worker 0's bulk is 1 element: too narrow for worker 1's left ghost.
  row<ShapeError>(
      rule_code::kHaloGhostWider,
      [&] { halo(px.active() ? at::ones({me() == 0 ? 5 : 6}, at::kDouble) : at::zeros({0}, at::kDouble)); },
      [&]() -> std::string {
        const at::Tensor y = halo(px.active() ? at::full({6}, me() + 1.0, at::kDouble) : at::zeros({0}, at::kDouble));
        if (me() == 0) return differs(y.slice(0, 4, 6), at::full({2}, 2.0, at::kDouble));
        if (me() == 1) return differs(y.slice(0, 0, 2), at::full({2}, 1.0, at::kDouble));
        return y.numel() == 0 ? "" : "non-empty output outside P_x";
      },
      me() < 2);
}

TEST(BadInput, AllGatherMissingDimension) {
  nn::AllGather ag(mpi::Partition::world().create_cartesian_topology_partition({n()}), 0, 2);
  row<ShapeError>(
      rule_code::kMissingDim, [&] { ag(at::ones({3}, at::kDouble)); },
      [&]() -> std::string {
        const at::Tensor y = ag(at::full({1, 1, 1}, static_cast<double>(me()), at::kDouble));
        return differs(y, at::arange(n(), at::kDouble).reshape({1, 1, n()}));
      });
}

TEST(BadInput, LinearInputFeatures) {
  nn::DistributedLinearAllGather ag(mpi::Partition(), cartesian(all_ranks(), {1, 1, n()}), 4 * n(), n());
  row<ShapeError>(
      "should have 4 features", [&] { ag(at::randn({2, 3, me() == 1 ? 5 : 4})); },
      [&]() -> std::string { return ag(at::randn({2, 3, 4})).sizes() == at::IntArrayRef({2, 3, 1}) ? "" : "wrong output shape"; });
}

TEST(BadInput, LinearInputDtype) {
  nn::DistributedLinearAllGather ag(mpi::Partition(), cartesian(all_ranks(), {1, 1, n()}), 4 * n(), n());
  row<ShapeError>(
      rule_code::kLinearInput, [&] { ag(at::randn({2, 3, 4}, at::kDouble)); },
      [&]() -> std::string { return ag(at::randn({2, 3, 4})).sizes() == at::IntArrayRef({2, 3, 1}) ? "" : "wrong output shape"; });
}

TEST(BadInput, HaloMessageAboveTheCountLimit) {
  // Ghost rows of 2^31 + 1 bytes: an expanded (zero-stride) tensor asks for
  // them without allocating; both neighbours raise before posting.
  const auto px = cartesian({0, 1}, {2, 1});
  nn::HaloExchange halo(px, Shape{1, 0}, Shape{1, 0});
  const int64_t N = int64_t{INT_MAX} + 2;
  row<ShapeError>(
      rule_code::kCountOverflow,
      [&] { halo(px.active() ? at::zeros({1, 1}, at::kByte).expand({3, N}) : at::zeros({0}, at::kByte)); },
      [&]() -> std::string {
        const at::Tensor y = halo(px.active() ? at::full({3, 2}, me() + 1.0, at::kDouble) : at::zeros({0}, at::kDouble));
        if (me() == 0) return differs(y.slice(0, 2, 3), at::full({1, 2}, 2.0, at::kDouble));
        if (me() == 1) return differs(y.slice(0, 0, 1), at::full({1, 2}, 1.0, at::kDouble));
        return y.numel() == 0 ? "" : "non-empty output outside P_x";
      },
      me() < 2);
}

// ---- the differentiable communicator ----------------------------------------------------------

mpi::Communicator comm() { return mpi::Communicator::world(); }
std::string comm_still_works() {
  return differs(comm().allreduce(at::ones({2}, at::kDouble), ReduceOp::kSum),
                 at::full({2}, static_cast<double>(n()), at::kDouble));
}

TEST(BadInput, CommAllreduceShapesDiffer) {
  row<ShapeError>(
      "passes a tensor of shape", [] { comm().allreduce(at::ones({2 + me()}, at::kDouble), ReduceOp::kSum); },
      comm_still_works);
}

TEST(BadInput, CommAllreduceDtypesDiffer) {
  row<ShapeError>(
      "passes dtype", [] { comm().allreduce(at::ones({2}, me() == 1 ? at::kFloat : at::kDouble), ReduceOp::kSum); },
      comm_still_works);
}

// A static-shapes promise (docs/static-shapes.md) broken on one rank, with
// the debug setting on: every rank raises input.static_shapes, and the call
// site goes on working with the shapes it promised.
TEST(BadInput, CommStaticShapesPromiseBroken) {
  const bool was = mpi::check_static_shapes();
  mpi::set_check_static_shapes(true);
  const mpi::StaticShapes site = mpi::StaticShapes::promise();
  const auto promised = [&]() -> std::string {
    return differs(comm().allreduce(at::ones({2}, at::kDouble), ReduceOp::kSum, site),
                   at::full({2}, static_cast<double>(n()), at::kDouble));
  };
  EXPECT_EQ(promised(), "");  // the first call: the promise
  row<ShapeError>(
      rule_code::kStaticShapes,
      [&] { comm().allreduce(at::ones({me() == 1 ? 3 : 2}, at::kDouble), ReduceOp::kSum, site); }, promised);
  mpi::set_check_static_shapes(was);
}

TEST(BadInput, CommBcastRootsDiffer) {
  row<ShapeError>("other roots", [] { comm().bcast_(at::ones({2}, at::kDouble), me() == 1 ? 0 : 1); },
                  comm_still_works);
}

TEST(BadInput, CommReduceRootOutOfRangeOnOneRank) {
  row<ShapeError>(
      "root 99 is out of range", [] { comm().reduce_(at::ones({2}, at::kDouble), ReduceOp::kSum, me() == 1 ? 99 : 0); },
      comm_still_works);
}

TEST(BadInput, CommGatherShapesDiffer) {
  row<ShapeError>(
      "may differ only along axis 0", [] { comm().gather(at::ones({1, 2 + me()}, at::kDouble), 0, 0); },
      comm_still_works);
}

TEST(BadInput, CommAllgatherAxisOnOneRank) {
  row<ShapeError>(
      "axis 1 is out of range",
      [] { comm().allgather(at::ones(me() == 1 ? Shape{3} : Shape{3, 1}, at::kDouble), 1); }, comm_still_works);
}

TEST(BadInput, CommScatterCountsDoNotAddUp) {
  row<ShapeError>(
      "add up to", [] { comm().scatter(at::ones({n(), 2}, at::kDouble), 0, me() == 1 ? 2 : 1, 0); },
      comm_still_works);
}

TEST(BadInput, CommAlltoallCountsDoNotAddUp) {
  row<ShapeError>(
      "add up to", [] { comm().alltoall(at::ones({2, n()}, at::kDouble), 0, 1, me() == 0 ? 2 : 1); },
      comm_still_works);
}

// alltoall_out: one rank's out is wrong; every rank raises the same rule
// before anything moves, and the next call works. x is [2, n] on every
// rank; alltoall(x, 0, 1, 1) returns [2n, 1].
void alltoall_out_row(const std::string& needle, const std::function<at::Tensor()>& bad_out,
                      bool grad = false) {
  row<ShapeError>(
      needle,
      [&] {
        at::Tensor x = at::ones({2, n()}, at::kDouble).requires_grad_(grad && me() == 1);
        at::Tensor out = me() == 1 ? bad_out() : at::zeros({2 * n(), 1}, at::kDouble);
        comm().alltoall_out(out, x, 0, 1, 1);
      },
      [] {
        at::Tensor out = at::zeros({2 * n(), 1}, at::kDouble);
        comm().alltoall_out(out, at::full({2, n()}, me() + 1.0, at::kDouble), 0, 1, 1);
        // Rank r receives [2, 1] from every rank i (its rows hold i + 1).
        std::vector<at::Tensor> want;
        for (int i = 0; i < n(); ++i) want.push_back(at::full({2, 1}, i + 1.0, at::kDouble));
        return differs(out, at::cat(want, 0));
      });
}

TEST(BadInput, CommAlltoallOutShape) {
  alltoall_out_row("rank 1's out tensor has shape " + std::to_string(2 * n() + 1) + "x1",
                   [] { return at::zeros({2 * n() + 1, 1}, at::kDouble); });
}
TEST(BadInput, CommAlltoallOutDtype) {
  alltoall_out_row(rule_code::kOutTensor, [] { return at::zeros({2 * n(), 1}, at::kFloat); });
}
TEST(BadInput, CommAlltoallOutNotContiguous) {
  alltoall_out_row("is not contiguous",
                   [] { return at::zeros({2 * n(), 2}, at::kDouble).narrow(1, 0, 1); });
}
TEST(BadInput, CommAlltoallOutRequiresGrad) {
  alltoall_out_row("records no autograd history", [] { return at::zeros({2 * n(), 1}, at::kDouble); },
                   /*grad=*/true);
}
TEST(BadInput, CommAlltoallOutOverlapsInput) {
  row<ShapeError>(
      "overlaps its input",
      [] {
        // On rank 1, out is a view of the input's own storage.
        at::Tensor x = at::ones({2 * n(), 1}, at::kDouble);
        at::Tensor out = me() == 1 ? x : at::zeros({2 * n(), 1}, at::kDouble);
        comm().alltoall_out(out, x, 0, 0, 2 * n());
      },
      comm_still_works);
}

TEST(BadInput, CommAlltoallOutPartlyOverlapsInput) {
  row<ShapeError>(
      "overlaps its input",
      [] {
        // On rank 1, out is the input's storage shifted by one element:
        // they share all but one element each.
        at::Tensor buf = at::full({2 * n() + 1}, me() + 1.0, at::kDouble);
        at::Tensor x = buf.narrow(0, 0, 2 * n()).view({2, n()});
        at::Tensor out = me() == 1 ? buf.narrow(0, 1, 2 * n()).view({2 * n(), 1}) : at::zeros({2 * n(), 1}, at::kDouble);
        comm().alltoall_out(out, x, 0, 1, 1);
      },
      [] {
        // A view of the same storage that does not overlap the input is
        // accepted, and receives what it should.
        at::Tensor buf = at::full({4 * n()}, me() + 1.0, at::kDouble);
        at::Tensor x = buf.narrow(0, 0, 2 * n()).view({2, n()});
        at::Tensor out = buf.narrow(0, 2 * n(), 2 * n()).view({2 * n(), 1});
        comm().alltoall_out(out, x, 0, 1, 1);
        std::vector<at::Tensor> want;
        for (int i = 0; i < n(); ++i) want.push_back(at::full({2, 1}, i + 1.0, at::kDouble));
        return differs(out, at::cat(want, 0));
      });
}

TEST(BadInput, CommPeerOutOfRange) {
  row<ShapeError>(
      "dest " + std::to_string(n()) + " is out of range", [] { comm().isend(at::ones({2}, at::kDouble), n(), 0); },
      comm_still_works);
}

// A receive whose tensor is not the size of its send's (docs/bad-inputs.md):
// the receiver raises input.message_size at its wait, naming the sender and
// both sizes; the sender's send completes with its values (MPI gives a send
// no word of the receive's size). Small messages and ones of 1 MiB and more
// (MPICH's eager and rendezvous protocols), then a correct pair on the same
// tag and an allreduce. Rank 2 (at 3 ranks) is not involved.
std::string p2p_still_works() {
  const at::Tensor t = at::arange(5, at::kDouble) * 3;
  std::string got;
  if (me() == 0) got = differs(comm().send(t, 1, 0), t);
  if (me() == 1) got = differs(comm().recv(at::empty({5}, at::kDouble), 0, 0), t);
  return got.empty() ? comm_still_works() : got;
}

void receive_of_another_size(int64_t sent, int64_t received, const std::string& needle) {
  std::string sender = "rank 0 did not send";
  row<ShapeError>(
      needle,
      [&] {
        const at::Tensor t = at::arange(sent, at::kDouble);
        if (me() == 0) sender = differs(comm().send(t, 1, 0), t);
        if (me() == 1) comm().recv(at::empty({received}, at::kDouble), 0, 0);
      },
      [&]() -> std::string {
        if (me() == 0 && !sender.empty()) return "rank 0's send: " + sender;
        return p2p_still_works();
      },
      me() == 1);
}

TEST(BadInput, CommRecvSmallerThanSend) {
  receive_of_another_size(6, 4, rule_code::kMessageSize);
  receive_of_another_size(6, 4, "irecv from 0 (tag 0): the message was larger than the receive's tensor of shape [4]");
  receive_of_another_size(int64_t{1} << 18, (int64_t{1} << 17) + 1, rule_code::kMessageSize);
}

TEST(BadInput, CommRecvLargerThanSend) {
  receive_of_another_size(4, 6, rule_code::kMessageSize);
  receive_of_another_size(4, 6, "irecv from 0 (tag 0): the message held 4 elements, fewer than the receive's tensor of shape [6]");
  receive_of_another_size((int64_t{1} << 17) + 1, int64_t{1} << 18, rule_code::kMessageSize);
}

// ---- counts above MPI's limit (issue 35 item 5) ----------------------------------------------
// MPI counts and displacements are ints. The inputs below are expanded
// (zero-stride) byte tensors: their shapes ask for counts above INT_MAX and
// nothing of that size exists. While the bad call runs, an AllocationGuard
// makes every LibTorch CPU allocation above 256 MiB throw, so a row also
// fails if anything of the count's size is copied or allocated before the
// check raises.

constexpr int64_t kAboveLimit = int64_t{INT_MAX} + 2;
constexpr int64_t kGuardBytes = int64_t{256} << 20;

class AllocationGuard final : public c10::Allocator {
 public:
  // (The highest priority: LibTorch keeps the allocator of the highest
  // priority it was given; the default's is above 0.)
  AllocationGuard() : inner_(c10::GetCPUAllocator()) {
    c10::SetCPUAllocator(this, kPriority);
    if (c10::GetCPUAllocator() != this) throw std::logic_error("AllocationGuard: not installed");
  }
  ~AllocationGuard() override { c10::SetCPUAllocator(inner_, kPriority); }
  AllocationGuard(const AllocationGuard&) = delete;
  AllocationGuard& operator=(const AllocationGuard&) = delete;
  c10::DataPtr allocate(size_t n) const override {
    if (static_cast<int64_t>(n) > kGuardBytes)
      throw std::runtime_error("AllocationGuard: " + std::to_string(n) +
                               " bytes allocated before the count check raised");
    return inner_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }

 private:
  static constexpr uint8_t kPriority = 255;
  c10::Allocator* inner_;
};

// `extent` bytes along dimension 0 (times `rows` along 1 when given), none allocated.
at::Tensor announced(int64_t extent, int64_t rows = 0) {
  const at::Tensor one = at::zeros(rows ? at::IntArrayRef{1, 1} : at::IntArrayRef{1}, at::kByte);
  return rows ? one.expand({rows, extent}) : one.expand({extent});
}

// A ShapeError of rule input.count_overflow whose message holds `part`.
void expect_count_error(const std::function<void()>& f, const std::string& part = "") {
  try {
    f();
    ADD_FAILURE() << "nothing was raised";
  } catch (const ShapeError& e) {
    EXPECT_EQ(e.rule(), rule_code::kCountOverflow) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << e.what() << "' lacks '" << part << "'";
  }
}

// The checks themselves, pure functions of what every member knows: no MPI,
// no data.
TEST(CountLimit, BlocksCheckEveryCountAndDisplacementNotTheTotal) {
  using mpi::detail::block_counts;
  std::vector<int> counts, displs;
  const int64_t big = 1100000000;  // 1.1e9: one fits, two do not
  EXPECT_EQ(block_counts({big, big}, 1, "t", counts, displs), 2 * big);  // the total is not a count
  EXPECT_EQ(displs, (std::vector<int>{0, static_cast<int>(big)}));
  EXPECT_EQ(block_counts({INT_MAX}, 1, "t", counts, displs), INT_MAX);
  expect_count_error([&] { block_counts({int64_t{INT_MAX} + 1}, 1, "t", counts, displs); });
  expect_count_error([&] { block_counts({2}, big, "t", counts, displs); });  // 2 rows of 1.1e9
  // Each block fits; the third one's displacement, 2.2e9, does not.
  expect_count_error([&] { block_counts({big, big, 1}, 1, "t", counts, displs); },
                     "a count of 2200000000 elements");
}

TEST(CountLimit, AlltoallChecksEveryMembersCounts) {
  // Three members of shape [g_m, S] exchange along dimension 1, numelem
  // {1, 1.5e9, 0}, g {2, 1, 1}: member 0 would send member 1 3e9 elements
  // and member 1 receive them; member 2's own counts all fit, so only a
  // check of every member's counts stops it from posting.
  using mpi::detail::alltoall_counts;
  const int64_t n1 = 1500000000, S = 1 + n1;
  const std::vector<int64_t> g{2, 1, 1}, numelem{1, n1, 0};
  for (int m = 0; m < 3; ++m) {
    const std::vector<int64_t> sizes{g[m], S};
    if (m == 2) {
      const auto k = alltoall_counts(m, sizes, 0, 1, g, numelem, "t");
      EXPECT_EQ(k.scounts, (std::vector<int>{1, static_cast<int>(n1), 0}));
      EXPECT_EQ(k.rcounts, (std::vector<int>{0, 0, 0}));
    } else {
      expect_count_error([&] { alltoall_counts(m, sizes, 0, 1, g, numelem, "t"); },
                         "a count of 3000000000 elements");
    }
  }
}

TEST(CountLimit, AlltoallChecksEveryMembersReceiptsWhereEveryInputFits) {
  // Three members of shape [g_m, 2] exchange along dimension 1 (gathering
  // along 0), numelem {0, 2, 0}, g {1e9, 1e9, 1}: every input (at most 2e9
  // elements) and every block sent fits an int, but member 1 receives
  // 2e9 + 2e9 + 2 elements, whose last block starts at 4e9. The check the
  // communicator runs before posting (alltoall_checked_counts) must raise on
  // every member, not only on member 1 while the others post and wait.
  using mpi::detail::alltoall_checked_counts;
  const int64_t big = 1000000000;
  const std::vector<int64_t> g{big, big, 1}, numelem{0, 2, 0};
  for (int m = 0; m < 3; ++m)
    expect_count_error([&] { alltoall_checked_counts(m, {g[m], 2}, 0, 1, g, numelem, "t"); },
                       "a count of 4000000000 elements");
}

TEST(CountLimit, LayersCheckEveryWorkersVolume) {
  // Headers as the layers gather them: every worker's tensor of 4 elements,
  // then worker 1's of INT_MAX + 2.
  const mpi::Partition world = mpi::Partition::world();
  std::vector<mpi::detail::Header> headers(n());
  for (auto& h : headers) {
    h.ndim = 1;
    h.dims[0] = 4;
  }
  mpi::detail::check_volumes_fit("t", world, headers);
  headers[1].dims[0] = kAboveLimit;
  expect_count_error([&] { mpi::detail::check_volumes_fit("t", world, headers); },
                     "worker 1's tensor of shape [2147483649]");
  // A gather's blocks: 1.1e9 on each worker, one team of all: the third
  // worker's displacement does not fit.
  for (auto& h : headers) h.dims[0] = 1100000000;
  auto gather = [&] { mpi::detail::check_blocks_fit("t", world, {all_ranks()}, headers, 0, false); };
  if (n() < 3)
    gather();
  else
    expect_count_error(gather);
}

// The calls. Broadcast from P_x = [0, 1, 2] to P_y = [1, 0, 2] (one worker
// per team): rank 0 is the root of team 0 and a member of team 1, rank 1
// the root of team 1 (2^31 + 1 bytes) and a member of team 0, rank 2 (3
// ranks) its own team, whose count fits: every rank raises before posting.
// SumReduce over the same teams the other way: rank 1's contribution is
// too large.
template <typename Layer>
void swapped_teams_above_the_limit() {
  Ranks swapped = all_ranks();
  std::swap(swapped[0], swapped[1]);
  Layer layer(cartesian(all_ranks(), {n()}), cartesian(swapped, {n()}));
  row<ShapeError>(
      rule_code::kCountOverflow,
      [&] {
        AllocationGuard guard;
        layer(me() == 1 ? announced(kAboveLimit) : at::ones({4}, at::kByte));
      },
      [&]() -> std::string {
        // Rank r's output comes from the worker paired with it: 0 from 1, 1 from 0.
        const int from = me() < 2 ? 1 - me() : me();
        return differs(layer(at::full({3}, me() + 1.0, at::kDouble)), at::full({3}, from + 1.0, at::kDouble));
      });
}

TEST(BadInput, BroadcastAboveTheCountLimit) { swapped_teams_above_the_limit<nn::Broadcast>(); }
TEST(BadInput, SumReduceAboveTheCountLimit) { swapped_teams_above_the_limit<nn::SumReduce>(); }

TEST(BadInput, AllSumReduceAboveTheCountLimit) {
  nn::AllSumReduce all(mpi::Partition::world().create_cartesian_topology_partition({n()}), std::vector<int>{0});
  row<ShapeError>(
      rule_code::kCountOverflow,
      [&] {
        AllocationGuard guard;
        all(announced(kAboveLimit));
      },
      [&]() -> std::string { return differs(all(at::ones({4}, at::kDouble)), at::full({4}, static_cast<double>(n()), at::kDouble)); });
}

// At 3 ranks every block fits (1.1e9 bytes) and the third one's
// displacement does not; at 2, rank 1's block does not fit.
TEST(BadInput, AllGatherAboveTheCountLimit) {
  nn::AllGather ag(mpi::Partition::world().create_cartesian_topology_partition({n()}), 0, 0);
  const int64_t extent = n() >= 3 ? (me() == 2 ? 1 : 1100000000) : (me() == 1 ? kAboveLimit : 1);
  row<ShapeError>(
      rule_code::kCountOverflow,
      [&] {
        AllocationGuard guard;
        ag(announced(extent));
      },
      [&]() -> std::string {
        return differs(ag(at::full({1}, static_cast<double>(me()), at::kDouble)), at::arange(n(), at::kDouble));
      });
}

// CountLimit.AlltoallChecksEveryMembersCounts' exchange, over MPI: at 3
// ranks rank 2's own counts fit.
TEST(BadInput, CommAlltoallAboveTheCountLimit) {
  const int64_t n1 = 1500000000;
  const int64_t numelem = me() == 1 ? n1 : (me() == 0 ? 1 : 0);
  row<ShapeError>(
      rule_code::kCountOverflow,
      [&] {
        AllocationGuard guard;
        comm().alltoall(announced(1 + n1, me() == 0 ? 2 : 1), 0, 1, numelem);
      },
      comm_still_works);
}

TEST(BadInput, CommGatherAboveTheCountLimit) {
  row<ShapeError>(
      rule_code::kCountOverflow,
      [&] {
        AllocationGuard guard;
        comm().gather(announced(me() == 1 ? kAboveLimit : 1), 0, 0);
      },
      comm_still_works);
}

TEST(BadInput, CommBcastAboveTheCountLimit) {
  row<ShapeError>(
      rule_code::kCountOverflow,
      [&] {
        AllocationGuard guard;
        comm().bcast_(announced(kAboveLimit), 0);
      },
      comm_still_works);
}

// Point-to-point above the limit (docs/bad-inputs.md): the side above it
// raises input.count_overflow, the send at isend, the receive at its wait;
// a receive that fits, of a send above the limit, gets the sender's empty
// notice and raises input.message_size. Nothing is left on the
// communicator: the next pair on the same tag gets its own message.
TEST(BadInput, CommIsendAboveTheCountLimit) {
  // Rank 0 sends rank 1 a tensor of 2^31 + 1 bytes; rank 1 receives one of that shape.
  row<ShapeError>(
      rule_code::kCountOverflow,
      [&] {
        AllocationGuard guard;
        if (me() == 0) comm().isend(announced(kAboveLimit), 1, 0);
        if (me() == 1) comm().recv(announced(kAboveLimit), 0, 0);
      },
      p2p_still_works, me() < 2);
}

TEST(BadInput, CommSendAboveTheCountLimitIntoASmallReceive) {
  row<ShapeError>(
      me() == 0 ? rule_code::kCountOverflow : rule_code::kMessageSize,
      [&] {
        AllocationGuard guard;
        if (me() == 0) comm().isend(announced(kAboveLimit), 1, 0);
        if (me() == 1) comm().recv(at::empty({4}, at::kByte), 0, 0);
      },
      p2p_still_works, me() < 2);
}

TEST(BadInput, CommReceiveAboveTheCountLimitOfASmallSend) {
  std::string sender = "rank 0 did not send";
  row<ShapeError>(
      rule_code::kCountOverflow,
      [&] {
        AllocationGuard guard;
        const at::Tensor t = at::arange(4, at::kByte);
        if (me() == 0) sender = differs(comm().send(t, 1, 0), t);
        if (me() == 1) comm().recv(announced(kAboveLimit), 0, 0);
      },
      [&]() -> std::string {
        if (me() == 0 && !sender.empty()) return "rank 0's send: " + sender;
        return p2p_still_works();
      },
      me() == 1);
}

// ---- schedules and pipelines -----------------------------------------------------------------

TEST(BadInput, ScheduleCsvMalformed) {
  row<smp::ScheduleError>(
      "CSV row 0 (rank 0), column 1", [] { smp::schedule_from_csv("0F0,0X1\n"); },
      []() -> std::string {
        smp::verify(smp::schedule_from_csv("0F0,0B0\n", 1));
        return "";
      });
}

TEST(BadInput, ScheduleDeadlocks) {
  // A send without its receive.
  row<smp::ScheduleError>(
      "a send without its receive",
      [] { smp::verify(smp::schedule_from_csv("0F0,0SEND_F0,0SEND_F0\n1RECV_F0,1F0,1B0\n")); },
      []() -> std::string {
        smp::verify(smp::with_comms(smp::build_schedule("1f1b", 2, 4)));
        return "";
      });
}

testing::ModelSpec small_mlp() { return {false, {4, 6, 6, 3}, 3}; }  // 5 layers

std::string pipeline_still_trains(smp::DistributedModel& model) {
  auto train = testing::mse_step(model, 2);
  const at::Tensor x = torch::randn({4, 4}, torch::kDouble), y = torch::randn({4, 3}, torch::kDouble);
  const double loss = train(x, y).reduce_mean().item<double>();
  return loss > 0 ? "" : "the next step gave no loss";
}

TEST(BadInput, PipelineSplitPointsBad) {
  smp::Config c = partitions(2);
  c.pipeline("interleaved");
  if (n() % 2 != 0) c.partitions(1);
  smp::init(c);
  if (smp::mp_size() < 2) GTEST_SKIP() << "needs an even world (2 stages), running at " << n();
  row<smp::UsageError>(
      "split points must increase", [] { smp::DistributedModel m(testing::build_model(small_mlp()), {0}); },
      []() -> std::string {
        smp::DistributedModel m(testing::build_model(small_mlp()), {2});
        return pipeline_still_trains(m);
      });
}

TEST(BadInput, PipelineFewerLayersThanStages) {
  smp::init(partitions(n()));
  row<smp::UsageError>(
      "has 1 layers, fewer than the " + std::to_string(n()) + " pipeline stages",
      [] { smp::DistributedModel m(torch::nn::Sequential(torch::nn::Linear(3, 3))); },
      [] {
        smp::DistributedModel m(testing::build_model({false, {4, 6, 6, 6, 6, 3}, 3}));
        return pipeline_still_trains(m);
      });
}

TEST(BadInput, PipelineBatchesDiffer) {
  smp::Config c = partitions(n());
  c.pipeline("simple");
  smp::init(c);
  torch::manual_seed(7);
  smp::DistributedModel model(testing::build_model({false, {4, 6, 6, 6, 6, 3}, 3}));
  auto train = testing::mse_step(model, 2);
  // The last stage's data loader gives it a batch of 6, the others 4.
  const int64_t b = smp::mp_rank() == n() - 1 ? 6 : 4;
  row<smp::UsageError>(
      "mismatched microbatch shapes",
      [&] { train(torch::randn({b, 4}, torch::kDouble), torch::randn({b, 3}, torch::kDouble)); },
      [&]() -> std::string { return pipeline_still_trains(model); });
}

// Stage 0's activation of 2 x (2^28 + 1) doubles, expanded (4 GiB that do
// not exist), for one step: more bytes than an MPI count holds (issue 35
// item 5). Stage 0 raises before its header is posted, which would have the
// next stage allocate what it announces; the others hear of it.
struct InflateImpl : torch::nn::Module {
  bool armed = false;
  at::Tensor forward(at::Tensor x) {
    return armed ? x.sum().reshape({1, 1}).expand({x.size(0), (int64_t{1} << 28) + 1}) : x;
  }
};
TORCH_MODULE(Inflate);

TEST(BadInput, PipelineActivationAboveTheCountLimit) {
  smp::init(partitions(n()));
  torch::manual_seed(7);
  Inflate inflate;
  torch::nn::Sequential layers(torch::nn::Linear(4, 6), inflate, torch::nn::Tanh(), torch::nn::Linear(6, 3));
  layers->to(torch::kDouble);
  smp::DistributedModel model(layers, n() == 2 ? std::vector<int>{2} : std::vector<int>{2, 3});
  auto train = testing::mse_step(model, 2);
  row<Error>(
      "above the MPI count limit",
      [&] {
        inflate->armed = true;
        AllocationGuard guard;
        train(torch::randn({4, 4}, torch::kDouble), torch::randn({4, 3}, torch::kDouble));
      },
      [&]() -> std::string {
        inflate->armed = false;
        return pipeline_still_trains(model);
      });
  inflate->armed = false;
}

TEST(BadInput, PipelineUserScheduleWrongShape) {
  smp::init(partitions(n()));
  torch::manual_seed(7);
  smp::DistributedModel model(testing::build_model({false, {4, 6, 6, 6, 6, 3}, 3}));
  // A schedule for 2 microbatches given a step of 4.
  smp::set_schedule(smp::with_comms(smp::build_schedule("gpipe", n(), 2)));
  auto train = testing::mse_step(model, 4);
  row<smp::ScheduleError>(
      "\"gpipe\" is for 2 microbatches, the step has 4",
      [&] { train(torch::randn({4, 4}, torch::kDouble), torch::randn({4, 3}, torch::kDouble)); },
      [&]() -> std::string {
        smp::set_schedule(std::nullopt);
        return pipeline_still_trains(model);
      });
  smp::set_schedule(std::nullopt);
}

}  // namespace
}  // namespace partita::spec
