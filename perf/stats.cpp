#include "stats.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace partita::perf {

Summary summarize(std::vector<double> v) {
  Summary s;
  s.reps = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  s.min = v.front();
  s.max = v.back();
  return s;
}

namespace {

// counts[u]: the number of orderings of m values of one sample and n of the
// other (no ties) whose U statistic is u; the recurrence on whether the
// largest value belongs to the first sample.
std::vector<double> u_distribution(size_t m, size_t n) {
  // table[i][j] is the distribution for (i, j), built up row by row.
  std::vector<std::vector<std::vector<double>>> t(m + 1, std::vector<std::vector<double>>(n + 1));
  for (size_t i = 0; i <= m; ++i)
    for (size_t j = 0; j <= n; ++j) {
      auto& d = t[i][j];
      d.assign(i * j + 1, 0.0);
      if (i == 0 || j == 0) {
        d[0] = 1;
        continue;
      }
      // Largest from the first sample: it beats all j of the second.
      const auto& a = t[i - 1][j];
      for (size_t u = 0; u < a.size(); ++u) d[u + j] += a[u];
      const auto& b = t[i][j - 1];
      for (size_t u = 0; u < b.size(); ++u) d[u] += b[u];
    }
  return t[m][n];
}

}  // namespace

double mann_whitney_p(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n1 = a.size(), n2 = b.size();
  if (n1 == 0 || n2 == 0) return 1;
  // Ranks of the pooled sample, ties sharing their mean rank.
  std::vector<std::pair<double, int>> pooled;
  for (double x : a) pooled.push_back({x, 0});
  for (double x : b) pooled.push_back({x, 1});
  std::sort(pooled.begin(), pooled.end());
  const size_t n = pooled.size();
  double rank_sum_a = 0, tie_term = 0;
  bool ties = false;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && pooled[j + 1].first == pooled[i].first) ++j;
    const double mean_rank = (static_cast<double>(i) + static_cast<double>(j)) / 2 + 1;
    const double t = static_cast<double>(j - i + 1);
    if (t > 1) ties = true;
    tie_term += t * t * t - t;
    for (size_t k = i; k <= j; ++k)
      if (pooled[k].second == 0) rank_sum_a += mean_rank;
    i = j + 1;
  }
  const double u1 = rank_sum_a - static_cast<double>(n1 * (n1 + 1)) / 2;
  const double mn = static_cast<double>(n1 * n2);
  const double u = std::min(u1, mn - u1);
  if (!ties && n1 <= 20 && n2 <= 20) {
    const auto d = u_distribution(n1, n2);
    double total = 0, tail = 0;
    for (size_t k = 0; k < d.size(); ++k) {
      total += d[k];
      if (static_cast<double>(k) <= u + 1e-9) tail += d[k];
    }
    return std::min(1.0, 2 * tail / total);
  }
  const double nn = static_cast<double>(n);
  const double variance = mn / 12 * ((nn + 1) - tie_term / (nn * (nn - 1)));
  if (variance <= 0) return 1;
  const double z = std::max(0.0, std::abs(u1 - mn / 2) - 0.5) / std::sqrt(variance);
  return std::min(1.0, std::erfc(z / std::sqrt(2.0)));
}

double smallest_p(size_t n1, size_t n2) {
  if (n1 == 0 || n2 == 0) return 1;
  std::vector<double> a(n1), b(n2);
  for (size_t i = 0; i < n1; ++i) a[i] = static_cast<double>(i);
  for (size_t i = 0; i < n2; ++i) b[i] = static_cast<double>(n1 + i);
  return mann_whitney_p(a, b);
}

}  // namespace partita::perf
