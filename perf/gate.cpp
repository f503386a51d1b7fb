#include "gate.hpp"

#include <cstdio>
#include <set>

namespace partita::perf {

Change compare(const Metric& base, const Metric& now, const GateOptions& o) {
  Change c;
  c.base = base.summary.median;
  c.now = now.summary.median;
  c.change = c.base > 0 ? (c.now - c.base) / c.base : 0;
  c.p = mann_whitney_p(base.samples, now.samples);
  if (c.p < o.alpha && c.change > o.threshold) c.verdict = "slower";
  else if (c.p < o.alpha && c.change < -o.threshold) c.verdict = "faster";
  return c;
}

GateReport gate(const Run& baseline, const Run& run, const GateOptions& o) {
  GateReport r;
  if (o.gate_time && json::dump(baseline.machine) != json::dump(run.machine))
    r.warnings.push_back("the runs' machines differ (baseline " + json::dump(baseline.machine) +
                         ", run " + json::dump(run.machine) +
                         "): their times are not comparable, only their ratios");
  std::set<std::string> seen;
  for (const auto& b : baseline.benchmarks) {
    const BenchResult* n = run.find(b.key());
    if (!n) {
      r.only_in_baseline.push_back(b.key());
      continue;
    }
    seen.insert(b.key());
    GateRow row;
    row.key = b.key();
    row.time = compare(b.time_us, n->time_us, o);
    row.ratio = compare(b.ratio, n->ratio, o);
    row.regressed = row.ratio.verdict == "slower" || (o.gate_time && row.time.verdict == "slower");
    r.failed = r.failed || row.regressed;
    if (smallest_p(b.time_us.samples.size(), n->time_us.samples.size()) >= o.alpha)
      r.warnings.push_back(row.key + ": too few repetitions (" +
                           std::to_string(b.time_us.samples.size()) + " and " +
                           std::to_string(n->time_us.samples.size()) +
                           ") for the test to ever reach alpha; use --repetitions 5 or more");
    r.rows.push_back(row);
  }
  for (const auto& n : run.benchmarks)
    if (!seen.count(n.key())) r.only_in_run.push_back(n.key());
  return r;
}

void print_report(const GateReport& r, const GateOptions& o, std::ostream& out) {
  char line[512];
  std::snprintf(line, sizeof line, "%-40s %11s %11s %8s %7s %7s %7s %8s %7s  %s\n", "benchmark@ranks",
                "base us", "run us", "change", "p", "ratio0", "ratio1", "change", "p", "verdict");
  out << line;
  for (const auto& row : r.rows) {
    std::string verdict = row.regressed ? "REGRESSED" : "ok";
    if (row.time.verdict != "same") verdict += " (time " + row.time.verdict + ")";
    if (row.ratio.verdict != "same") verdict += " (ratio " + row.ratio.verdict + ")";
    std::snprintf(line, sizeof line, "%-40s %11.2f %11.2f %+7.1f%% %7.4f %7.3f %7.3f %+7.1f%% %7.4f  %s\n",
                  row.key.c_str(), row.time.base, row.time.now, 100 * row.time.change, row.time.p,
                  row.ratio.base, row.ratio.now, 100 * row.ratio.change, row.ratio.p, verdict.c_str());
    out << line;
  }
  for (const auto& k : r.only_in_baseline) out << "missing from the run: " << k << "\n";
  for (const auto& k : r.only_in_run) out << "new in the run (no baseline): " << k << "\n";
  for (const auto& w : r.warnings) out << "warning: " << w << "\n";
  out << (r.failed ? "GATE FAILED" : "GATE PASSED") << ": threshold " << 100 * o.threshold
      << "% on the median, Mann-Whitney U p < " << o.alpha << ", "
      << (o.gate_time ? "time per call and ratio to raw MPI"
                      : "ratios to raw MPI only (times shown, not gated; --time gates them for "
                        "runs of one host)")
      << "\n";
}

}  // namespace partita::perf
