// Statistics for the regression gate: summaries of repetitions and the
// Mann-Whitney U test (what Google Benchmark's compare.py uses to tell a
// change from noise).
#pragma once

#include <cstddef>
#include <vector>

namespace partita::perf {

struct Summary {
  double median = 0, min = 0, max = 0;
  size_t reps = 0;
};
Summary summarize(std::vector<double> samples);

// Two-sided p-value of the Mann-Whitney U test of samples a and b (are they
// drawn from one distribution?). Exact when there are no ties and both
// samples have at most 20 values; otherwise the normal approximation with
// tie and continuity corrections. 1 when either sample is empty.
double mann_whitney_p(const std::vector<double>& a, const std::vector<double>& b);

// The smallest p-value the test can give for samples of these sizes
// (complete separation): below alpha, or a regression can never be shown.
double smallest_p(size_t n1, size_t n2);

}  // namespace partita::perf
