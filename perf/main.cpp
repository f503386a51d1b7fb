// partita_perf: benchmark runs, the regression gate and the dashboard
// (docs/performance.md). No MPI or LibTorch here: it runs bench_primitives
// under mpiexec and works on the JSON.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "dashboard.hpp"
#include "gate.hpp"
#include "partita/errors.hpp"
#include "partita/shape.hpp"
#include "results.hpp"

namespace partita::perf {
namespace {

const char* kUsage =
    "usage: partita_perf run [--ranks 1,2] [--oversubscribed] [--repetitions 5] [--min-time 0.1]\n"
    "                        [--filter REGEX] [--out FILE] [--bench PATH] [--mpiexec PATH]\n"
    "       partita_perf gate BASELINE.json RUN.json [--threshold 0.10] [--alpha 0.05] [--ratio-only]\n"
    "       partita_perf dashboard (DIR | RUN.json)... --out PAGE.html\n"
    "       partita_perf verify-dashboard DOM.html (DIR | RUN.json)...\n"
    "       partita_perf table RUN.json\n";

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string capture(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string commit_id() {
  if (const char* c = std::getenv("PARTITA_COMMIT")) return c;
  const std::string src = quote(PARTITA_SOURCE_DIR);
  std::string id = capture("git -C " + src + " rev-parse HEAD 2>/dev/null");
  if (id.empty()) return "unknown";
  if (!capture("git -C " + src + " status --porcelain --untracked-files=no 2>/dev/null").empty())
    id += "-dirty";
  return id;
}

std::string utc_now(const char* format) {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, format, std::gmtime(&t));
  return buf;
}

int run(const std::vector<std::string>& args) {
  Ranks ranks{1, 2};
  int repetitions = 5;
  std::string min_time = "0.1", filter = ".", out, bench = PARTITA_BENCH_BINARY,
              mpiexec = PARTITA_MPIEXEC;
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw Error(args[i] + " needs a value");
      return args[++i];
    };
    if (args[i] == "--ranks") ranks = parse_ranks(value());
    else if (args[i] == "--oversubscribed") ranks.push_back(4);
    else if (args[i] == "--repetitions") repetitions = std::stoi(value());
    else if (args[i] == "--min-time") min_time = value();
    else if (args[i] == "--filter") filter = value();
    else if (args[i] == "--out") out = value();
    else if (args[i] == "--bench") bench = value();
    else if (args[i] == "--mpiexec") mpiexec = value();
    else throw Error("unknown option " + args[i]);
  }
  if (repetitions < 1) throw Error("--repetitions must be at least 1");
  Run result;
  result.commit = commit_id();
  result.date = utc_now("%Y-%m-%dT%H:%M:%SZ");
  if (out.empty())
    out = std::string(PARTITA_SOURCE_DIR) + "/perf/history/" + utc_now("%Y%m%dT%H%M%SZ") + "_" +
          result.commit.substr(0, 7) + ".json";
  json::Value settings;
  settings["ranks"] = json::Value(ranks);
  settings["repetitions"] = repetitions;
  settings["repetitions_are"] = "passes over the whole suite";
  settings["min_time"] = std::stod(min_time);
  settings["filter"] = filter;
  if (const char* plant = std::getenv("PARTITA_BENCH_PLANT_SLOWDOWN"))
    settings["planted_slowdown"] = std::atof(plant);
  result.settings = settings;
  // A hang aborts with a message instead of waiting forever.
  setenv("PARTITA_WAIT_TIMEOUT", "300", 0);
  setenv("OMP_NUM_THREADS", "1", 0);
  const auto tmp = std::filesystem::temp_directory_path() /
                   ("partita_perf_" + std::to_string(::getpid()) + ".json");
  // Repetitions are passes: the whole suite runs `repetitions` times, one
  // repetition of each benchmark per pass, so a benchmark's samples are
  // minutes apart rather than back to back and the slow drift of a shared
  // machine shows up as spread, which the gate's test then accounts for.
  for (int n : ranks) {
    std::vector<BenchResult> merged;
    for (int pass = 0; pass < repetitions; ++pass) {
      const std::string cmd = quote(mpiexec) + " -n " + std::to_string(n) + " " + quote(bench) +
                              " --benchmark_min_time=" + quote(min_time) +
                              " --benchmark_filter=" + quote(filter) +
                              " --benchmark_out=" + quote(tmp.string()) +
                              " --benchmark_out_format=json --benchmark_format=json > /dev/null";
      std::cerr << "partita_perf: " << n << " rank(s), pass " << pass + 1 << " of " << repetitions
                << ": " << cmd << "\n";
      if (std::system(cmd.c_str()) != 0)
        throw Error("the benchmark run at " + std::to_string(n) + " ranks failed");
      const auto doc = json::parse_benchmark(read_file(tmp.string()), tmp.string());
      if (result.machine.is_null()) result.machine = machine_of(doc);
      auto got = from_google_benchmark(doc, n);
      if (pass == 0) {
        merged = std::move(got);
        continue;
      }
      if (got.size() != merged.size()) throw Error("passes ran different benchmarks");
      for (size_t i = 0; i < got.size(); ++i) merged[i].absorb(got[i]);
    }
    for (auto& b : merged) result.benchmarks.push_back(std::move(b));
  }
  std::filesystem::remove(tmp);
  write_run(result, out);
  std::cout << "wrote " << out << " (" << result.benchmarks.size() << " benchmarks, commit "
            << result.commit << ")\n";
  return 0;
}

int gate_command(const std::vector<std::string>& args) {
  GateOptions o;
  std::vector<std::string> files;
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> double {
      if (i + 1 >= args.size()) throw Error(args[i] + " needs a value");
      return std::stod(args[++i]);
    };
    if (args[i] == "--threshold") o.threshold = value();
    else if (args[i] == "--alpha") o.alpha = value();
    else if (args[i] == "--ratio-only") o.ratio_only = true;
    else if (args[i].rfind("--", 0) == 0) throw Error("unknown option " + args[i]);
    else files.push_back(args[i]);
  }
  if (files.size() != 2) throw Error("gate needs BASELINE.json and RUN.json");
  const Run base = read_run(files[0]), now = read_run(files[1]);
  std::cout << "baseline " << files[0] << " (commit " << base.commit << ", " << base.date << ")\n"
            << "run      " << files[1] << " (commit " << now.commit << ", " << now.date << ")\n";
  const GateReport r = gate(base, now, o);
  print_report(r, o, std::cout);
  return r.failed ? 1 : 0;
}

int dashboard_command(const std::vector<std::string>& args) {
  std::string out;
  std::vector<std::string> where;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--out" && i + 1 < args.size()) out = args[++i];
    else where.push_back(args[i]);
  }
  if (out.empty() || where.empty()) throw Error("dashboard needs runs and --out PAGE.html");
  const auto runs = read_runs(where);
  std::ofstream f(out);
  f << dashboard_html(runs);
  if (!f) throw Error("cannot write " + out);
  std::cout << "wrote " << out << " (" << runs.size() << " runs)\n";
  return 0;
}

int verify_command(const std::vector<std::string>& args) {
  if (args.size() < 2) throw Error("verify-dashboard needs DOM.html and the runs");
  const auto runs = read_runs(std::vector<std::string>(args.begin() + 1, args.end()));
  const auto problems = verify_dashboard_dom(read_file(args[0]), runs);
  size_t points = 0;
  for (const auto& r : runs) points += r.benchmarks.size();
  if (!runs.empty()) points += 2 * runs.back().benchmarks.size();
  for (const auto& p : problems) std::cout << "  " << p << "\n";
  std::cout << (problems.empty() ? "DASHBOARD OK: " : "DASHBOARD WRONG: ") << points
            << " data points expected from " << runs.size() << " runs, " << problems.size()
            << " problems\n";
  return problems.empty() ? 0 : 1;
}

// The markdown table docs/benchmarks.md quotes.
int table_command(const std::vector<std::string>& args) {
  if (args.size() != 1) throw Error("table needs RUN.json");
  const Run r = read_run(args[0]);
  std::cout << "| primitive | ranks | raw MPI twin | size | partita (us) | raw MPI (us) | ratio | difference (us) |\n"
            << "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |\n";
  char line[512];
  for (const auto& b : r.benchmarks) {
    const double ours = b.time_us.summary.median, raw = b.mpi_time_us.summary.median;
    const std::string size = b.bytes >= (1 << 20) ? std::to_string(b.bytes >> 20) + " MiB"
                                                  : std::to_string(b.bytes >> 10) + " KiB";
    std::snprintf(line, sizeof line, "| %s | %d | %s | %s | %.1f | %.1f | %.2f | %+.1f |\n",
                  b.primitive.c_str(), b.ranks, b.twin.c_str(), size.c_str(), ours, raw,
                  b.ratio.summary.median, ours - raw);
    std::cout << line;
  }
  std::cout << "\n(medians over " << r.settings.at("repetitions").get<int64_t>()
            << " repetitions of per-iteration medians; commit " << r.commit.substr(0, 7) << ", "
            << r.date << ")\n";
  return 0;
}

}  // namespace
}  // namespace partita::perf

int main(int argc, char** argv) {
  using namespace partita::perf;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  try {
    if (cmd == "run") return run(args);
    if (cmd == "gate") return gate_command(args);
    if (cmd == "dashboard") return dashboard_command(args);
    if (cmd == "verify-dashboard") return verify_command(args);
    if (cmd == "table") return table_command(args);
    std::cerr << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "partita_perf " << cmd << ": " << e.what() << "\n";
    return 2;
  }
}
