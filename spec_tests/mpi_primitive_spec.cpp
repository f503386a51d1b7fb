// The seeds' examples with data, against the MPI layers: each rank checks
// its own output and input gradient; verdicts agreed by all ranks.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <climits>

#include "data_spec.hpp"
#include "partita/errors.hpp"
#include "partita/mpi/buffer_cache.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/all_sum_reduce.hpp"
#include "partita/nn/broadcast.hpp"
#include "partita/nn/sum_reduce.hpp"

namespace partita::spec {
namespace {

bool agreed(bool local) { return mpi::all_true(local, mpi::world_comm()); }

// The Cartesian partition of the given world ranks and shape.
mpi::CartesianPartition cartesian(const Ranks& ranks, const Shape& shape) {
  return mpi::Partition::world().create_partition_inclusive(ranks).create_cartesian_topology_partition(shape);
}

class MpiData : public ::testing::TestWithParam<DataExample> {};

TEST_P(MpiData, ForwardAndAdjointMatchTheSeed) {
  const DataExample& e = GetParam();
  if (mpi::world_size() < e.world)
    GTEST_SKIP() << "needs " << e.world << " ranks, running at " << mpi::world_size();
  torch::set_num_threads(1);
  const int me = mpi::world_rank();
  const auto px = cartesian(e.px_ranks, e.px_shape);
  at::Tensor x = (px.active() ? arange_input(me, e.local_shape) : at::zeros({0}, at::kDouble)).requires_grad_();
  const auto o = Options().transpose_src(e.transpose_src).transpose_dest(e.transpose_dest).preserve_batch(e.preserve_batch);
  at::Tensor y;
  if (e.primitive == "all_sum_reduce") {
    nn::AllSumReduce layer(px, e.axes);
    y = layer(x);
  } else {
    const auto py = cartesian(e.py_ranks, e.py_shape);
    if (e.primitive == "broadcast") {
      nn::Broadcast layer(px, py, o);
      y = layer(x);
    } else {
      nn::SumReduce layer(px, py, o);
      y = layer(x);
    }
  }
  const bool in_example = me < e.world;
  bool ok = true;
  if (in_example && e.y[me].defined()) {
    ok = at::equal(y.detach(), e.y[me]);
    EXPECT_TRUE(ok) << "worker " << me << "\n" << y << "\nexpected\n" << e.y[me];
  } else {
    ok = y.numel() == 0;
    EXPECT_EQ(y.numel(), 0) << "worker " << me;
    // Zero volume keeps the batch size only with preserve_batch.
    if (px.active() && e.preserve_batch) ok = ok && y.dim() == 2 && y.size(0) == e.local_shape[0];
    if (px.active() && !e.preserve_batch) ok = ok && y.sizes() == at::IntArrayRef{0};
  }
  torch::autograd::backward({y}, {arange_cotangent(me, Shape(y.sizes().begin(), y.sizes().end()))});
  // Every rank's x (a leaf that requires grad, zero-volume where the rank
  // holds none) has a defined gradient of its own shape, as DistDL's
  // functions give one on every worker they run on (issue 33).
  const bool defined = x.grad().defined() && x.grad().sizes() == x.sizes();
  EXPECT_TRUE(defined) << "worker " << me << ": x.grad is undefined or misshapen";
  ok = ok && defined;
  const at::Tensor g = defined ? x.grad() : at::zeros_like(x);
  if (in_example && e.dx[me].defined()) {
    const bool good = at::equal(g, e.dx[me]);
    EXPECT_TRUE(good) << "gradient of worker " << me << "\n" << g << "\nexpected\n" << e.dx[me];
    ok = ok && good;
  } else {
    ok = ok && g.count_nonzero().item<int64_t>() == 0;
  }
  EXPECT_TRUE(agreed(ok)) << e.name;
}

INSTANTIATE_TEST_SUITE_P(Seeds, MpiData, ::testing::ValuesIn(data_examples()),
                         [](const auto& info) { return test_name(info.param); });

// Seed 000: a partition without a topology is treated as a 1-dimensional
// Cartesian one (shape {size}, index = rank), so Broadcast and SumReduce take
// it as P_x or P_y under the same rules (issue 33). Values stated by hand:
// every input is arange_input(rank), every cotangent arange_cotangent(rank).
TEST(MpiNonCartesian, SumReduceAndBroadcastTreatAPartitionWithoutTopologyAsOneDimensional) {
  const int n = mpi::world_size(), me = mpi::world_rank();
  if (n < 4) GTEST_SKIP() << "needs 4 ranks, running at " << n;
  torch::set_num_threads(1);
  const Shape s{2, 3};
  const auto world = mpi::Partition::world();
  const mpi::Partition four = world.create_partition_inclusive({0, 1, 2, 3});  // shape {4}
  const mpi::Partition one = world.create_partition_inclusive({1});            // shape {1}
  const mpi::Partition pair = world.create_partition_inclusive({2, 3});        // shape {2}
  const auto grid = cartesian({0, 1, 2, 3}, {2, 2});
  ASSERT_FALSE(four.cartesian());
  auto input = [&](const mpi::Partition& P) {
    return (P.active() ? arange_input(me, s) : at::zeros({0}, at::kDouble)).requires_grad_();
  };
  auto run = [&](auto layer, const mpi::Partition& px, const mpi::Partition& py,
                 const std::function<at::Tensor(int)>& want_y, const std::function<at::Tensor(int)>& want_dx,
                 const std::string& what) {
    at::Tensor x = input(px);
    at::Tensor y = layer(x);
    bool ok = py.active() ? at::equal(y.detach(), want_y(me)) : y.numel() == 0;
    EXPECT_TRUE(ok) << what << ": y of worker " << me << "\n" << y;
    torch::autograd::backward({y}, {arange_cotangent(me, Shape(y.sizes().begin(), y.sizes().end()))});
    const bool dx = x.grad().defined() && (px.active() ? at::equal(x.grad(), want_dx(me)) : x.grad().numel() == 0);
    EXPECT_TRUE(dx) << what << ": dx of worker " << me;
    EXPECT_TRUE(agreed(ok && dx)) << what;
  };
  at::Tensor sum4 = at::zeros(s, at::kDouble), cot4 = at::zeros(s, at::kDouble);
  for (int r = 0; r < 4; ++r) {
    sum4 += arange_input(r, s);
    cot4 += arange_cotangent(r, s);
  }
  // {4} -> {1}: worker 1 gets the sum of the four; each gets its cotangent.
  run(nn::SumReduce(four, one), four, one, [&](int) { return sum4; },
      [&](int) { return arange_cotangent(1, s); }, "SumReduce {4} -> {1}");
  // {1} -> {4}: every worker gets worker 1's input; it gets the cotangents' sum.
  run(nn::Broadcast(one, four), one, four, [&](int) { return arange_input(1, s); },
      [&](int) { return cot4; }, "Broadcast {1} -> {4}");
  // {2} (ranks 2, 3) -> Cartesian 2 x 2, padded to 1 x 2: worker (i, j)
  // gets pair's worker j, i.e. rank 2 + j; rank 2 + j's gradient is the sum
  // of the cotangents of column j (ranks j and 2 + j).
  run(nn::Broadcast(pair, grid), pair, grid, [&](int r) { return arange_input(2 + r % 2, s); },
      [&](int r) { return arange_cotangent(r - 2, s) + arange_cotangent(r, s); }, "Broadcast {2} -> 2 x 2");
  // And back: 2 x 2 -> {2}: rank 2 + j gets the sum of column j.
  run(nn::SumReduce(grid, pair), grid, pair,
      [&](int r) { return arange_input(r - 2, s) + arange_input(r, s); },
      [&](int r) { return arange_cotangent(2 + r % 2, s); }, "SumReduce 2 x 2 -> {2}");
}

// Errors, not hangs: each mistake raises a clear ShapeError on every rank of
// the layer, and the world communicator still works afterwards.
// Ranks outside the layer (`involved` false) take no part and need not raise.
void expect_shape_error(const std::function<void()>& body, const std::string& needle,
                        bool involved = true) {
  bool raised = false;
  std::string what;
  try {
    body();
  } catch (const ShapeError& e) {
    what = e.what();
    raised = what.find(needle) != std::string::npos;
  }
  if (involved) {
    EXPECT_TRUE(raised) << "expected a ShapeError mentioning '" << needle << "', got '" << what << "'";
  }
  EXPECT_TRUE(agreed(raised || !involved));
  EXPECT_TRUE(agreed(true));  // the world still works
}

TEST(MpiErrors, DataOutsidePx) {
  const int n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  const auto world = mpi::Partition::world();
  const auto px = cartesian({0}, {1});
  nn::Broadcast layer(px, world.create_cartesian_topology_partition({n}));
  expect_shape_error([&] { layer(at::ones({3})); }, "is not in P_x");
}

TEST(MpiErrors, DifferentShapesInOneReduction) {
  const int n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  const auto world = mpi::Partition::world();
  const auto px = world.create_cartesian_topology_partition({n});
  const auto py = cartesian({0}, {1});
  nn::SumReduce layer(px, py);
  expect_shape_error([&] { layer(at::ones({2, 1 + mpi::world_rank()})); }, "different shapes");
  nn::AllSumReduce all(px, std::vector<int>{0});
  expect_shape_error([&] { all(at::ones({1 + mpi::world_rank()})); }, "different shapes");
}

TEST(MpiErrors, DtypesDisagree) {
  const int n = mpi::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  const auto world = mpi::Partition::world();
  const auto px = world.create_cartesian_topology_partition({n});
  nn::AllSumReduce all(px, std::vector<int>{0});
  expect_shape_error([&] { all(at::ones({4}, mpi::world_rank() == 1 ? at::kFloat : at::kDouble)); },
                     "dtypes differ");
}

TEST(MpiDtypes, BroadcastAndReduceMoveEverySupportedDtype) {
  const int n = mpi::world_size();
  const auto world = mpi::Partition::world();
  const auto all = world.create_cartesian_topology_partition({n});
  const auto root = cartesian({0}, {1});
  nn::Broadcast bcast(root, all);
  nn::SumReduce reduce(all, root);
  bool ok = true;
  for (auto t : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kInt, at::kLong, at::kChar}) {
    const at::Tensor x = mpi::world_rank() == 0 ? at::arange(6, at::kDouble).to(t) : at::zeros({0}, t);
    const at::Tensor y = bcast(x);
    ok = ok && y.scalar_type() == t && at::equal(y.to(at::kDouble), at::arange(6, at::kDouble));
    // Small integers: the sum is exact in every dtype, bfloat16 included.
    const at::Tensor s = reduce(at::full({3}, 1 + mpi::world_rank(), at::kDouble).to(t));
    if (mpi::world_rank() == 0)
      ok = ok && s.scalar_type() == t &&
           at::equal(s.to(at::kDouble), at::full({3}, n * (n + 1) / 2, at::kDouble));
    EXPECT_TRUE(ok) << "dtype " << t;
  }
  EXPECT_TRUE(agreed(ok));
}

}  // namespace
}  // namespace partita::spec

#include "partita/nn/all_gather.hpp"

namespace partita::spec {
namespace {

TEST(MpiGather, AllGatherAndReduceScatterOn2x2) {
  if (mpi::world_size() < 4) GTEST_SKIP() << "needs 4 ranks, running at " << mpi::world_size();
  torch::set_num_threads(1);
  const int me = mpi::world_rank();
  const auto px = cartesian({0, 1, 2, 3}, {2, 2});
  nn::AllGather gather(px, 1, 0);
  nn::ReduceScatter scatter(px, 1, 0);
  const at::Tensor g = gather(px.active() ? arange_input(me, {2, 3}) : at::zeros({0}, at::kDouble));
  const at::Tensor s = scatter(px.active() ? arange_input(me, {5, 2}) : at::zeros({0}, at::kDouble));
  bool ok = true;
  if (px.active()) {
    ok = at::equal(g, expected_all_gather(me)) && at::equal(s, expected_reduce_scatter(me));
    EXPECT_TRUE(ok) << "worker " << me << "\n" << g << "\n" << s;
  } else {
    ok = g.numel() == 0 && s.numel() == 0;
  }
  // Pieces that differ outside the gathered dimension: an error everywhere.
  expect_shape_error([&] { gather(px.active() ? at::ones({2, 1 + me % 2}) : at::zeros({0})); },
                     "differ outside dimension 0", px.active());
  EXPECT_TRUE(agreed(ok));
}

// DistDL's parameters (issue 9), values by hand. P_x = 2x2 on ranks 0-3,
// worker (i, j) holds the 1x1 tensor [[10 i + j]].
// axes_all_gather {1}: row i of the 2x2 block, [[10 i, 10 i + 1]];
// axes_keep {0} says the same; axes_all_gather {0, 1}: the whole block
// [[0, 1], [10, 11]] on every worker. With scale_backward {0, 1} and an
// all-ones gradient, each worker's input gradient is 4 (the four copies)
// divided by 2 * 2 = 1; without it, 4. ReduceScatter with
// axes_reduce_scatter {0, 1} on the 2x2 input [[1, 2], [3, 4]] * (r + 1)
// on rank r: the sum is [[10, 20], [30, 40]], worker (i, j) keeps [[10 (2 i +
// j + 1)]].
TEST(MpiGather, DistDLAxesKeepAndScaleBackwardOn2x2) {
  if (mpi::world_size() < 4) GTEST_SKIP() << "needs 4 ranks, running at " << mpi::world_size();
  torch::set_num_threads(1);
  const int me = mpi::world_rank();
  const auto px = cartesian({0, 1, 2, 3}, {2, 2});
  const int i = me / 2, j = me % 2;
  auto input = [&] {
    return (px.active() ? at::full({1, 1}, 10.0 * i + j, at::kDouble) : at::zeros({0}, at::kDouble))
        .requires_grad_();
  };
  bool ok = true;
  nn::AllGather row(px, GatherAxes().axes(std::vector<int>{1}));
  nn::AllGather keep(px, GatherAxes().axes_keep(std::vector<int>{0}));
  nn::AllGather all(px, GatherAxes().axes(std::vector<int>{0, 1}));
  nn::AllGather scaled(px, GatherAxes().axes(std::vector<int>{0, 1}).scale_backward({0, 1}));
  const auto x1 = input(), x2 = input(), x3 = input(), x4 = input();
  const auto y_row = row(x1), y_keep = keep(x2), y_all = all(x3), y_scaled = scaled(x4);
  const auto gy = px.active() ? at::ones({2, 2}, at::kDouble) : at::zeros({0}, at::kDouble);
  const auto gy_before = gy.clone();
  torch::autograd::backward({y_all, y_scaled}, {gy, gy});
  if (px.active()) {
    const auto want_row = torch::tensor({{10.0 * i, 10.0 * i + 1}}, at::kDouble);
    const auto want_all = torch::tensor({{0.0, 1.0}, {10.0, 11.0}}, at::kDouble);
    EXPECT_TRUE(at::equal(y_row, want_row)) << y_row;
    EXPECT_TRUE(at::equal(y_keep, want_row)) << y_keep;
    EXPECT_TRUE(at::equal(y_all, want_all)) << y_all;
    EXPECT_TRUE(at::equal(y_scaled, want_all)) << y_scaled;
    EXPECT_TRUE(at::equal(x3.grad(), at::full({1, 1}, 4.0, at::kDouble))) << x3.grad();
    EXPECT_TRUE(at::equal(x4.grad(), at::full({1, 1}, 1.0, at::kDouble))) << x4.grad();
    ok = at::equal(y_row, want_row) && at::equal(y_all, want_all) &&
         at::equal(x4.grad(), at::full({1, 1}, 1.0, at::kDouble));
  }
  EXPECT_TRUE(at::equal(gy, gy_before)) << "the caller's gradient was modified";

  nn::ReduceScatter scatter(px, GatherAxes().axes(std::vector<int>{0, 1}));
  const auto s = scatter(px.active() ? torch::tensor({{1.0, 2.0}, {3.0, 4.0}}, at::kDouble) * (me + 1)
                                     : at::zeros({0}, at::kDouble));
  if (px.active()) {
    const auto want = at::full({1, 1}, 10.0 * (2 * i + j + 1), at::kDouble);
    EXPECT_TRUE(at::equal(s, want)) << s;
    ok = ok && at::equal(s, want);
  }
  // Neither or both of the axes, a dimension out of range or twice,
  // scale_backward on a reduce-scatter: PartitionError on every rank.
  auto raises = [](auto make) {
    try {
      make();
    } catch (const PartitionError&) {
      return true;
    }
    return false;
  };
  EXPECT_TRUE(raises([&] { nn::AllGather(px, GatherAxes()); }));
  EXPECT_TRUE(raises([&] { nn::AllGather(px, GatherAxes().axes(std::vector<int>{0}).axes_keep(std::vector<int>{1})); }));
  EXPECT_TRUE(raises([&] { nn::AllGather(px, GatherAxes().axes(std::vector<int>{2})); }));
  EXPECT_TRUE(raises([&] { nn::AllGather(px, GatherAxes().axes(std::vector<int>{1, 1})); }));
  EXPECT_TRUE(raises([&] { nn::ReduceScatter(px, GatherAxes().axes(std::vector<int>{0}).scale_backward({0})); }));
  EXPECT_TRUE(agreed(ok));
}

}  // namespace
}  // namespace partita::spec

#include "partita/nn/repartition.hpp"

namespace partita::spec {
namespace {

class MpiRepartition : public ::testing::TestWithParam<RepartitionExample> {};

// Both exchanges (point-to-point and alltoallw) move the same pieces.
TEST_P(MpiRepartition, MovesTheGlobalTensor) {
  const auto& e = GetParam();
  if (mpi::world_size() < e.world)
    GTEST_SKIP() << "needs " << e.world << " ranks, running at " << mpi::world_size();
  torch::set_num_threads(1);
  const int me = mpi::world_rank();
  const auto px = cartesian(e.px_ranks, e.px_shape);
  const auto py = cartesian(e.py_ranks, e.py_shape);
  for (auto how : {nn::RepartitionExchange::kPointToPoint, nn::RepartitionExchange::kAlltoallw}) {
    nn::Transpose layer(px, py, how);  // the seeds' name for the same layer
    const at::Tensor x =
        (px.active() ? piece(e.global, e.px_boxes[px.rank()]) : at::zeros({0}, at::kDouble)).requires_grad_();
    const at::Tensor y = layer(x);
    bool ok = true;
    at::Tensor dy = at::zeros(y.sizes(), at::kDouble);
    if (py.active()) {
      ok = at::equal(y, piece(e.global, e.py_boxes[py.rank()]));
      EXPECT_TRUE(ok) << "worker " << me << "\n" << y;
      dy = piece(e.global, e.py_boxes[py.rank()], 2, 1);
    } else {
      ok = y.numel() == 0;
    }
    torch::autograd::backward({y}, {dy});
    if (px.active()) {
      const bool good = at::equal(x.grad(), piece(e.global, e.px_boxes[px.rank()], 2, 1));
      EXPECT_TRUE(good) << "gradient of worker " << me;
      ok = ok && good;
    }
    EXPECT_TRUE(agreed(ok)) << e.name << (how == nn::RepartitionExchange::kAlltoallw ? " (alltoallw)" : "");
  }
}

INSTANTIATE_TEST_SUITE_P(Issue4, MpiRepartition, ::testing::ValuesIn(repartition_examples()),
                         [](const auto& info) { return info.param.name; });

TEST(MpiRepartitionErrors, PiecesThatDoNotTile) {
  if (mpi::world_size() < 4) GTEST_SKIP() << "needs 4 ranks, running at " << mpi::world_size();
  const int me = mpi::world_rank();
  const auto px = cartesian({0, 1, 2, 3}, {2, 2});
  nn::Repartition layer(px, cartesian({0}, {1}));
  // Worker 1 is in worker 0's row slab but claims another height.
  expect_shape_error([&] { layer(px.active() ? at::ones({me == 1 ? 3 : 2, 2}) : at::zeros({0})); },
                     "do not tile", px.active());
}

}  // namespace
}  // namespace partita::spec

#include "partita/nn/halo_exchange.hpp"

namespace partita::spec {
namespace {

TEST(MpiHalo, TwoByTwoWithCornersFromTheDiagonal) {
  if (mpi::world_size() < 4) GTEST_SKIP() << "needs 4 ranks, running at " << mpi::world_size();
  torch::set_num_threads(1);
  const int me = mpi::world_rank();
  const auto px = cartesian({0, 1, 2, 3}, {2, 2});
  nn::HaloExchange halo(px, Shape{1, 1}, Shape{1, 1});
  const at::Tensor x = (px.active() ? halo_input(me) : at::zeros({0}, at::kDouble)).requires_grad_();
  const at::Tensor y = halo(x);
  torch::autograd::backward({y}, {at::ones_like(y)});
  bool ok = true;
  if (px.active()) {
    ok = at::equal(y, halo_output(me)) && at::equal(x.grad(), halo_input_grad(me));
    EXPECT_TRUE(ok) << "worker " << me << "\n" << y << "\n" << x.grad();
  } else {
    ok = y.numel() == 0;
  }
  EXPECT_TRUE(agreed(ok));
}

TEST(MpiHaloErrors, GhostWiderThanTheNeighboursBulk) {
  if (mpi::world_size() < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  const int me = mpi::world_rank();
  const auto px = cartesian({0, 1}, {2});
  nn::HaloExchange halo(px, Shape{2}, Shape{2});
  // Worker 0's bulk is 1 element: too narrow for worker 1's left ghost.
  expect_shape_error([&] { halo(px.active() ? at::ones({me == 0 ? 5 : 6}) : at::zeros({0})); },
                     "wider than slab 0's bulk of 1", px.active());
  // Windows that cannot hold their ghosts.
  expect_shape_error([&] { halo(px.active() ? at::ones({3}) : at::zeros({0})); },
                     "too small for ghosts", px.active());
}

TEST(MpiHaloErrors, WidthsMustAgree) {
  if (mpi::world_size() < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  const auto px = cartesian({0, 1}, {2});
  bool raised = false;
  try {
    nn::HaloExchange halo(px, Shape{mpi::world_rank() == 1 ? 2 : 1}, Shape{1});
  } catch (const PartitionError& e) {
    raised = std::string(e.what()).find("different ghost widths") != std::string::npos;
  }
  EXPECT_TRUE(agreed(raised || !px.active()));
}

// Issue 35 item 5: a message above MPI's count limit (INT_MAX elements)
// raises on every rank of the layer before anything is posted. The inputs
// are expanded (zero-stride) byte tensors: their headers ask for such
// counts and nothing of that size is allocated (the plan is made from the
// headers, before any copy).
//
// Workers 0, 1, 2 hold rows {0,1}, {2}, {3} of a 4 x N global tensor, N =
// 1.5e9 (one row fits in an int, two do not); P_y on world ranks [1, 2]
// wants rows 0-1 on rank 1 and rows 2-3 on rank 2. Rank 0 would send 2N
// elements to rank 1 (too many), rank 1 sends row 2 to rank 2 (fits), rank
// 2 keeps row 3: rank 2's own counts fit, and it must still raise instead
// of waiting for a message rank 1 never posts.
TEST(MpiLargeMessages, RepartitionRaisesOnEveryRankBeforePosting) {
  if (mpi::world_size() < 3) GTEST_SKIP() << "needs 3 ranks, running at " << mpi::world_size();
  const int me = mpi::world_rank();
  const int64_t N = 1500000000;
  const auto px = cartesian({0, 1, 2}, {3, 1});
  const auto py = cartesian({1, 2}, {2, 1});
  nn::Repartition layer(px, py);
  const at::Tensor x = px.active() ? at::zeros({1, 1}, at::kByte).expand({me == 0 ? 2 : 1, N})
                                   : at::zeros({0}, at::kByte);
  expect_shape_error([&] { layer(x); }, "above the MPI count limit", me < 3);
  // The same layer still works on a small tensor afterwards.
  const at::Tensor small = px.active() ? at::full({me == 0 ? 2 : 1, 3}, me, at::kDouble)
                                       : at::zeros({0}, at::kDouble);
  const at::Tensor y = layer(small);
  bool ok = true;
  if (me == 1) ok = at::equal(y, at::zeros({2, 3}, at::kDouble));
  if (me == 2) ok = at::equal(y, at::cat({at::full({1, 3}, 1.0, at::kDouble), at::full({1, 3}, 2.0, at::kDouble)}));
  EXPECT_TRUE(agreed(ok)) << "rank " << me << ": " << y;
}

// The halo exchange's ghost rows of 2^31 + 1 bytes: both neighbours raise
// before posting (and before the window is copied).
TEST(MpiLargeMessages, HaloRaisesOnEveryRankBeforePosting) {
  if (mpi::world_size() < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  const int64_t N = int64_t{INT_MAX} + 2;
  const auto px = cartesian({0, 1}, {2, 1});
  nn::HaloExchange halo(px, Shape{1, 0}, Shape{1, 0});
  const at::Tensor x = px.active() ? at::zeros({1, 1}, at::kByte).expand({3, N}) : at::zeros({0}, at::kByte);
  expect_shape_error([&] { halo(x); }, "above the MPI count limit", px.active());
}

}  // namespace
}  // namespace partita::spec

namespace partita::spec {
namespace {

// One layer object, called with other shapes: it re-plans each call (the
// global shape is discovered from the inputs every time), including the
// backward of each call.
TEST(MpiReplan, RepartitionAndHaloCalledWithOtherShapes) {
  if (mpi::world_size() < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  torch::set_num_threads(1);
  const int me = mpi::world_rank();
  const auto rows = cartesian({0, 1}, {2, 1}), cols = cartesian({0, 1}, {1, 2});
  nn::Repartition layer(rows, cols);
  bool ok = true;
  // (global shape, rows held by worker 0): balanced, then uneven, then the first again.
  const std::vector<std::pair<Shape, int64_t>> calls{{{4, 4}, 2}, {{4, 6}, 3}, {{4, 4}, 2}};
  for (const auto& [g, top] : calls) {
    const int64_t h = me == 0 ? top : g[0] - top, w = local_length(g[1], 2, me);
    const Box mine_in{{me == 0 ? 0 : top, 0}, {h, g[1]}};
    const Box mine_out{{0, local_start(g[1], 2, me)}, {g[0], w}};
    const at::Tensor x = rows.active() ? piece(g, mine_in).requires_grad_() : at::zeros({0}, at::kDouble).requires_grad_();
    const at::Tensor y = layer(x);
    if (cols.active()) {
      const bool good = at::equal(y, piece(g, mine_out));
      EXPECT_TRUE(good) << "global " << shape_string(g) << ", worker " << me << "\n" << y;
      ok = ok && good;
      torch::autograd::backward({y}, {piece(g, mine_out, 2, 1)});
      if (rows.active()) {
        const bool back = at::equal(x.grad(), piece(g, mine_in, 2, 1));
        EXPECT_TRUE(back) << "gradient, global " << shape_string(g) << ", worker " << me;
        ok = ok && back;
      }
    }
  }
  // The halo exchange re-plans too: widths 1 on 1-D windows of 4, then 6.
  nn::HaloExchange halo(cartesian({0, 1}, {2}), Shape{1}, Shape{1});
  for (int64_t n : {4, 6}) {
    at::Tensor x = at::full({n}, -1.0, at::kDouble);
    x.narrow(0, 1, n - 2).copy_(at::arange(n - 2, at::kDouble) + 100 * me);
    const at::Tensor y = halo(me < 2 ? x : at::zeros({0}, at::kDouble));
    if (me < 2) {
      // Worker 0's right ghost is worker 1's first bulk element (100),
      // worker 1's left ghost worker 0's last (n - 3).
      const double ghost = me == 0 ? 100 : static_cast<double>(n - 3);
      const int64_t at_ = me == 0 ? n - 1 : 0;
      const bool good = y[at_].item<double>() == ghost && y[me == 0 ? 0 : n - 1].item<double>() == -1;
      EXPECT_TRUE(good) << "window of " << n << ", worker " << me << "\n" << y;
      ok = ok && good;
    }
  }
  EXPECT_TRUE(agreed(ok));
}

}  // namespace
}  // namespace partita::spec

namespace partita::spec {
namespace {

// Seed 000's broadcast_data / allgather_data with tensors (issue 9 A3): the
// receivers learn the root's dtype and shape with the values, whatever they
// passed; allgather returns every rank's own dtype and shape in rank order;
// ranks outside the partition get nothing and do not communicate.
TEST(MpiData, TensorsCarryTheirDtypeAndShape) {
  const int n = mpi::world_size(), me = mpi::world_rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks, running at 1";
  const auto world = mpi::Partition::world();
  // Rank 1 holds a 2x3 float16 tensor; the others pass a float64 scalar.
  const at::Tensor sent = at::arange(6, at::kFloat).reshape({2, 3}).to(at::kHalf);
  const at::Tensor got = world.broadcast_data(me == 1 ? sent : at::zeros({}, at::kDouble), 1);
  ASSERT_TRUE(got.defined());
  EXPECT_EQ(got.scalar_type(), at::kHalf);
  EXPECT_EQ(got.sizes().vec(), (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(at::equal(got, sent)) << got;
  // A conjugate view and a negative view travel as their values, not as
  // the bits beneath their flags.
  const at::Tensor z = at::complex(at::ones({2}, at::kDouble), at::full({2}, 2.0, at::kDouble)).conj();
  const at::Tensor got_z = world.broadcast_data(z, 1);
  EXPECT_TRUE(at::equal(at::imag(got_z.resolve_conj()), at::full({2}, -2.0, at::kDouble))) << got_z;
  const at::Tensor minus = at::_neg_view(at::full({3}, 5.0, at::kDouble));
  EXPECT_TRUE(at::equal(world.broadcast_data(minus, 1), at::full({3}, -5.0, at::kDouble)));

  // Rank r contributes r + 1 int64 values [r, r + 1, ...] (rank 0: int8).
  const auto dtype_of = [](int r) { return r == 0 ? at::kChar : at::kLong; };
  const auto gathered =
      world.allgather_data(at::arange(me, 2 * me + 1, at::TensorOptions().dtype(dtype_of(me))));
  ASSERT_EQ(static_cast<int>(gathered.size()), n);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(gathered[r].scalar_type(), dtype_of(r)) << "rank " << r;
    EXPECT_EQ(gathered[r].sizes().vec(), (std::vector<int64_t>{r + 1})) << "rank " << r;
    EXPECT_TRUE(at::equal(gathered[r], at::arange(r, 2 * r + 1, at::TensorOptions().dtype(dtype_of(r)))))
        << "rank " << r;
  }

  // A sub-partition {0, 1}: rank 1 of it roots a broadcast over the world
  // (the second mode); inside {0, 1} only, rank 2 and up are inactive.
  const auto pair = world.create_partition_inclusive({0, 1});
  const at::Tensor root_value = at::full({1}, 7, at::kInt);
  const at::Tensor second = world.broadcast_data(me == 1 ? root_value : at::Tensor(), 1, pair);
  EXPECT_TRUE(at::equal(second, root_value)) << second;
  const at::Tensor inside = pair.broadcast_data(me == 0 ? root_value : at::Tensor(), 0);
  if (me < 2) EXPECT_TRUE(at::equal(inside, root_value));
  else EXPECT_FALSE(inside.defined());
  // A root outside the partition: an error on every member.
  EXPECT_THROW(world.broadcast_data(sent, n), PartitionError);
  // A payload above MPI's count limit on one rank: every rank raises, none
  // waits for it (the lengths are gathered first).
  std::string too_large;
  try {
    (void)world.allgather_data(me == 1 ? mpi::Bytes(size_t{INT_MAX} + 1, 'x') : mpi::Bytes("x"));
  } catch (const Error& e) {
    too_large = e.what();
  }
  EXPECT_NE(too_large.find("allgather_data: rank 1's payload is larger than INT_MAX bytes"), std::string::npos)
      << "rank " << me << ": " << too_large;
}

// partita::mpi::Environment turns the buffer cache on (docs/mpi-runtime.md)
// unless PARTITA_BUFFER_CACHE_MIB says otherwise, and a large output of a
// layer called twice comes back in the block the first call's output left.
TEST(MpiRuntime, BufferCacheOnByDefault) {
  if (std::getenv("PARTITA_BUFFER_CACHE_MIB")) GTEST_SKIP() << "PARTITA_BUFFER_CACHE_MIB is set";
  const auto s = mpi::buffer_cache_stats();
  EXPECT_TRUE(agreed(s.enabled && s.capacity_bytes == (mpi::kDefaultBufferCacheMiB << 20) &&
                     s.min_bytes == (size_t{1} << 20)));
  const auto world = mpi::Partition::world();
  nn::AllSumReduce layer(world.create_cartesian_topology_partition({world.size()}), std::vector<int>{0});
  const at::Tensor x = at::ones({1 << 20}, at::kFloat);  // 4 MiB
  void* first = nullptr;
  { first = layer(x).data_ptr(); }
  const long hits = mpi::buffer_cache_stats().hits;
  at::Tensor y = layer(x);
  EXPECT_TRUE(agreed(y.data_ptr() == first && mpi::buffer_cache_stats().hits > hits));
  EXPECT_TRUE(agreed(y.eq(float(world.size())).all().item<bool>()));
}

}  // namespace
}  // namespace partita::spec
