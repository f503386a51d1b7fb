// Seed 000 and 001, word for word, against the reference (one process).
#include <gtest/gtest.h>

#include "partita/errors.hpp"
#include "partita/reference/partition.hpp"
#include "seed_tables.hpp"

namespace partita::spec {
namespace {

using reference::Partition;

Partition cartesian(int world, const Ranks& ranks, const Shape& shape) {
  return Partition::world(world).create_partition_inclusive(ranks)
      .create_cartesian_topology_partition(shape);
}

std::string label(int l) { return l < 0 ? "n/a" : "P_" + std::to_string(l); }

void expect_table(const SeedTable& t, const reference::SendRecv& sr) {
  ASSERT_EQ(sr.parts.size(), t.partitions.size());
  for (size_t l = 0; l < t.partitions.size(); ++l) {
    EXPECT_EQ(label(static_cast<int>(l)), t.partitions[l].label);
    EXPECT_EQ(sr.parts[l].workers(), t.partitions[l].workers) << t.partitions[l].label;
  }
  for (const auto& w : t.workers) {
    EXPECT_EQ(label(sr.send_label[w.worker]), w.send) << "P_send of worker " << w.worker;
    EXPECT_EQ(label(sr.recv_label[w.worker]), w.recv) << "P_recv of worker " << w.worker;
  }
}

TEST(SeedBroadcastTable, ReferenceMatchesSeed) {
  const auto& t = kBroadcastTable;
  const auto px = cartesian(12, t.px_ranks, t.px_shape);
  const auto py = cartesian(12, t.py_ranks, t.py_shape);
  expect_table(t, px.create_broadcast_partition_to(py));
  // The root is the worker that has the data, not the lowest rank.
  EXPECT_EQ(px.create_broadcast_partition_to(py).send(1).rank(1), 0);
  EXPECT_EQ(px.create_broadcast_partition_to(py).recv(0).rank(1), 0);
}

TEST(SeedSumReduceTable, ReferenceMatchesSeed) {
  const auto& t = kSumReduceTable;
  const auto px = cartesian(12, t.px_ranks, t.px_shape);
  const auto py = cartesian(12, t.py_ranks, t.py_shape);
  expect_table(t, px.create_reduction_partition_to(py));
}

// Issue 9: DistDL's pairing of transposed partitions, teams by hand.
class TransposedPairingSpec : public ::testing::TestWithParam<TransposedPairing> {};

Ranks span(int first, int n) {
  Ranks r;
  for (int i = 0; i < n; ++i) r.push_back(first + i);
  return r;
}

TEST_P(TransposedPairingSpec, ReferenceMatchesHandWrittenTeams) {
  const auto& t = GetParam();
  const int world = t.big_first + 12;
  // The 2x2x1 side is on workers 0-3, the 3x2x2 side from big_first.
  const Ranks xr = t.broadcast ? span(0, 4) : span(t.big_first, 12);
  const Ranks yr = t.broadcast ? span(t.big_first, 12) : span(0, 4);
  const auto px = cartesian(world, xr, t.px), py = cartesian(world, yr, t.py);
  const auto sr = t.broadcast ? px.create_broadcast_partition_to(py, t.transpose_src, t.transpose_dest)
                              : px.create_reduction_partition_to(py, t.transpose_src, t.transpose_dest);
  ASSERT_EQ(sr.parts.size(), t.teams.size());
  for (size_t l = 0; l < t.teams.size(); ++l)
    EXPECT_EQ(sr.parts[l].workers(), t.teams[l]) << "team " << l;
}

INSTANTIATE_TEST_SUITE_P(Issue9, TransposedPairingSpec, ::testing::ValuesIn(kTransposedPairings),
                         [](const auto& info) { return info.param.name; });

TEST(SeedAllSumReducePartitions, ReferenceMatchesSeed) {
  const auto px = Partition::world(12).create_cartesian_topology_partition(kAllReduceShape);
  const auto fam = px.create_allreduction_partition(kAllReduceAxes);
  ASSERT_EQ(fam.parts.size(), kAllReducePartitions.size());
  for (size_t l = 0; l < fam.parts.size(); ++l)
    EXPECT_EQ(fam.parts[l].workers(), kAllReducePartitions[l].workers);
  // "Each worker in P_x is a member of exactly one of these sub-partitions."
  for (int w = 0; w < 12; ++w) {
    int memberships = 0;
    for (const auto& p : fam.parts) memberships += p.active(w);
    EXPECT_EQ(memberships, 1) << "worker " << w;
  }
  // All dimensions: one partition with everyone; none: one per worker.
  EXPECT_EQ(px.create_allreduction_partition({0, 1, 2}).parts.size(), 1u);
  EXPECT_EQ(px.create_allreduction_partition({}).parts.size(), 12u);
}

class SeedReductionExample : public ::testing::TestWithParam<ReductionExample> {};

TEST_P(SeedReductionExample, ReferenceFollowsTheRules) {
  const auto& ex = GetParam();
  const int nx = static_cast<int>(volume(ex.px)), ny = static_cast<int>(volume(ex.py));
  const int world = std::max(nx, ny);
  Ranks xr, yr;
  for (int i = 0; i < nx; ++i) xr.push_back(i);
  for (int i = 0; i < ny; ++i) yr.push_back(i);
  const auto px = cartesian(world, xr, ex.px), py = cartesian(world, yr, ex.py);
  if (!ex.reduces) {
    EXPECT_THROW(px.create_reduction_partition_to(py, ex.transpose_src, ex.transpose_dest),
                 PartitionError);
    // The broadcast is the mirror: P_y -> P_x must fail the same way.
    EXPECT_THROW(py.create_broadcast_partition_to(px, ex.transpose_dest, ex.transpose_src),
                 PartitionError);
    return;
  }
  const auto sr = px.create_reduction_partition_to(py, ex.transpose_src, ex.transpose_dest);
  ASSERT_EQ(static_cast<int>(sr.parts.size()), ny);
  for (int r = 0; r < nx; ++r) {
    const int target = expected_reduction_target(ex, px.cartesian_index(r));
    const int w = px.workers()[r];
    // The worker sums into the team whose root is P_y worker `target`.
    ASSERT_GE(sr.send_label[w], 0) << "P_x rank " << r;
    EXPECT_EQ(sr.parts[sr.send_label[w]].workers()[0], py.workers()[target])
        << "P_x rank " << r;
  }
  for (int r = 0; r < ny; ++r) EXPECT_EQ(sr.recv_label[py.workers()[r]], r);
  // Every team has its root plus |P_x|/|P_y| contributors (the root may be one).
  for (const auto& team : sr.parts) {
    int contributors = 0;
    for (int w : team.workers()) contributors += sr.send_label[w] >= 0 &&
        sr.parts[sr.send_label[w]] == team;
    EXPECT_EQ(contributors, nx / ny);
  }
  // The mirrored broadcast pairs the same workers.
  const auto bc = py.create_broadcast_partition_to(px, ex.transpose_dest, ex.transpose_src);
  for (size_t l = 0; l < sr.parts.size(); ++l) EXPECT_EQ(bc.parts[l], sr.parts[l]);
}

INSTANTIATE_TEST_SUITE_P(Seed001, SeedReductionExample, ::testing::ValuesIn(kReductionExamples),
                         [](const auto& info) { return info.param.name; });

TEST(ReferencePartition, CartesianIndexAndNeighbours) {
  const auto p = Partition::world(12).create_cartesian_topology_partition({2, 3, 2});
  EXPECT_EQ(p.cartesian_index(0), (Index{0, 0, 0}));
  EXPECT_EQ(p.cartesian_index(7), (Index{1, 0, 1}));  // 1*6 + 0*2 + 1
  EXPECT_EQ(p.cartesian_index(11), (Index{1, 2, 1}));
  const auto n = p.neighbor_ranks(8);  // index (1,1,0)
  EXPECT_EQ(n[0], std::make_pair(2, -1));
  EXPECT_EQ(n[1], std::make_pair(6, 10));
  EXPECT_EQ(n[2], std::make_pair(-1, 9));
  EXPECT_THROW(p.cartesian_index(12), PartitionError);
}

// Seed 000: a partition without topology answers as a 1-D Cartesian one.
TEST(ReferencePartition, UnstructuredAnswersAsOneDimensional) {
  const auto a = Partition::world(6).create_partition_inclusive({4, 1, 2});
  EXPECT_FALSE(a.cartesian());
  EXPECT_EQ(a.shape(), (Shape{3}));
  EXPECT_EQ(a.index(1), (Index{1}));
  EXPECT_EQ(a.index(0), (Index{-1}));
  EXPECT_EQ(a.cartesian_index(2), (Index{2}));
  EXPECT_EQ(a.neighbor_ranks(0), (std::vector<std::pair<int, int>>{{-1, 1}}));
  EXPECT_EQ(a.neighbor_ranks(1), (std::vector<std::pair<int, int>>{{0, 2}}));
  EXPECT_EQ(a.neighbor_ranks(2), (std::vector<std::pair<int, int>>{{1, -1}}));
  const auto whole = a.create_cartesian_subtopology_partition({true});
  ASSERT_EQ(whole.parts.size(), 1u);
  EXPECT_EQ(whole.parts[0].workers(), (Ranks{4, 1, 2}));
  EXPECT_EQ(whole.parts[0].shape(), (Shape{3}));
  EXPECT_TRUE(whole.parts[0].cartesian());
  const auto alone = a.create_cartesian_subtopology_partition({false});
  ASSERT_EQ(alone.parts.size(), 3u);
  EXPECT_EQ(alone.of(1).workers(), (Ranks{1}));
  EXPECT_EQ(alone.of(1).shape(), (Shape{1}));
  try {
    a.create_cartesian_subtopology_partition({true, false});
    ADD_FAILURE() << "two flags for a 1-D partition";
  } catch (const PartitionError& e) {
    EXPECT_EQ(e.rule(), rule_code::kAxisRange);
  }
}

// A Cartesian shape fits its team only with every extent at least 1 and
// as many cells as workers: negative extents whose product is the size,
// and extents whose product passes 2^64 and wraps to it, are refused.
TEST(ReferencePartition, CartesianShapesThatOnlySeemToFitAreRefused) {
  for (int n : {1, 2, 4, 12}) {
    std::vector<Shape> wrong = shapes_that_wrap_to(n);
    EXPECT_EQ(wrong.size(), 2u) << "no pair of extents wraps to " << n;
    wrong.push_back({0, n});
    wrong.push_back({});
    for (const Shape& shape : wrong) {
      bool threw = false;
      try {
        Partition::world(n).create_cartesian_topology_partition(shape);
      } catch (const PartitionError& e) {
        threw = e.rule() == rule_code::kShapeVolume;
      }
      EXPECT_TRUE(threw) << n << " workers took " << shape_string(shape);
    }
    EXPECT_EQ(Partition::world(n).create_cartesian_topology_partition({1, n}).size(), n);
  }
}

TEST(ReferencePartition, UnionInclusiveAndEquality) {
  const auto w = Partition::world(6);
  const auto a = w.create_partition_inclusive({4, 1, 2});
  const auto b = w.create_partition_inclusive({2, 5, 0});
  EXPECT_EQ(a.create_partition_union(b).workers(), (Ranks{4, 1, 2, 5, 0}));
  EXPECT_EQ(b.create_partition_union(a).workers(), (Ranks{2, 5, 0, 4, 1}));
  EXPECT_EQ(a.rank(1), 1);
  EXPECT_EQ(a.rank(0), -1);
  EXPECT_FALSE(a.active(0));
  EXPECT_EQ(a.index(0), (Index{-1}));
  EXPECT_EQ(a.shape(), (Shape{3}));
  EXPECT_TRUE(a == w.create_partition_inclusive({4, 1, 2}));
  EXPECT_FALSE(a == w.create_partition_inclusive({1, 2, 4}));  // same team, other order
  EXPECT_FALSE(a == a.create_cartesian_topology_partition({3}));  // structure differs
  EXPECT_THROW(w.create_partition_inclusive({1, 1}), PartitionError);
  EXPECT_THROW(w.create_partition_inclusive({6}), PartitionError);
  EXPECT_THROW(w.create_cartesian_topology_partition({4, 2}), PartitionError);
}

TEST(ReferencePartition, BroadcastAndAllgatherData) {
  const auto w = Partition::world(5);
  const auto p = w.create_partition_inclusive({3, 0, 4});
  std::map<int, reference::Bytes> data{{3, "a"}, {0, "bb"}, {4, ""}};
  const auto b = p.broadcast_data(data, 1);
  ASSERT_EQ(b.size(), 3u);
  for (const auto& [worker, bytes] : b) EXPECT_EQ(bytes, "bb") << worker;
  // Second mode: the root is rank 0 of a sub-partition (worker 4).
  const auto sub = p.create_partition_inclusive({2});
  EXPECT_EQ(p.broadcast_data(data, 0, sub).at(3), "");
  EXPECT_THROW(p.broadcast_data(data, 0, w.create_partition_inclusive({1})), PartitionError);
  const auto g = p.allgather_data(data);
  EXPECT_EQ(g.at(0), (std::vector<reference::Bytes>{"a", "bb", ""}));
}

TEST(Decomposition, BalancedSplitFromDesign) {
  // 10 over 4: lengths 3,3,2,2 starting at 0,3,6,8.
  const int64_t len[] = {3, 3, 2, 2}, start[] = {0, 3, 6, 8};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(local_length(10, 4, i), len[i]);
    EXPECT_EQ(local_start(10, 4, i), start[i]);
  }
  EXPECT_EQ(local_length(2, 4, 3), 0);
  EXPECT_EQ(ravel({1, 0, 1}, {2, 3, 2}), 7);
  EXPECT_EQ(unravel(7, {2, 3, 2}), (Index{1, 0, 1}));
}

}  // namespace
}  // namespace partita::spec
