// The seeds' examples with data, against the reference (one process).
#include <gtest/gtest.h>

#include "data_spec.hpp"
#include "partita/reference/all_sum_reduce.hpp"
#include "partita/reference/broadcast.hpp"
#include "partita/reference/sum_reduce.hpp"

namespace partita::spec {
namespace {

class ReferenceData : public ::testing::TestWithParam<DataExample> {};

TEST_P(ReferenceData, ForwardAndAdjointMatchTheSeed) {
  const DataExample& e = GetParam();
  const auto world = reference::Partition::world(e.world);
  const auto px = world.create_partition_inclusive(e.px_ranks).create_cartesian_topology_partition(e.px_shape);
  reference::Tensors x(e.world);
  for (int w = 0; w < e.world; ++w)
    x[w] = (px.active(w) ? arange_input(w, e.local_shape) : at::zeros({0}, at::kDouble)).requires_grad_();
  const auto o = Options().transpose_src(e.transpose_src).transpose_dest(e.transpose_dest).preserve_batch(e.preserve_batch);
  reference::Tensors y;
  if (e.primitive == "all_sum_reduce") {
    y = reference::all_sum_reduce(px, e.axes, x);
  } else {
    const auto py = world.create_partition_inclusive(e.py_ranks).create_cartesian_topology_partition(e.py_shape);
    y = e.primitive == "broadcast" ? reference::broadcast(px, py, x, o) : reference::sum_reduce(px, py, x, o);
  }
  at::Tensor total = at::zeros({}, at::kDouble);
  for (int w = 0; w < e.world; ++w) {
    if (e.y[w].defined()) {
      EXPECT_TRUE(at::equal(y[w], e.y[w])) << "worker " << w << "\n" << y[w] << "\nexpected\n" << e.y[w];
    } else {
      EXPECT_EQ(y[w].numel(), 0) << "worker " << w;
    }
    total = total + (y[w] * arange_cotangent(w, Shape(y[w].sizes().begin(), y[w].sizes().end()))).sum();
  }
  total.backward();
  for (int w = 0; w < e.world; ++w) {
    const at::Tensor g = x[w].grad().defined() ? x[w].grad() : at::zeros_like(x[w]);
    if (e.dx[w].defined()) EXPECT_TRUE(at::equal(g, e.dx[w])) << "gradient of worker " << w;
    else EXPECT_EQ(g.count_nonzero().item<int64_t>(), 0) << "gradient of worker " << w;
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, ReferenceData, ::testing::ValuesIn(data_examples()),
                         [](const auto& info) { return test_name(info.param); });

}  // namespace
}  // namespace partita::spec

#include "partita/reference/all_gather.hpp"
#include "partita/reference/reduce_scatter.hpp"

namespace partita::spec {
namespace {

TEST(ReferenceGather, AllGatherAndReduceScatterOn2x2) {
  const auto px = reference::Partition::world(4).create_cartesian_topology_partition({2, 2});
  reference::Tensors xg(4), xs(4);
  for (int w = 0; w < 4; ++w) {
    xg[w] = arange_input(w, {2, 3});
    xs[w] = arange_input(w, {5, 2});
  }
  const auto g = reference::all_gather(px, 1, 0, xg);
  const auto s = reference::reduce_scatter(px, 1, 0, xs);
  for (int w = 0; w < 4; ++w) {
    EXPECT_TRUE(at::equal(g[w], expected_all_gather(w))) << "worker " << w << "\n" << g[w];
    EXPECT_TRUE(at::equal(s[w], expected_reduce_scatter(w))) << "worker " << w << "\n" << s[w];
  }
}

}  // namespace
}  // namespace partita::spec

#include "partita/reference/repartition.hpp"

namespace partita::spec {
namespace {

class ReferenceRepartition : public ::testing::TestWithParam<RepartitionExample> {};

// Forward: P_y's pieces of G. Backward of the cotangent 2G+1 cut by P_y:
// P_x's pieces of 2G+1 (the reverse repartition).
TEST_P(ReferenceRepartition, MovesTheGlobalTensor) {
  const auto& e = GetParam();
  const auto world = reference::Partition::world(e.world);
  const auto px = world.create_partition_inclusive(e.px_ranks).create_cartesian_topology_partition(e.px_shape);
  const auto py = world.create_partition_inclusive(e.py_ranks).create_cartesian_topology_partition(e.py_shape);
  reference::Tensors x(e.world);
  for (int w = 0; w < e.world; ++w) x[w] = at::zeros({0}, at::kDouble);
  for (size_t r = 0; r < e.px_ranks.size(); ++r) x[e.px_ranks[r]] = piece(e.global, e.px_boxes[r]);
  for (auto& t : x) t.requires_grad_();
  const auto y = reference::repartition(px, py, x);
  at::Tensor total = at::zeros({}, at::kDouble);
  for (size_t r = 0; r < e.py_ranks.size(); ++r) {
    const int w = e.py_ranks[r];
    EXPECT_TRUE(at::equal(y[w], piece(e.global, e.py_boxes[r]))) << "worker " << w << "\n" << y[w];
    total = total + (y[w] * piece(e.global, e.py_boxes[r], 2, 1)).sum();
  }
  total.backward();
  for (size_t r = 0; r < e.px_ranks.size(); ++r) {
    const int w = e.px_ranks[r];
    EXPECT_TRUE(at::equal(x[w].grad(), piece(e.global, e.px_boxes[r], 2, 1))) << "gradient of " << w;
  }
}

INSTANTIATE_TEST_SUITE_P(Issue4, ReferenceRepartition, ::testing::ValuesIn(repartition_examples()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace partita::spec

#include "partita/errors.hpp"
#include "partita/reference/halo_exchange.hpp"

namespace partita::spec {
namespace {

TEST(ReferenceHalo, TwoByTwoWithCornersFromTheDiagonal) {
  const auto px = reference::Partition::world(4).create_cartesian_topology_partition({2, 2});
  reference::Tensors x(4);
  for (int w = 0; w < 4; ++w) x[w] = halo_input(w).requires_grad_();
  const auto y = reference::halo_exchange(px, {1, 1}, {1, 1}, x);
  at::Tensor total = at::zeros({}, at::kDouble);
  for (int w = 0; w < 4; ++w) {
    EXPECT_TRUE(at::equal(y[w], halo_output(w))) << "worker " << w << "\n" << y[w];
    total = total + y[w].sum();
  }
  total.backward();
  for (int w = 0; w < 4; ++w)
    EXPECT_TRUE(at::equal(x[w].grad(), halo_input_grad(w))) << "gradient of " << w << "\n" << x[w].grad();
}

TEST(ReferenceHalo, GhostWiderThanTheNeighboursBulkIsAnError) {
  const auto px = reference::Partition::world(2).create_cartesian_topology_partition({2});
  EXPECT_THROW(reference::halo_exchange(px, {2}, {2}, {at::ones({5}), at::ones({6})}), ShapeError);
  EXPECT_NO_THROW(reference::halo_exchange(px, {1}, {1}, {at::ones({3}), at::ones({3})}));
}

}  // namespace
}  // namespace partita::spec
