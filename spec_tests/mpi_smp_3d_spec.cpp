// Issue 32 item 1: smp's 3-D layout (docs/3d.md). World = dp x pp x tp with
// tp varying fastest, then pp, then dp: rank = (dp_rank * pp + pp_rank) * tp
// + tp_rank. The tables below are written out by hand from that rule, not
// computed by it; every configuration without tensor parallelism keeps the
// 2-D tables of mpi_smp_spec.cpp.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <string>
#include <vector>

#include "expect_raises.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/smp.hpp"
#include "partita/smp/communicators.hpp"

namespace partita::spec {
namespace {

struct Row3 {
  int rank, dp_rank, pp_rank, tp_rank, mp_rank;
  std::vector<int> tp_group, pp_group, mp_group, dp_group;
};
struct Table3 {
  int size, pp, tp;
  std::vector<Row3> rows;
};

const std::vector<Table3> kTables3 = {
    // pp 2 x tp 2 x dp 2: the issue's 8-rank layout.
    {8, 2, 2, {
        {0, 0, 0, 0, 0, {0, 1}, {0, 2}, {0, 1, 2, 3}, {0, 4}},
        {1, 0, 0, 1, 1, {0, 1}, {1, 3}, {0, 1, 2, 3}, {1, 5}},
        {2, 0, 1, 0, 2, {2, 3}, {0, 2}, {0, 1, 2, 3}, {2, 6}},
        {3, 0, 1, 1, 3, {2, 3}, {1, 3}, {0, 1, 2, 3}, {3, 7}},
        {4, 1, 0, 0, 0, {4, 5}, {4, 6}, {4, 5, 6, 7}, {0, 4}},
        {5, 1, 0, 1, 1, {4, 5}, {5, 7}, {4, 5, 6, 7}, {1, 5}},
        {6, 1, 1, 0, 2, {6, 7}, {4, 6}, {4, 5, 6, 7}, {2, 6}},
        {7, 1, 1, 1, 3, {6, 7}, {5, 7}, {4, 5, 6, 7}, {3, 7}},
    }},
    // pp 1 x tp 2 x dp 4.
    {8, 1, 2, {
        {0, 0, 0, 0, 0, {0, 1}, {0}, {0, 1}, {0, 2, 4, 6}},
        {1, 0, 0, 1, 1, {0, 1}, {1}, {0, 1}, {1, 3, 5, 7}},
        {2, 1, 0, 0, 0, {2, 3}, {2}, {2, 3}, {0, 2, 4, 6}},
        {3, 1, 0, 1, 1, {2, 3}, {3}, {2, 3}, {1, 3, 5, 7}},
        {4, 2, 0, 0, 0, {4, 5}, {4}, {4, 5}, {0, 2, 4, 6}},
        {5, 2, 0, 1, 1, {4, 5}, {5}, {4, 5}, {1, 3, 5, 7}},
        {6, 3, 0, 0, 0, {6, 7}, {6}, {6, 7}, {0, 2, 4, 6}},
        {7, 3, 0, 1, 1, {6, 7}, {7}, {6, 7}, {1, 3, 5, 7}},
    }},
    // pp 2 x tp 4 x dp 1.
    {8, 2, 4, {
        {0, 0, 0, 0, 0, {0, 1, 2, 3}, {0, 4}, {0, 1, 2, 3, 4, 5, 6, 7}, {0}},
        {1, 0, 0, 1, 1, {0, 1, 2, 3}, {1, 5}, {0, 1, 2, 3, 4, 5, 6, 7}, {1}},
        {2, 0, 0, 2, 2, {0, 1, 2, 3}, {2, 6}, {0, 1, 2, 3, 4, 5, 6, 7}, {2}},
        {3, 0, 0, 3, 3, {0, 1, 2, 3}, {3, 7}, {0, 1, 2, 3, 4, 5, 6, 7}, {3}},
        {4, 0, 1, 0, 4, {4, 5, 6, 7}, {0, 4}, {0, 1, 2, 3, 4, 5, 6, 7}, {4}},
        {5, 0, 1, 1, 5, {4, 5, 6, 7}, {1, 5}, {0, 1, 2, 3, 4, 5, 6, 7}, {5}},
        {6, 0, 1, 2, 6, {4, 5, 6, 7}, {2, 6}, {0, 1, 2, 3, 4, 5, 6, 7}, {6}},
        {7, 0, 1, 3, 7, {4, 5, 6, 7}, {3, 7}, {0, 1, 2, 3, 4, 5, 6, 7}, {7}},
    }},
    // pp 2 x tp 2 x dp 1.
    {4, 2, 2, {
        {0, 0, 0, 0, 0, {0, 1}, {0, 2}, {0, 1, 2, 3}, {0}},
        {1, 0, 0, 1, 1, {0, 1}, {1, 3}, {0, 1, 2, 3}, {1}},
        {2, 0, 1, 0, 2, {2, 3}, {0, 2}, {0, 1, 2, 3}, {2}},
        {3, 0, 1, 1, 3, {2, 3}, {1, 3}, {0, 1, 2, 3}, {3}},
    }},
    // pp 1 x tp 2 x dp 2.
    {4, 1, 2, {
        {0, 0, 0, 0, 0, {0, 1}, {0}, {0, 1}, {0, 2}},
        {1, 0, 0, 1, 1, {0, 1}, {1}, {0, 1}, {1, 3}},
        {2, 1, 0, 0, 0, {2, 3}, {2}, {2, 3}, {0, 2}},
        {3, 1, 0, 1, 1, {2, 3}, {3}, {2, 3}, {1, 3}},
    }},
    // pp 1 x tp 2 x dp 1.
    {2, 1, 2, {
        {0, 0, 0, 0, 0, {0, 1}, {0}, {0, 1}, {0}},
        {1, 0, 0, 1, 1, {0, 1}, {1}, {0, 1}, {1}},
    }},
    // tp 1: the 2-D layout, every rank its own tp group, pp group = mp group.
    {4, 2, 1, {
        {0, 0, 0, 0, 0, {0}, {0, 1}, {0, 1}, {0, 2}},
        {1, 0, 1, 0, 1, {1}, {0, 1}, {0, 1}, {1, 3}},
        {2, 1, 0, 0, 0, {2}, {2, 3}, {2, 3}, {0, 2}},
        {3, 1, 1, 0, 1, {3}, {2, 3}, {2, 3}, {1, 3}},
    }},
    {1, 1, 1, {
        {0, 0, 0, 0, 0, {0}, {0}, {0}, {0}},
    }},
};

smp::Config config3(int pp, int tp, int microbatches = 1) {
  smp::Config c;
  c.partitions(pp);
  c.tensor_parallel_degree(tp);
  c.microbatches(microbatches);
  return c;
}

std::string label(const Table3& t, int rank) {
  return std::to_string(t.size) + " ranks, pp " + std::to_string(t.pp) + " x tp " + std::to_string(t.tp) +
         ", rank " + std::to_string(rank);
}

// The members of `c` as world ranks, in group-rank order.
std::vector<int> world_members(MPI_Comm c) {
  int n = 0;
  MPI_Comm_size(c, &n);
  MPI_Group g, w;
  MPI_Comm_group(c, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &w);
  std::vector<int> in(n), out(n);
  for (int i = 0; i < n; ++i) in[i] = i;
  MPI_Group_translate_ranks(g, n, in.data(), w, out.data());
  MPI_Group_free(&g);
  MPI_Group_free(&w);
  return out;
}

TEST(Smp3dLayout, TablesByHandMatchTheLayout) {
  for (const Table3& t : kTables3) {
    const smp::Layout l(t.size, t.pp, t.tp);
    EXPECT_EQ(l.pp_size(), t.pp);
    EXPECT_EQ(l.tp_size(), t.tp);
    EXPECT_EQ(l.mp_size(), t.pp * t.tp);
    EXPECT_EQ(l.dp_size(), t.size / (t.pp * t.tp));
    ASSERT_EQ(static_cast<int>(t.rows.size()), t.size);
    for (const Row3& row : t.rows) {
      const smp::RankPlace p = l.place(row.rank);
      const std::string where = label(t, row.rank);
      EXPECT_EQ(p.dp_rank, row.dp_rank) << where;
      EXPECT_EQ(p.pp_rank, row.pp_rank) << where;
      EXPECT_EQ(p.tp_rank, row.tp_rank) << where;
      EXPECT_EQ(p.mp_rank, row.mp_rank) << where;
      EXPECT_EQ(p.tp_group, row.tp_group) << where;
      EXPECT_EQ(p.pp_group, row.pp_group) << where;
      EXPECT_EQ(p.mp_group, row.mp_group) << where;
      EXPECT_EQ(p.dp_group, row.dp_group) << where;
      // A rank read as TP_RANK / PP_RANK / DP_RANK / MP_RANK names the
      // group's member (DP_RANK: the same pp and tp place in replica i).
      for (int i = 0; i < static_cast<int>(row.tp_group.size()); ++i)
        EXPECT_EQ(l.world_rank(row.rank, i, smp::TP_RANK), row.tp_group[i]) << where;
      for (int i = 0; i < static_cast<int>(row.pp_group.size()); ++i)
        EXPECT_EQ(l.world_rank(row.rank, i, smp::PP_RANK), row.pp_group[i]) << where;
      for (int i = 0; i < static_cast<int>(row.dp_group.size()); ++i)
        EXPECT_EQ(l.world_rank(row.rank, i, smp::DP_RANK), row.dp_group[i]) << where << ", DP_RANK " << i;
      for (int i = 0; i < static_cast<int>(row.mp_group.size()); ++i)
        EXPECT_EQ(l.world_rank(row.rank, i, smp::MP_RANK), row.mp_group[i]) << where << ", MP_RANK " << i;
    }
    // Every group once: tp groups dp x pp of them, pp groups dp x tp.
    EXPECT_EQ(static_cast<int>(l.tp_groups().size()), l.dp_size() * t.pp);
    EXPECT_EQ(static_cast<int>(l.pp_groups().size()), l.dp_size() * t.tp);
  }
  // The 2-argument layout is the tp 1 layout.
  const smp::Layout two(8, 4), three(8, 4, 1);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(two.place(r).mp_group, three.place(r).mp_group);
    EXPECT_EQ(two.place(r).pp_group, three.place(r).mp_group);
    EXPECT_EQ(two.place(r).tp_group, std::vector<int>{r});
  }
  EXPECT_EQ(smp::Layout(8, 2, 2).tp_groups(), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(smp::Layout(8, 2, 2).pp_groups(), (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::Layout(8, 2, 2).world_rank(0, 2, smp::TP_RANK); }),
                  "smp: TP_RANK 2 does not exist (the tp group has 2 ranks)");
  EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::Layout(8, 2, 2).world_rank(0, -1, smp::PP_RANK); }),
                  "smp: PP_RANK -1 does not exist (the pp group has 2 ranks)");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { smp::Layout(8, 3, 2); }),
                  "8 processes cannot hold model replicas of 3 pipeline stages x 2 tensor-parallel ranks");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { smp::Layout(8, 2, 0); }), "cannot hold");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { smp::Layout(8, 2, -2); }), "cannot hold");
}

// The live values and communicators of every table of this world size.
TEST(Smp3dLayout, EveryRankReportsItsRow) {
  const int n = mpi::world_size(), me = mpi::world_rank();
  int checked = 0;
  for (const Table3& t : kTables3) {
    if (t.size != n) continue;
    smp::init(config3(t.pp, t.tp));
    const Row3& row = t.rows[me];
    const std::string where = label(t, me);
    EXPECT_EQ(smp::tp_rank(), row.tp_rank) << where;
    EXPECT_EQ(smp::tp_size(), t.tp) << where;
    EXPECT_EQ(smp::pp_rank(), row.pp_rank) << where;
    EXPECT_EQ(smp::pp_size(), t.pp) << where;
    EXPECT_EQ(smp::mp_rank(), row.mp_rank) << where;
    EXPECT_EQ(smp::mp_size(), t.pp * t.tp) << where;
    EXPECT_EQ(smp::dp_rank(), row.dp_rank) << where;
    EXPECT_EQ(smp::dp_size(), n / (t.pp * t.tp)) << where;
    EXPECT_EQ(smp::get_tp_group(), row.tp_group) << where;
    EXPECT_EQ(smp::get_pp_group(), row.pp_group) << where;
    EXPECT_EQ(smp::get_mp_group(), row.mp_group) << where;
    EXPECT_EQ(smp::get_dp_group(), row.dp_group) << where;
    for (auto [group, members] : {std::pair{smp::TP_GROUP, row.tp_group}, std::pair{smp::PP_GROUP, row.pp_group},
                                  std::pair{smp::MP_GROUP, row.mp_group}, std::pair{smp::DP_GROUP, row.dp_group}}) {
      const MPI_Comm c = smp::communicator(group);
      int grank = -1;
      MPI_Comm_rank(c, &grank);
      EXPECT_EQ(world_members(c), members) << where << " " << smp::name(group);
      ASSERT_GE(grank, 0);
      EXPECT_EQ(members[grank], me) << where << " " << smp::name(group);
    }
    // Objects by TP_RANK and PP_RANK: each rank allgathers over its tp and
    // pp groups; and around a ring by rank type: to the next tp rank by
    // TP_RANK, to the same pp and tp place in the next replica by DP_RANK.
    EXPECT_EQ(smp::allgather(me, smp::TP_GROUP), row.tp_group) << where;
    EXPECT_EQ(smp::allgather(me, smp::PP_GROUP), row.pp_group) << where;
    auto ring = [&](smp::RankType type, int mine, const std::vector<int>& group) {
      const int size = static_cast<int>(group.size());
      if (size < 2) return;
      const int next = (mine + 1) % size, prev = (mine + size - 1) % size;
      if (mine % 2 == 0) smp::send(me * 10, next, type);
      EXPECT_EQ(smp::recv_from<int>(prev, type), group[prev] * 10) << where << " " << smp::name(type);
      if (mine % 2 != 0) smp::send(me * 10, next, type);
    };
    ring(smp::TP_RANK, row.tp_rank, row.tp_group);
    ring(smp::DP_RANK, row.dp_rank, row.dp_group);
    smp::tp_barrier();
    smp::pp_barrier();
    smp::dp_barrier();
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no hand-written 3-D table for " << n << " ranks";
}

TEST(Smp3dConfig, ParsesAndPrintsTheDegree) {
  const auto c = smp::Config::from_json(R"({"partitions": 2, "tensor_parallel_degree": 4})");
  EXPECT_EQ(c.partitions(), 2);
  EXPECT_EQ(c.tensor_parallel_degree(), 4);
  EXPECT_EQ(c.mp_size(), 8);
  EXPECT_EQ(smp::Config::from_json(c.to_json()).tensor_parallel_degree(), 4);
  // Default 1, and a configuration without it prints as before the field existed.
  const auto d = smp::Config::from_json(R"({"partitions": 2})");
  EXPECT_EQ(d.tensor_parallel_degree(), 1);
  EXPECT_EQ(d.mp_size(), 2);
  EXPECT_EQ(d.to_json(), R"({"partitions": 2, "microbatches": 1, "pipeline": "interleaved", "ddp": true})");
  using smp::Config;
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { Config::from_json(R"({"tensor_parallel_degree": 0})", "cfg"); }),
                  "cfg: field \"tensor_parallel_degree\": expected a positive integer, got 0");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { Config::from_json(R"({"tensor_parallel_degree": -2})", "cfg"); }),
                  "cfg: field \"tensor_parallel_degree\": expected a positive integer, got -2");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { Config::from_json(R"({"tensor_parallel_degree": 1.5})", "cfg"); }),
                  "cfg: field \"tensor_parallel_degree\": expected a positive integer, got 1.5");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { config3(2, 0).validate(8); }),
                  "tensor_parallel_degree must be at least 1");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { config3(2, -1).validate(8); }),
                  "tensor_parallel_degree must be at least 1");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { config3(2, 3).validate(8); }),
                  "the world of 8 processes is not divisible into model replicas of 2 partitions x "
                  "tensor_parallel_degree 3 = 6 processes");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { config3(4, 4).validate(8); }),
                  "not divisible into model replicas of 4 partitions x tensor_parallel_degree 4 = 16 processes");
  smp::Config off = config3(2, 2);
  off.ddp(false);
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { off.validate(8); }),
                  "with ddp off the world must be exactly one model replica of 2 partitions x "
                  "tensor_parallel_degree 2 = 4 processes (dp_size 2 needs ddp on)");
  off.validate(4);
  config3(2, 2).validate(8);
  config3(1, 8).validate(8);
}

// Bad degrees fail init on every rank, naming the rank whose configuration
// is bad; a good init afterwards works.
TEST(Smp3dConfig, BadDegreesRaiseOnEveryRank) {
  const int n = mpi::world_size(), me = mpi::world_rank();
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { smp::init(config3(1, n + 1)); }),
                  "smp::init: rank 0: smp configuration");
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { smp::init(config3(1, 0)); }),
                  "tensor_parallel_degree must be at least 1");
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { smp::init(config3(1, -3)); }),
                  "tensor_parallel_degree must be at least 1");
  // Bad on the last rank only: every rank raises, naming it.
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { smp::init(config3(1, me == n - 1 ? 0 : 1)); }),
                  "smp::init: rank " + std::to_string(n - 1) + ": ");
  if (n % 2 == 0) {
    // Valid everywhere, different degrees: every rank raises.
    EXPECT_CONTAINS(raised<smp::ConfigError>([&] { smp::init(config3(1, me == n - 1 ? 2 : 1)); }),
                    "smp::init: the ranks disagree about the configuration");
    smp::init(config3(1, 2));
    EXPECT_EQ(smp::tp_size(), 2);
  }
  smp::init(config3(1, 1));
  EXPECT_EQ(smp::tp_size(), 1);
  EXPECT_EQ(smp::get_tp_group(), std::vector<int>{me});
}

}  // namespace
}  // namespace partita::spec
