// One benchmark run as partita records it (docs/performance.md): the
// commit, date and machine, and per benchmark and rank count the
// repetitions of partita's time per call, its raw-MPI twin's, their ratio,
// a peer library's time where there is one,
// bytes/s and peak resident memory. Read from Google Benchmark's JSON
// output of bench_primitives; written and read as partita-perf/1 JSON.
#pragma once

#include <string>
#include <vector>

#include "partita/json.hpp"
#include "stats.hpp"

namespace partita::perf {

struct Metric {
  std::vector<double> samples;  // one per repetition
  Summary summary;              // of the samples
};

struct BenchResult {
  std::string name;       // "all_sum_reduce_fwd/4096"
  std::string primitive;  // "all_sum_reduce_fwd"
  int64_t bytes = 0;
  int ranks = 0;
  std::string twin;  // the raw-MPI twin's description
  Metric time_us, mpi_time_us, ratio, bytes_per_second;
  // A third library's call on the same bytes in the same loop (LibTorch's
  // c10d Gloo collectives); `peer` is empty where the benchmark has none.
  std::string peer;
  Metric peer_time_us;
  // Over the repetitions: the largest peak resident memory of any rank,
  // of the rank with the smallest peak, and the largest growth over what
  // the rank held before the benchmark (MiB).
  double peak_rss_mib = 0, peak_rss_mib_min_rank = 0, rss_growth_mib = 0;

  std::string key() const { return name + "@" + std::to_string(ranks); }
  // Adds another run's repetitions of the same benchmark.
  void absorb(const BenchResult& other);
};

struct Run {
  std::string commit, date;
  json::Value machine;   // host, cores, mpi_library, libtorch, mhz_per_cpu
  json::Value settings;  // min_time, repetitions, ranks, filter
  std::vector<BenchResult> benchmarks;

  const BenchResult* find(const std::string& key) const;
};

// The benchmarks of one Google Benchmark JSON document (one mpiexec run at
// `ranks` ranks, with repetitions reported individually).
std::vector<BenchResult> from_google_benchmark(const json::Value& doc, int ranks);
// Machine facts from a Google Benchmark document's context.
json::Value machine_of(const json::Value& doc);

json::Value to_json(const Run& run);
Run run_from_json(const json::Value& v);  // throws partita::Error
Run read_run(const std::string& path);
void write_run(const Run& run, const std::string& path);

// The runs of files and of every *.json in directories, oldest first (by
// date; files of one directory in name order before that).
std::vector<Run> read_runs(const std::vector<std::string>& files_or_dirs);

std::string read_file(const std::string& path);  // throws partita::Error

}  // namespace partita::perf
