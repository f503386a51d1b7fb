// Seed 004's common API over MPI (partita::smp): the rank layout written out
// by hand (the seed's 8 processes, 2 model partitions -> 4 mp groups and 2 dp
// groups, and the layouts of the other tested world sizes), configurations
// and their errors on every rank, object communication with the seed's
// synchronous semantics, typed overloads, and misuse.
#include <gtest/gtest.h>

#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <type_traits>
#include <utility>

#include "expect_raises.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/smp.hpp"
#include "partita/smp/communicators.hpp"
#include "partita/smp/message.hpp"
#include "partita/smp/step.hpp"
#include "partita/nn/linear.hpp"
#include "partita/options.hpp"

namespace partita::spec {
namespace {

// One row of a layout table: what smp must report on that rank.
struct Row {
  int rank, mp_rank, dp_rank;
  std::vector<int> mp_group, dp_group;
};
struct Table {
  int size, partitions;
  std::vector<Row> rows;
};

// Written by hand from the seed's prose ("8 processes and 2 model partitions,
// and therefore 4 mp_groups, and 2 dp_groups") and docs/smp.md's rule: a
// replica's partitions are consecutive ranks.
const Table kSeedExample = {8, 2, {
    {0, 0, 0, {0, 1}, {0, 2, 4, 6}},
    {1, 1, 0, {0, 1}, {1, 3, 5, 7}},
    {2, 0, 1, {2, 3}, {0, 2, 4, 6}},
    {3, 1, 1, {2, 3}, {1, 3, 5, 7}},
    {4, 0, 2, {4, 5}, {0, 2, 4, 6}},
    {5, 1, 2, {4, 5}, {1, 3, 5, 7}},
    {6, 0, 3, {6, 7}, {0, 2, 4, 6}},
    {7, 1, 3, {6, 7}, {1, 3, 5, 7}},
}};
const std::vector<Table> kTables = {
    kSeedExample,
    {8, 4, {
        {0, 0, 0, {0, 1, 2, 3}, {0, 4}},
        {1, 1, 0, {0, 1, 2, 3}, {1, 5}},
        {2, 2, 0, {0, 1, 2, 3}, {2, 6}},
        {3, 3, 0, {0, 1, 2, 3}, {3, 7}},
        {4, 0, 1, {4, 5, 6, 7}, {0, 4}},
        {5, 1, 1, {4, 5, 6, 7}, {1, 5}},
        {6, 2, 1, {4, 5, 6, 7}, {2, 6}},
        {7, 3, 1, {4, 5, 6, 7}, {3, 7}},
    }},
    {8, 8, {
        {0, 0, 0, {0, 1, 2, 3, 4, 5, 6, 7}, {0}},
        {1, 1, 0, {0, 1, 2, 3, 4, 5, 6, 7}, {1}},
        {2, 2, 0, {0, 1, 2, 3, 4, 5, 6, 7}, {2}},
        {3, 3, 0, {0, 1, 2, 3, 4, 5, 6, 7}, {3}},
        {4, 4, 0, {0, 1, 2, 3, 4, 5, 6, 7}, {4}},
        {5, 5, 0, {0, 1, 2, 3, 4, 5, 6, 7}, {5}},
        {6, 6, 0, {0, 1, 2, 3, 4, 5, 6, 7}, {6}},
        {7, 7, 0, {0, 1, 2, 3, 4, 5, 6, 7}, {7}},
    }},
    {4, 2, {
        {0, 0, 0, {0, 1}, {0, 2}},
        {1, 1, 0, {0, 1}, {1, 3}},
        {2, 0, 1, {2, 3}, {0, 2}},
        {3, 1, 1, {2, 3}, {1, 3}},
    }},
    {4, 1, {
        {0, 0, 0, {0}, {0, 1, 2, 3}},
        {1, 0, 1, {1}, {0, 1, 2, 3}},
        {2, 0, 2, {2}, {0, 1, 2, 3}},
        {3, 0, 3, {3}, {0, 1, 2, 3}},
    }},
    {4, 4, {
        {0, 0, 0, {0, 1, 2, 3}, {0}},
        {1, 1, 0, {0, 1, 2, 3}, {1}},
        {2, 2, 0, {0, 1, 2, 3}, {2}},
        {3, 3, 0, {0, 1, 2, 3}, {3}},
    }},
    {2, 1, {
        {0, 0, 0, {0}, {0, 1}},
        {1, 0, 1, {1}, {0, 1}},
    }},
    {2, 2, {
        {0, 0, 0, {0, 1}, {0}},
        {1, 1, 0, {0, 1}, {1}},
    }},
    {1, 1, {
        {0, 0, 0, {0}, {0}},
    }},
};

smp::Config with_partitions(int p, int microbatches = 1) {
  smp::Config c;
  c.partitions(p);
  c.microbatches(microbatches);
  return c;
}


// --- layout -------------------------------------------------------------------

TEST(SmpLayout, NotInitialisedIsAClearError) {
  if (smp::initialized()) GTEST_SKIP() << "smp was initialised by an earlier test";
  EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::rank(); }), "call smp::init first");
  EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::barrier(); }), "call smp::init first");
}

// Every table against the pure layout (any world size, on every rank).
TEST(SmpLayout, TablesByHandMatchTheLayout) {
  for (const Table& t : kTables) {
    const smp::Layout l(t.size, t.partitions);
    EXPECT_EQ(l.mp_size(), t.partitions);
    EXPECT_EQ(l.dp_size(), t.size / t.partitions);
    ASSERT_EQ(static_cast<int>(t.rows.size()), t.size);
    for (const Row& row : t.rows) {
      const smp::RankPlace p = l.place(row.rank);
      EXPECT_EQ(p.mp_rank, row.mp_rank) << t.size << "/" << t.partitions << " rank " << row.rank;
      EXPECT_EQ(p.dp_rank, row.dp_rank) << t.size << "/" << t.partitions << " rank " << row.rank;
      EXPECT_EQ(p.mp_group, row.mp_group) << t.size << "/" << t.partitions << " rank " << row.rank;
      EXPECT_EQ(p.dp_group, row.dp_group) << t.size << "/" << t.partitions << " rank " << row.rank;
    }
  }
  // The seed's counts: 4 mp groups and 2 dp groups.
  const smp::Layout seed(8, 2);
  EXPECT_EQ(seed.mp_groups().size(), 4u);
  EXPECT_EQ(seed.dp_groups().size(), 2u);
  EXPECT_EQ(seed.mp_groups()[3], (std::vector<int>{6, 7}));
  EXPECT_EQ(seed.dp_groups()[1], (std::vector<int>{1, 3, 5, 7}));
}

// The live values of every configuration of this world size that has a table.
TEST(SmpLayout, EveryRankReportsItsRow) {
  const int n = mpi::world_size(), me = mpi::world_rank();
  int checked = 0;
  for (const Table& t : kTables) {
    if (t.size != n) continue;
    smp::init(with_partitions(t.partitions));
    const Row& row = t.rows[me];
    const std::string where = std::to_string(n) + " ranks, " + std::to_string(t.partitions) + " partitions, rank " +
                              std::to_string(me);
    EXPECT_EQ(smp::rank(), row.rank) << where;
    EXPECT_EQ(smp::size(), t.size) << where;
    EXPECT_EQ(smp::mp_rank(), row.mp_rank) << where;
    EXPECT_EQ(smp::mp_size(), static_cast<int>(row.mp_group.size())) << where;
    EXPECT_EQ(smp::dp_rank(), row.dp_rank) << where;
    EXPECT_EQ(smp::dp_size(), static_cast<int>(row.dp_group.size())) << where;
    EXPECT_EQ(smp::get_mp_group(), row.mp_group) << where;
    EXPECT_EQ(smp::get_dp_group(), row.dp_group) << where;
    // The communicators hold the same members in the same order.
    for (auto [group, members] : {std::pair{smp::MP_GROUP, row.mp_group}, std::pair{smp::DP_GROUP, row.dp_group}}) {
      const MPI_Comm c = smp::communicator(group);
      int gsize = 0, grank = 0;
      MPI_Comm_size(c, &gsize);
      MPI_Comm_rank(c, &grank);
      ASSERT_EQ(gsize, static_cast<int>(members.size())) << where;
      EXPECT_EQ(members[grank], me) << where;
      MPI_Group g, w;
      MPI_Comm_group(c, &g);
      MPI_Comm_group(MPI_COMM_WORLD, &w);
      std::vector<int> in(gsize), out(gsize);
      for (int i = 0; i < gsize; ++i) in[i] = i;
      MPI_Group_translate_ranks(g, gsize, in.data(), w, out.data());
      EXPECT_EQ(out, members) << where << " " << smp::name(group);
      MPI_Group_free(&g);
      MPI_Group_free(&w);
    }
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no hand-written table for " << n << " ranks";
}

// local_rank/local_size from MPI's shared-memory split, against what the
// launcher (Hydra) says about this node.
TEST(SmpLayout, LocalRankMatchesTheLauncher) {
  smp::init(with_partitions(1));
  const char* n = std::getenv("MPI_LOCALNRANKS");
  const char* r = std::getenv("MPI_LOCALRANKID");
  if (!n || !r) GTEST_SKIP() << "the launcher sets no MPI_LOCALNRANKS / MPI_LOCALRANKID";
  EXPECT_EQ(smp::local_size(), std::atoi(n));
  EXPECT_EQ(smp::local_rank(), std::atoi(r));
}

// --- configuration --------------------------------------------------------------

TEST(SmpConfig, ParsesEveryField) {
  const auto c = smp::Config::from_json(R"({"partitions": 2, "microbatches": 4, "pipeline": "simple", "ddp": false})");
  EXPECT_EQ(c.partitions(), 2);
  EXPECT_EQ(c.microbatches(), 4);
  EXPECT_EQ(c.pipeline(), "simple");
  EXPECT_FALSE(c.ddp());
  const auto d = smp::Config::from_json("{}");
  EXPECT_EQ(d.partitions(), 1);
  EXPECT_EQ(d.microbatches(), 1);
  EXPECT_EQ(d.pipeline(), "interleaved");
  EXPECT_TRUE(d.ddp());
  EXPECT_EQ(smp::Config::from_json(c.to_json()).to_json(), c.to_json());
  EXPECT_EQ(d.virtual_pipeline_model_parallel_size(), 1);
  // Virtual stages (issue 31): Megatron-LM's name, written only when not 1.
  const auto v = smp::Config::from_json(
      R"({"partitions": 2, "microbatches": 4, "pipeline": "interleaved_virtual", "virtual_pipeline_model_parallel_size": 3})");
  EXPECT_EQ(v.pipeline(), "interleaved_virtual");
  EXPECT_EQ(v.virtual_pipeline_model_parallel_size(), 3);
  EXPECT_EQ(smp::Config::from_json(v.to_json()).virtual_pipeline_model_parallel_size(), 3);
  EXPECT_EQ(c.to_json().find("virtual"), std::string::npos);
  EXPECT_CONTAINS(raised<smp::ConfigError>([] {
                    smp::Config::from_json(R"({"virtual_pipeline_model_parallel_size": 0})", "cfg");
                  }),
                  "cfg: field \"virtual_pipeline_model_parallel_size\": expected a positive integer, got 0");
  smp::Config huge;
  huge.pipeline("interleaved_virtual").partitions(2).virtual_pipeline_model_parallel_size(1 << 30);
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { huge.validate(2); }),
                  "partitions x virtual_pipeline_model_parallel_size = 2147483648 stages, above 2^20");
  smp::Config no_virtual;
  no_virtual.virtual_pipeline_model_parallel_size(2);
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { no_virtual.validate(1); }),
                  "virtual_pipeline_model_parallel_size 2 needs the pipeline \"interleaved_virtual\"");
}

// Config and the options take LibTorch-style setters; a braced list is no
// longer an aggregate initialisation that could land a value in another
// field (smp::init({2, 4}) once set tensor_parallel_degree to 4).
static_assert(!std::is_aggregate_v<smp::Config> && !std::is_constructible_v<smp::Config, int, int>,
              "smp::Config must not take a positional braced list");
static_assert(!std::is_aggregate_v<Options> && !std::is_constructible_v<Options, bool, bool, bool>,
              "partita::Options must not take a positional braced list");
static_assert(!std::is_aggregate_v<nn::LinearOptions> && !std::is_constructible_v<nn::LinearOptions, bool>,
              "nn::LinearOptions must not take a positional braced list");
static_assert(!std::is_aggregate_v<smp::StepOptions> && !std::is_aggregate_v<GatherAxes>,
              "the options structs must not take a positional braced list");

TEST(SmpConfig, SettersChainAndNameEachField) {
  const auto c = smp::Config().partitions(2).microbatches(4);
  EXPECT_EQ(c.partitions(), 2);
  EXPECT_EQ(c.microbatches(), 4);
  EXPECT_EQ(c.tensor_parallel_degree(), 1);  // not the second value given
  const auto d = smp::Config().tensor_parallel_degree(2).partitions(3).ddp(false).pipeline("simple");
  EXPECT_EQ(d.to_json(),
            R"({"partitions": 3, "tensor_parallel_degree": 2, "microbatches": 1, "pipeline": "simple", "ddp": false})");
  smp::Config e;
  e.microbatches() = 5;  // the getter gives the field, as LibTorch's options do
  EXPECT_EQ(e.microbatches(), 5);
  EXPECT_EQ(nn::LinearOptions().bias(false).dtype(at::kDouble).dtype(), at::kDouble);
  EXPECT_FALSE(nn::LinearOptions().bias(false).bias());
  EXPECT_TRUE(Options().preserve_batch());
  EXPECT_EQ(Options().shapes(Shapes::kStatic).transpose_src(true).shapes(), Shapes::kStatic);
}

// torch.distributed.pipelining's names beside smp's (either case), stored as
// smp's; smp's "interleaved" is plain 1F1B, torch's Interleaved1F1B is
// smp's interleaved_virtual.
TEST(SmpConfig, TorchScheduleNamesAreSmpNames) {
  const std::pair<const char*, const char*> names[] = {
      {"1F1B", "interleaved"},       {"1f1b", "interleaved"},           {"interleaved", "interleaved"},
      {"GPipe", "simple"},           {"gpipe", "simple"},               {"simple", "simple"},
      {"ZBH1", "zero_bubble"},       {"zb_h1", "zero_bubble"},          {"zero_bubble", "zero_bubble"},
      {"Interleaved1F1B", "interleaved_virtual"}, {"interleaved_1f1b", "interleaved_virtual"},
      {"interleaved_virtual", "interleaved_virtual"}};
  for (const auto& [given, smp_name] : names) {
    EXPECT_EQ(smp::Config().pipeline(given).pipeline(), smp_name) << given;
    EXPECT_EQ(smp::Config::from_json(std::string(R"({"pipeline": ")") + given + R"("})").pipeline(), smp_name)
        << given;
    EXPECT_EQ(smp::canonical_pipeline(given), smp_name) << given;
  }
  EXPECT_EQ(smp::canonical_pipeline("Interleaved"), "interleaved");
  EXPECT_EQ(smp::canonical_pipeline("1F2B"), "");
  EXPECT_EQ(smp::canonical_pipeline(""), "");
  // A name neither knows is kept and refused by validate.
  const auto bad = smp::Config().pipeline("LoopedBFS");
  EXPECT_EQ(bad.pipeline(), "LoopedBFS");
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { bad.validate(1); }), "unknown pipeline \"LoopedBFS\"");
  const auto virt = smp::Config().partitions(1).pipeline("Interleaved1F1B").virtual_pipeline_model_parallel_size(2);
  EXPECT_NO_THROW(virt.validate(mpi::world_size()));
}

TEST(SmpConfig, BadJsonNamesTheField) {
  using smp::Config;
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { Config::from_json(R"({"microbatches": 0})", "cfg"); }),
                  "cfg: field \"microbatches\": expected a positive integer, got 0");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { Config::from_json(R"({"partitions": "2"})", "cfg"); }),
                  "cfg: field \"partitions\": expected a positive integer, got \"2\"");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { Config::from_json(R"({"pipeline": "zigzag"})", "cfg"); }),
                  "cfg: field \"pipeline\": expected \"interleaved\" (or \"1F1B\"), \"simple\" (or \"GPipe\"), "
                  "\"zero_bubble\" (or \"ZBH1\") or \"interleaved_virtual\" (or \"Interleaved1F1B\"), got \"zigzag\"");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { Config::from_json(R"({"ddp": 1})", "cfg"); }),
                  "cfg: field \"ddp\": expected a boolean, got 1");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { Config::from_json(R"({"partition": 2})", "cfg"); }),
                  "cfg: field \"partition\": unknown (expected partitions, tensor_parallel_degree, microbatches, pipeline, ddp, virtual_pipeline_model_parallel_size)");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { Config::from_json(R"({"partitions": 2)", "cfg"); }),
                  "cfg: not valid JSON");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { Config::from_json("[2]", "cfg"); }), "cfg: expected an object");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { Config::from_json_file("/nonexistent/smp.json"); }),
                  "/nonexistent/smp.json: cannot open");
}

TEST(SmpConfig, ValidateAgainstTheWorld) {
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { with_partitions(3).validate(8); }),
                  "the world of 8 processes is not divisible into 3 partitions");
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { with_partitions(2, 0).validate(8); }),
                  "microbatches must be at least 1");
  smp::Config c = with_partitions(2);
  c.pipeline("zigzag");
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { c.validate(8); }), "unknown pipeline \"zigzag\"");
  c = with_partitions(2);
  c.ddp(false);
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { c.validate(8); }),
                  "with ddp off the world must be exactly the 2 partitions (dp_size 4 needs ddp on)");
  c.validate(2);
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { smp::Layout(6, 4); }), "6 processes cannot hold");
}

// A configuration that fails on one rank fails on all, naming that rank.
TEST(SmpConfig, BadConfigurationRaisesOnEveryRank) {
  const int n = mpi::world_size(), me = mpi::world_rank();
  // Not divisible (every rank).
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { smp::init(with_partitions(n + 1)); }),
                  "smp::init: rank 0: smp configuration");
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { smp::init(with_partitions(1, 0)); }),
                  "microbatches must be at least 1");
  // Bad on the last rank only.
  const std::string last = std::to_string(n - 1);
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { smp::init(with_partitions(1, me == n - 1 ? 0 : 1)); }),
                  "smp::init: rank " + last + ": ");
  // Valid everywhere but not the same everywhere.
  if (n > 1) {
    EXPECT_CONTAINS(raised<smp::ConfigError>([&] { smp::init(with_partitions(1, me == n - 1 ? 2 : 1)); }),
                    "smp::init: the ranks disagree about the configuration: rank 0 has "
                    "{\"partitions\": 1, \"microbatches\": 1, \"pipeline\": \"interleaved\", \"ddp\": true}, rank " +
                        last + " has {\"partitions\": 1, \"microbatches\": 2");
  }
  // After a failed init a good one works.
  smp::init(with_partitions(1));
  EXPECT_EQ(smp::dp_size(), n);
}

// From a JSON file and from PARTITA_SMP_CONFIG.
TEST(SmpConfig, FromFileAndEnvironment) {
  const int n = mpi::world_size(), me = mpi::world_rank();
  const int p = n % 2 == 0 ? 2 : 1;
  const std::string path = "/tmp/partita_smp_spec_" + std::to_string(getpid()) + ".json";
  {
    std::ofstream f(path);
    f << "{\"partitions\": " << p << ", \"microbatches\": 3, \"pipeline\": \"simple\"}";
  }
  smp::init_from_file(path);
  EXPECT_EQ(smp::mp_size(), p);
  EXPECT_EQ(smp::config().microbatches(), 3);
  EXPECT_EQ(smp::config().pipeline(), "simple");
  {
    std::ofstream f(path);
    f << (me == 0 ? "{\"partitions\": 1, \"microbatch\": 3}" : "{}");
  }
  const std::string bad_file = raised<smp::ConfigError>([&] { smp::init_from_file(path); });
  EXPECT_CONTAINS(bad_file, "smp::init: rank 0: /tmp/partita_smp_spec_");  // rank 0's file
  EXPECT_CONTAINS(bad_file, ".json: field \"microbatch\": unknown");
  std::remove(path.c_str());

  const std::string json = "{\"partitions\": " + std::to_string(n) + ", \"ddp\": false}";
  setenv(smp::kConfigVariable, json.c_str(), 1);
  smp::init();
  EXPECT_EQ(smp::mp_size(), n);
  EXPECT_EQ(smp::dp_size(), 1);
  EXPECT_FALSE(smp::config().ddp());
  setenv(smp::kConfigVariable, me == n - 1 ? "{\"pipeline\": 7}" : "{}", 1);
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { smp::init(); }),
                  "smp::init: rank " + std::to_string(n - 1) +
                      ": $PARTITA_SMP_CONFIG: field \"pipeline\": expected \"interleaved\" (or \"1F1B\"), \"simple\" (or "
                      "\"GPipe\"), \"zero_bubble\" (or \"ZBH1\") or \"interleaved_virtual\" (or \"Interleaved1F1B\"), got 7");
  unsetenv(smp::kConfigVariable);
  smp::init();
  EXPECT_EQ(smp::mp_size(), 1);
}

}  // namespace
}  // namespace partita::spec
