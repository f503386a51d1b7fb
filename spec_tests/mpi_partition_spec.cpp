// Seed 000 and 001, word for word, against the MPI partitions. Run at 12
// ranks (the seed's tables); each rank checks its own view and the verdict
// is agreed by all ranks before gtest sees it.
#include <gtest/gtest.h>

#include <algorithm>

#include "partita/errors.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "seed_tables.hpp"

namespace partita::spec {
namespace {

using mpi::Partition;

bool agreed(bool local) { return mpi::all_true(local, mpi::world_comm()); }

#define SKIP_UNLESS_RANKS(n)                                                       \
  if (mpi::world_size() < (n))                                                     \
  GTEST_SKIP() << "needs " << (n) << " ranks, running at " << mpi::world_size()

mpi::CartesianPartition cartesian(const Ranks& ranks, const Shape& shape) {
  return Partition::world().create_partition_inclusive(ranks)
      .create_cartesian_topology_partition(shape);
}

// The seed label of a partition whose workers (root first) are `workers`.
std::string label_of(const Partition& p, const std::vector<SeedPartition>& parts) {
  if (p.is_null()) return "n/a";
  for (const auto& s : parts)
    if (s.workers == p.workers()) return s.label;
  return "unknown [" + list_string(p.workers()) + "]";
}

void check_table(const SeedTable& t, bool broadcast) {
  const auto px = cartesian(t.px_ranks, t.px_shape);
  const auto py = cartesian(t.py_ranks, t.py_shape);
  const auto [send, recv] = broadcast ? px.create_broadcast_partition_to(py)
                                      : px.create_reduction_partition_to(py);
  const int me = mpi::world_rank();
  bool ok = true;
  for (const auto& w : t.workers) {
    if (w.worker != me) continue;
    const std::string s = label_of(send, t.partitions), r = label_of(recv, t.partitions);
    EXPECT_EQ(s, w.send) << "P_send of worker " << me;
    EXPECT_EQ(r, w.recv) << "P_recv of worker " << me;
    ok = ok && s == w.send && r == w.recv;
    // Roots are rank 0 of their partition; the root is the one with the data
    // (broadcast) or the destination (sum-reduce).
    if (broadcast && send.active()) ok = ok && send.rank() == 0;
    if (!broadcast && recv.active()) ok = ok && recv.rank() == 0;
    // A working communicator of the right size.
    for (const auto* p : {&send, &recv}) {
      if (!p->active()) continue;
      int n = 0;
      MPI_Comm_size(p->comm(), &n);
      ok = ok && n == p->size();
    }
  }
  EXPECT_TRUE(agreed(ok)) << t.name;
}

TEST(SeedBroadcastTable, MpiMatchesSeed) {
  SKIP_UNLESS_RANKS(12);
  check_table(kBroadcastTable, true);
}

TEST(SeedSumReduceTable, MpiMatchesSeed) {
  SKIP_UNLESS_RANKS(12);
  check_table(kSumReduceTable, false);
}

TEST(SeedAllSumReducePartitions, MpiMatchesSeed) {
  SKIP_UNLESS_RANKS(12);
  Ranks all;
  for (int i = 0; i < 12; ++i) all.push_back(i);
  const auto px = cartesian(all, kAllReduceShape);
  const auto p = px.create_allreduction_partition(kAllReduceAxes);
  bool ok = true;
  if (px.active()) {
    int found = 0;
    for (const auto& s : kAllReducePartitions) {
      const bool member = std::find(s.workers.begin(), s.workers.end(), mpi::world_rank()) !=
                          s.workers.end();
      if (member) {
        ++found;
        EXPECT_EQ(p.workers(), s.workers) << "worker " << mpi::world_rank();
        ok = ok && p.workers() == s.workers && p.active();
      }
    }
    ok = ok && found == 1;
  }
  EXPECT_TRUE(agreed(ok));
}

class SeedReductionExample : public ::testing::TestWithParam<ReductionExample> {};

TEST_P(SeedReductionExample, MpiFollowsTheRules) {
  const auto& ex = GetParam();
  const int nx = static_cast<int>(volume(ex.px)), ny = static_cast<int>(volume(ex.py));
  SKIP_UNLESS_RANKS(std::max(nx, ny));
  Ranks xr, yr;
  for (int i = 0; i < nx; ++i) xr.push_back(i);
  for (int i = 0; i < ny; ++i) yr.push_back(i);
  const auto px = cartesian(xr, ex.px), py = cartesian(yr, ex.py);
  if (!ex.reduces) {
    // Every rank throws, none hangs, and the world is still usable after.
    bool threw = false;
    try {
      px.create_reduction_partition_to(py, ex.transpose_src, ex.transpose_dest);
    } catch (const PartitionError& e) {
      threw = std::string(e.what()).find("reduction rules") != std::string::npos;
    }
    EXPECT_TRUE(agreed(threw));
    return;
  }
  const auto [send, recv] =
      px.create_reduction_partition_to(py, ex.transpose_src, ex.transpose_dest);
  bool ok = true;
  if (px.active()) {
    const int target = expected_reduction_target(ex, px.index());
    ok = ok && send.active() && send.workers()[0] == py.workers()[target];
    EXPECT_TRUE(ok) << "P_x rank " << px.rank() << " sums into the team of ["
                    << list_string(send.workers()) << "], expected root "
                    << py.workers()[target];
  } else {
    ok = ok && send.is_null();
  }
  if (py.active()) ok = ok && recv.active() && recv.rank() == 0;
  EXPECT_TRUE(agreed(ok)) << ex.name;
}

INSTANTIATE_TEST_SUITE_P(Seed001, SeedReductionExample, ::testing::ValuesIn(kReductionExamples),
                         [](const auto& info) { return info.param.name; });

// Issue 9: DistDL's pairing of transposed partitions, teams by hand (12
// workers overlapping, 16 disjoint; fewer ranks SKIP).
class TransposedPairingSpec : public ::testing::TestWithParam<TransposedPairing> {};

Ranks span(int first, int n) {
  Ranks r;
  for (int i = 0; i < n; ++i) r.push_back(first + i);
  return r;
}

TEST_P(TransposedPairingSpec, MpiMatchesHandWrittenTeams) {
  const auto& t = GetParam();
  SKIP_UNLESS_RANKS(t.big_first + 12);
  const Ranks xr = t.broadcast ? span(0, 4) : span(t.big_first, 12);
  const Ranks yr = t.broadcast ? span(t.big_first, 12) : span(0, 4);
  const auto px = cartesian(xr, t.px), py = cartesian(yr, t.py);
  const auto [send, recv] =
      t.broadcast ? px.create_broadcast_partition_to(py, t.transpose_src, t.transpose_dest)
                  : px.create_reduction_partition_to(py, t.transpose_src, t.transpose_dest);
  // This rank's expected teams: the one it roots (it is on the 2x2x1 side)
  // and the one it is paired in (it is on the 3x2x2 side; with 12 workers
  // the roots are paired in their own team).
  const int me = mpi::world_rank();
  const Ranks& big = t.broadcast ? yr : xr;
  const bool in_big = std::find(big.begin(), big.end(), me) != big.end();
  Ranks rooted, member;
  for (const auto& team : t.teams) {
    if (team[0] == me) rooted = team;
    if (in_big && std::find(team.begin(), team.end(), me) != team.end()) member = team;
  }
  // Broadcast: the root sends; sum-reduce: the root receives.
  const auto& as_root = t.broadcast ? send : recv;
  const auto& as_member = t.broadcast ? recv : send;
  const Ranks got_root = as_root.is_null() ? Ranks{} : as_root.workers();
  const Ranks got_member = as_member.is_null() ? Ranks{} : as_member.workers();
  EXPECT_EQ(got_root, rooted) << "worker " << me << " as root";
  EXPECT_EQ(got_member, member) << "worker " << me << " as paired worker";
  EXPECT_TRUE(agreed(got_root == rooted && got_member == member)) << t.name;
}

INSTANTIATE_TEST_SUITE_P(Issue9, TransposedPairingSpec, ::testing::ValuesIn(kTransposedPairings),
                         [](const auto& info) { return info.param.name; });

TEST(MpiPartition, BadArgumentsThrowOnEveryRank) {
  // A shape that does not fit: local check, every rank throws.
  // Each error names its rule (issue 9), the same on every rank.
  bool threw = false;
  try {
    Partition::world().create_cartesian_topology_partition({mpi::world_size() + 1});
  } catch (const PartitionError& e) {
    threw = e.rule() == rule_code::kShapeVolume;
  }
  EXPECT_TRUE(agreed(threw));
  // Negative extents whose product is the size, and extents whose product
  // passes 2^64 and wraps to it: refused, not read out of bounds later.
  const int64_t n = mpi::world_size();
  const std::vector<Shape> wrong = shapes_that_wrap_to(n);
  EXPECT_EQ(wrong.size(), 2u) << "no pair of extents wraps to " << n;
  for (const Shape& shape : wrong) {
    threw = false;
    try {
      Partition::world().create_cartesian_topology_partition(shape);
    } catch (const PartitionError& e) {
      threw = e.rule() == rule_code::kShapeVolume;
    }
    EXPECT_TRUE(agreed(threw)) << shape_string(shape);
  }
  // Ranks passing different arguments to a collective: every rank throws.
  if (mpi::world_size() >= 2) {
    threw = false;
    try {
      Partition::world().create_partition_inclusive({mpi::world_rank() == 0 ? 0 : 1});
    } catch (const PartitionError& e) {
      threw = std::string(e.what()).find("different arguments") != std::string::npos &&
              e.rule() == rule_code::kArgumentsDiffer;
    }
    EXPECT_TRUE(agreed(threw));
  }
  // A rule broken on every rank: its code travels through the agreement.
  threw = false;
  try {
    cartesian({0}, {1, 1}).create_broadcast_partition_to(Partition::world(), false, false);
  } catch (const PartitionError& e) {
    threw = e.rule() == rule_code::kBroadcastDims;
  }
  EXPECT_TRUE(agreed(threw));
  // The world communicator still works afterwards.
  EXPECT_TRUE(agreed(true));
}

// Seed 000: a partition without topology is treated as a 1-D Cartesian
// one (shape {size}, index {rank}); partita answers every Cartesian query
// for it that way. Any world size.
TEST(MpiPartition, UnstructuredAnswersAsOneDimensional) {
  const int n = mpi::world_size(), me = mpi::world_rank();
  Ranks reversed;
  for (int r = n - 1; r >= 0; --r) reversed.push_back(r);
  const Partition p = Partition::world().create_partition_inclusive(reversed);
  const int mine = n - 1 - me;  // this worker's rank in p
  bool ok = !p.cartesian() && p.shape() == Shape{n} && p.rank() == mine && p.index() == Index{mine};
  for (int r = 0; r < n; ++r) {
    ok = ok && p.cartesian_index(r) == Index{r};
    const auto nb = p.neighbor_ranks(r);
    ok = ok && nb.size() == 1 && nb[0] == std::make_pair(r > 0 ? r - 1 : -1, r + 1 < n ? r + 1 : -1);
  }
  const auto whole = p.create_cartesian_subtopology_partition({true});
  ok = ok && whole.cartesian() && whole.workers() == reversed && whole.shape() == Shape{n} &&
       whole.index() == Index{mine};
  const auto alone = p.create_cartesian_subtopology_partition({false});
  ok = ok && alone.workers() == Ranks{me} && alone.shape() == Shape{1} && alone.rank() == 0;
  // A worker outside: index {-1}, no sub-topology, no communication.
  const Partition first = Partition::world().create_partition_inclusive({0});
  ok = ok && first.index() == Index{me == 0 ? 0 : -1} &&
       first.create_cartesian_subtopology_partition({true}).is_null() == (me != 0);
  // One flag per dimension, and a 1-D partition has one.
  std::string rule;
  try {
    p.create_cartesian_subtopology_partition({true, true});
  } catch (const PartitionError& e) {
    rule = e.rule();
  }
  ok = ok && rule == rule_code::kAxisRange;
  EXPECT_TRUE(agreed(ok));
}

}  // namespace
}  // namespace partita::spec
