// The regression gate: a run against a baseline run, benchmark by
// benchmark (same name and rank count), on partita's time per call and on
// its ratio to the raw-MPI twin measured in the same run.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "results.hpp"

namespace partita::perf {

struct GateOptions {
  double threshold = 0.10;  // relative change of the median that matters
  double alpha = 0.05;      // significance of the Mann-Whitney U test
  // Also gate on partita's absolute time per call. Off by default: a time
  // only compares with one measured on the same host under the same load
  // (issue 34: figures of one machine did not hold on another of the same
  // kind), where the ratio to the raw-MPI twin is timed in the same
  // iterations of the same run. For a baseline and a run of one host.
  bool gate_time = false;
};

// One metric of one benchmark: baseline and run medians, relative change,
// p-value, and the verdict: "slower" (p < alpha and change > threshold),
// "faster" (p < alpha and change < -threshold) or "same".
struct Change {
  double base = 0, now = 0, change = 0, p = 1;
  std::string verdict = "same";
};

struct GateRow {
  std::string key;  // name@ranks
  Change time, ratio;
  bool regressed = false;
};

struct GateReport {
  std::vector<GateRow> rows;
  std::vector<std::string> only_in_baseline, only_in_run, warnings;
  bool failed = false;
};

Change compare(const Metric& base, const Metric& now, const GateOptions& o);
GateReport gate(const Run& baseline, const Run& run, const GateOptions& o);
void print_report(const GateReport& r, const GateOptions& o, std::ostream& out);

}  // namespace partita::perf
