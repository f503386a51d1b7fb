// The gate's statistics, the result format and the dashboard check, on
// data written out here (no benchmark runs: perf/end_to_end.sh does those).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "dashboard.hpp"
#include "partita/errors.hpp"
#include "gate.hpp"
#include "results.hpp"
#include "stats.hpp"

namespace partita::perf {
namespace {

// (gtest's Test::Run hides the name inside test bodies.)
using RunT = partita::perf::Run;

TEST(Stats, Summary) {
  const Summary odd = summarize({5, 1, 3});
  EXPECT_EQ(odd.median, 3);
  EXPECT_EQ(odd.min, 1);
  EXPECT_EQ(odd.max, 5);
  EXPECT_EQ(odd.reps, 3u);
  EXPECT_EQ(summarize({4, 1, 3, 2}).median, 2.5);
}

// Exact p-values worked out by hand: with no ties, every ordering of the
// pooled sample is equally likely, C(n1+n2, n1) of them.
TEST(Stats, MannWhitneyExact) {
  // Complete separation of 5 and 5: U = 0, one ordering per tail of 252.
  EXPECT_NEAR(mann_whitney_p({1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}), 2.0 / 252, 1e-12);
  EXPECT_NEAR(mann_whitney_p({6, 7, 8, 9, 10}, {1, 2, 3, 4, 5}), 2.0 / 252, 1e-12);
  // a = {1..5, 11}, b = {6..10, 12}: U = 5. Orderings with U <= 5 are the
  // partitions of 0..5 into at most 6 parts of at most 6: 1+1+2+3+5+7 = 19
  // of C(12, 6) = 924; two-sided: 38/924.
  EXPECT_NEAR(mann_whitney_p({1, 2, 3, 4, 5, 11}, {6, 7, 8, 9, 10, 12}), 38.0 / 924, 1e-12);
  EXPECT_EQ(mann_whitney_p({1, 3, 5}, {2, 4, 6}), mann_whitney_p({2, 4, 6}, {1, 3, 5}));
  EXPECT_NEAR(smallest_p(2, 2), 2.0 / 6, 1e-12);  // two repetitions can never show a change
}

TEST(Stats, MannWhitneyWithTiesAndLargeSamples) {
  EXPECT_EQ(mann_whitney_p({1, 1, 1}, {1, 1, 1}), 1.0);  // no information at all
  EXPECT_EQ(mann_whitney_p({}, {1, 2}), 1.0);
  // 30 vs 30, separated: the normal approximation is tiny; interleaved: large.
  std::vector<double> a, b, c;
  for (int i = 0; i < 30; ++i) {
    a.push_back(i);
    b.push_back(100 + i);
    c.push_back(i + 0.5);
  }
  EXPECT_LT(mann_whitney_p(a, b), 1e-8);
  EXPECT_GT(mann_whitney_p(a, c), 0.5);
  // Ties across the samples use the corrected variance and stay in [0, 1].
  const double p = mann_whitney_p({1, 2, 2, 3, 3, 3}, {2, 3, 3, 4, 4, 5});
  EXPECT_GT(p, 0.0);
  EXPECT_LT(p, 1.0);
}

// A run of one benchmark whose time per call and ratio are `reps` samples
// around `time` and `ratio` (+-4% noise from a fixed seed).
RunT synthetic(double time, double ratio, int reps, unsigned seed, const std::string& name = "x_fwd/4096") {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> noise(0.96, 1.04);
  BenchResult b;
  b.name = name;
  b.primitive = name.substr(0, name.find('/'));
  b.bytes = 4096;
  b.ranks = 2;
  std::vector<double> t, m, q;
  for (int i = 0; i < reps; ++i) {
    t.push_back(time * noise(gen));
    q.push_back(ratio * noise(gen));
    m.push_back(t.back() / q.back());
  }
  b.time_us = {t, summarize(t)};
  b.mpi_time_us = {m, summarize(m)};
  b.ratio = {q, summarize(q)};
  b.bytes_per_second = {t, summarize(t)};
  RunT r;
  r.commit = "c" + std::to_string(seed);
  r.date = "2026-11-22T00:00:0" + std::to_string(seed % 10) + "Z";
  r.benchmarks.push_back(b);
  return r;
}

TEST(Gate, PassesOnItselfAndFailsOnAPlanted30PercentSlowdown) {
  GateOptions o;
  o.gate_time = true;
  const RunT base = synthetic(100, 1.5, 8, 1);
  EXPECT_FALSE(gate(base, base, o).failed);
  const RunT slow = synthetic(130, 1.95, 8, 2);  // both time and ratio 30% up
  const GateReport r = gate(base, slow, o);
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_TRUE(r.failed);
  EXPECT_EQ(r.rows[0].time.verdict, "slower");
  EXPECT_EQ(r.rows[0].ratio.verdict, "slower");
  EXPECT_NEAR(r.rows[0].time.change, 0.3, 0.1);
}

TEST(Gate, NoiseAndSmallChangesPass) {
  const GateOptions o;
  // Another draw of the same distribution, and a 3% change (below 10%).
  EXPECT_FALSE(gate(synthetic(100, 1.5, 8, 1), synthetic(100, 1.5, 8, 3), o).failed);
  EXPECT_FALSE(gate(synthetic(100, 1.5, 8, 1), synthetic(103, 1.545, 8, 4), o).failed);
  // 30% faster is reported, not failed.
  const GateReport r = gate(synthetic(100, 1.5, 8, 1), synthetic(70, 1.05, 8, 5), o);
  EXPECT_FALSE(r.failed);
  EXPECT_EQ(r.rows[0].time.verdict, "faster");
}

TEST(Gate, ByDefaultRatiosAloneAreGated) {
  const GateOptions o;
  // Another machine: everything 30% slower, the ratio unchanged: passes,
  // the time reported slower.
  const GateReport other = gate(synthetic(100, 1.5, 8, 1), synthetic(130, 1.5, 8, 6), o);
  EXPECT_FALSE(other.failed);
  ASSERT_EQ(other.rows.size(), 1u);
  EXPECT_EQ(other.rows[0].time.verdict, "slower");
  // A ratio 30% worse fails whatever the times.
  EXPECT_TRUE(gate(synthetic(100, 1.5, 8, 1), synthetic(100, 1.95, 8, 7), o).failed);
  // A machine 30% faster does not hide a ratio 30% worse either.
  EXPECT_TRUE(gate(synthetic(100, 1.5, 8, 1), synthetic(70, 1.95, 8, 8), o).failed);
}

TEST(Gate, TimesGatedOnRequestWithAWarningWhenTheMachinesDiffer) {
  GateOptions o;
  o.gate_time = true;
  RunT base = synthetic(100, 1.5, 8, 1), slower = synthetic(130, 1.5, 8, 6);
  EXPECT_TRUE(gate(base, slower, o).failed);  // same (empty) machine: time counts
  EXPECT_TRUE(gate(base, slower, o).warnings.empty());
  base.machine["cpu_model"] = "A";
  slower.machine["cpu_model"] = "B";
  const GateReport r = gate(base, slower, o);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("machines differ"), std::string::npos) << r.warnings[0];
}

TEST(Gate, TooFewRepetitionsWarnAndMissingBenchmarksAreListed) {
  const GateReport r = gate(synthetic(100, 1.5, 2, 1), synthetic(200, 3, 2, 2, "y_fwd/4096"), {});
  EXPECT_EQ(r.only_in_baseline, std::vector<std::string>{"x_fwd/4096@2"});
  EXPECT_EQ(r.only_in_run, std::vector<std::string>{"y_fwd/4096@2"});
  const GateReport few = gate(synthetic(100, 1.5, 2, 1), synthetic(200, 3, 2, 2), {});
  EXPECT_FALSE(few.failed);  // p can never go below 1/3 with 2 and 2
  ASSERT_EQ(few.warnings.size(), 1u);
}

TEST(Results, RoundTripAndGoogleBenchmarkInput) {
  RunT r = synthetic(100, 1.5, 5, 1);
  r.machine["cores"] = 2;
  r.settings["repetitions"] = 5;
  const RunT back = run_from_json(json::parse(json::dump(to_json(r))));
  ASSERT_EQ(back.benchmarks.size(), 1u);
  EXPECT_EQ(back.benchmarks[0].time_us.samples, r.benchmarks[0].time_us.samples);
  EXPECT_EQ(back.benchmarks[0].ratio.summary.median, r.benchmarks[0].ratio.summary.median);
  EXPECT_EQ(back.commit, r.commit);

  // Three repetitions and an aggregate, as bench_primitives writes them.
  const auto doc = json::parse(R"({
    "context": {"host_name": "h", "num_cpus": 2, "mhz_per_cpu": 2600, "mpi_library": "MPICH 4",
                "libtorch": "1.13.1", "twin:all_sum_reduce_fwd": "MPI_Allreduce"},
    "benchmarks": [
      {"name": "all_sum_reduce_fwd/4096/manual_time", "run_name": "all_sum_reduce_fwd/4096/manual_time",
       "run_type": "iteration", "partita_us": 6, "mpi_us": 3, "ratio": 2, "peak_rss_mib": 170, "peak_rss_mib_min_rank": 160, "rss_growth_mib": 1},
      {"name": "all_sum_reduce_fwd/4096/manual_time", "run_name": "all_sum_reduce_fwd/4096/manual_time",
       "run_type": "iteration", "partita_us": 4, "mpi_us": 2, "ratio": 2, "peak_rss_mib": 171, "peak_rss_mib_min_rank": 161, "rss_growth_mib": 2},
      {"name": "all_sum_reduce_fwd/4096/manual_time", "run_name": "all_sum_reduce_fwd/4096/manual_time",
       "run_type": "iteration", "partita_us": 5, "mpi_us": 4, "ratio": 1.25, "peak_rss_mib": 172, "peak_rss_mib_min_rank": 162, "rss_growth_mib": 3},
      {"name": "all_sum_reduce_fwd/4096/manual_time_median", "run_name": "all_sum_reduce_fwd/4096/manual_time",
       "run_type": "aggregate", "aggregate_name": "median", "partita_us": 5}
    ]})");
  const auto list = from_google_benchmark(doc, 2);
  ASSERT_EQ(list.size(), 1u);
  const auto& b = list[0];
  EXPECT_EQ(b.name, "all_sum_reduce_fwd/4096");
  EXPECT_EQ(b.primitive, "all_sum_reduce_fwd");
  EXPECT_EQ(b.bytes, 4096);
  EXPECT_EQ(b.twin, "MPI_Allreduce");
  EXPECT_EQ(b.time_us.samples, (std::vector<double>{6, 4, 5}));
  EXPECT_EQ(b.time_us.summary.median, 5);
  EXPECT_EQ(b.mpi_time_us.summary.max, 4);
  EXPECT_EQ(b.ratio.summary.min, 1.25);
  EXPECT_NEAR(b.bytes_per_second.summary.median, 4096 / 5e-6, 1e-3);
  EXPECT_EQ(b.peak_rss_mib, 172);
  EXPECT_EQ(b.peak_rss_mib_min_rank, 162);
  EXPECT_EQ(machine_of(doc).at("mpi_library").get<std::string>(), "MPICH 4");

  // Passes merge: the samples of both, the summary of all.
  BenchResult twice = b;
  twice.absorb(b);
  EXPECT_EQ(twice.time_us.samples, (std::vector<double>{6, 4, 5, 6, 4, 5}));
  EXPECT_EQ(twice.time_us.summary.reps, 6u);
  EXPECT_EQ(twice.time_us.summary.median, 5);
  BenchResult other = b;
  other.ranks = 4;
  EXPECT_THROW(twice.absorb(other), Error);

  // A peer library's line (LibTorch's c10d Gloo): its context entry names it,
  // each repetition carries peer_us, and the result keeps both through JSON.
  auto with_peer = json::parse(json::dump(doc));
  with_peer["context"]["peer:all_sum_reduce_fwd"] = "c10d::ProcessGroupGloo allreduce (sum)";
  const double peer_us[] = {300, 100, 200};
  for (int i = 0; i < 3; ++i) with_peer["benchmarks"][i]["peer_us"] = peer_us[i];
  const auto peered = from_google_benchmark(with_peer, 2).at(0);
  EXPECT_EQ(peered.peer, "c10d::ProcessGroupGloo allreduce (sum)");
  EXPECT_EQ(peered.peer_time_us.samples, (std::vector<double>{300, 100, 200}));
  EXPECT_EQ(peered.peer_time_us.summary.median, 200);
  RunT pr;
  pr.benchmarks.push_back(peered);
  const RunT pback = run_from_json(json::parse(json::dump(to_json(pr))));
  EXPECT_EQ(pback.benchmarks.at(0).peer, peered.peer);
  EXPECT_EQ(pback.benchmarks.at(0).peer_time_us.samples, peered.peer_time_us.samples);
  EXPECT_TRUE(back.benchmarks[0].peer.empty()) << "a run without a peer reads back without one";
  EXPECT_FALSE(to_json(r)["benchmarks"][0].contains("peer_time_us"));
  // Named in the context but missing from a repetition: an error, not a 0.
  with_peer["benchmarks"][1].erase("peer_us");
  EXPECT_THROW(from_google_benchmark(with_peer, 2), Error);

  // Google Benchmark writes non-finite aggregates bare.
  const auto odd = json::parse_benchmark(
      R"({"a": NaN, "b": -nan, "c": inf, "d": -Infinity, "e": 1, "f": "nan inf", "g": "q\"NaN"})");
  EXPECT_TRUE(std::isnan(json::to_double(odd.at("a"))));
  EXPECT_TRUE(std::isnan(json::to_double(odd.at("b"))));
  EXPECT_EQ(json::to_double(odd.at("c")), HUGE_VAL);
  EXPECT_EQ(json::to_double(odd.at("d")), -HUGE_VAL);
  EXPECT_EQ(odd.at("e").get<int64_t>(), 1);
  // Inside strings the words stay as they are.
  EXPECT_EQ(odd.at("f").get<std::string>(), "nan inf");
  EXPECT_EQ(odd.at("g").get<std::string>(), "q\"NaN");
  // Without the pre-pass the same text is rejected as JSON.
  EXPECT_THROW(json::parse(R"({"a": NaN})"), Error);
}

// A DOM as a browser would serialize it, drawn from `runs` by hand.
std::string dom_of(const std::vector<RunT>& runs, bool drop_one, double off_by) {
  std::string dom = "<html><body><svg>";
  auto circle = [&](const std::string& plot, const std::string& which, const std::string& key, double v) {
    dom += "<circle cx=\"10\" cy=\"20\" r=\"3\" class=\"point\" data-plot=\"" + plot + "\" " +
           (plot == "time" ? "data-series" : "data-run") + "=\"" + which + "\" data-key=\"" + key +
           "\" data-value=\"" + std::to_string(v) + "\"><title>t</title></circle>";
  };
  for (const auto& b : runs.back().benchmarks) {
    circle("time", "partita", b.key(), b.time_us.summary.median + off_by);
    circle("time", "mpi", b.key(), b.mpi_time_us.summary.median);
    if (!b.peer.empty()) circle("time", "peer", b.key(), b.peer_time_us.summary.median);
  }
  for (size_t i = 0; i < runs.size(); ++i)
    for (size_t j = 0; j < runs[i].benchmarks.size(); ++j)
      if (!(drop_one && i == 0 && j == 0))
        circle("ratio", std::to_string(i), runs[i].benchmarks[j].key(), runs[i].benchmarks[j].ratio.summary.median);
  return dom + "</svg></body></html>";
}

TEST(Dashboard, CheckFindsMissingAndWrongPoints) {
  // Round values (std::to_string keeps 6 decimals).
  RunT a, b;
  for (RunT* r : {&a, &b}) {
    BenchResult x;
    x.name = "p_fwd/4096";
    x.primitive = "p_fwd";
    x.ranks = 2;
    x.time_us = {{5}, summarize({5})};
    x.mpi_time_us = {{2}, summarize({2})};
    x.ratio = {{2.5}, summarize({2.5})};
    r->benchmarks.push_back(x);
  }
  const std::vector<RunT> runs{a, b};
  EXPECT_TRUE(verify_dashboard_dom(dom_of(runs, false, 0), runs).empty());
  EXPECT_EQ(verify_dashboard_dom(dom_of(runs, true, 0), runs).size(), 1u);
  EXPECT_EQ(verify_dashboard_dom(dom_of(runs, false, 1), runs).size(), 1u);
  EXPECT_FALSE(verify_dashboard_dom("<html></html>", runs).empty());
  // With a peer line in the latest run, its point is required too.
  std::vector<RunT> peered = runs;
  peered.back().benchmarks[0].peer = "c10d::ProcessGroupGloo allreduce (sum)";
  peered.back().benchmarks[0].peer_time_us = {{40}, summarize({40})};
  EXPECT_TRUE(verify_dashboard_dom(dom_of(peered, false, 0), peered).empty());
  const auto without_peer_point = verify_dashboard_dom(dom_of(runs, false, 0), peered);
  ASSERT_EQ(without_peer_point.size(), 1u);
  EXPECT_NE(without_peer_point[0].find("missing point time|peer|p_fwd/4096@2"), std::string::npos)
      << without_peer_point[0];
  // The generated page embeds the data and no template marker.
  const std::string html = dashboard_html(runs);
  EXPECT_EQ(html.find("/*PARTITA_RUNS*/"), std::string::npos);
  EXPECT_NE(html.find("\"p_fwd/4096\""), std::string::npos);
}

}  // namespace
}  // namespace partita::perf
