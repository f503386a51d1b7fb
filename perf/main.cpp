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
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dashboard.hpp"
#include "gate.hpp"
#include "partita/cli.hpp"
#include "partita/errors.hpp"
#include "partita/shape.hpp"
#include "results.hpp"

namespace partita::perf {
namespace {

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

struct RunOptions {
  std::string ranks = "1,2";
  bool oversubscribed = false;
  int repetitions = 5;
  double min_time = 0.1;
  std::string filter = ".", out, bench = PARTITA_BENCH_BINARY, mpiexec = PARTITA_MPIEXEC;
  std::string like;  // a run file whose settings this run repeats
};

// `run --like FILE`: FILE's rank counts, passes, minimum time and filter
// (what a baseline was made with), each one unless the command line gave
// it, so that the run has the rows the gate compares FILE's with.
struct Given {
  bool ranks = false, repetitions = false, min_time = false, filter = false;
};
void take_settings(const std::string& file, const Given& given, RunOptions& o) {
  const Run like = read_run(file);
  const json::Value& s = like.settings;
  auto has = [&s](const char* key) { return s.is_object() && s.contains(key); };
  if (!has("ranks") || !has("filter"))
    throw Error(file + ": its settings name no rank counts or filter (a run file made by "
                       "`partita_perf run` has both)");
  if (!given.ranks) {
    std::string ranks;
    for (const auto& r : s["ranks"]) ranks += (ranks.empty() ? "" : ",") + std::to_string(r.get<int>());
    o.ranks = ranks;
    o.oversubscribed = false;  // (its 4 ranks, if any, are in the list)
  }
  if (!given.filter) o.filter = s["filter"].get<std::string>();
  if (!given.repetitions && has("repetitions")) o.repetitions = s["repetitions"].get<int>();
  if (!given.min_time && has("min_time")) o.min_time = json::to_double(s["min_time"]);
}

// lscpu's "Model name": the first "model name" line of /proc/cpuinfo
// ("unknown" where there is none). Google Benchmark's context has no CPU model.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  return "unknown";
}

int run(const RunOptions& o) {
  Ranks ranks = parse_ranks(o.ranks);
  if (o.oversubscribed) ranks.push_back(4);
  const int repetitions = o.repetitions;
  const std::string& filter = o.filter;
  const std::string& bench = o.bench;
  const std::string& mpiexec = o.mpiexec;
  std::ostringstream min_time_text;
  min_time_text << o.min_time;
  const std::string min_time = min_time_text.str();
  std::string out = o.out;
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
  settings["min_time"] = o.min_time;
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
      if (result.machine.is_null()) {
        result.machine = machine_of(doc);
        result.machine["cpu_model"] = cpu_model();
      }
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

int gate_command(const std::vector<std::string>& files, const GateOptions& o) {
  const Run base = read_run(files[0]), now = read_run(files[1]);
  std::cout << "baseline " << files[0] << " (commit " << base.commit << ", " << base.date << ")\n"
            << "run      " << files[1] << " (commit " << now.commit << ", " << now.date << ")\n";
  const GateReport r = gate(base, now, o);
  print_report(r, o, std::cout);
  return r.failed ? 1 : 0;
}

int dashboard_command(const std::vector<std::string>& where, const std::string& out) {
  const auto runs = read_runs(where);
  std::ofstream f(out);
  f << dashboard_html(runs);
  if (!f) throw Error("cannot write " + out);
  std::cout << "wrote " << out << " (" << runs.size() << " runs)\n";
  return 0;
}

int verify_command(const std::string& dom, const std::vector<std::string>& where) {
  const auto runs = read_runs(where);
  const auto problems = verify_dashboard_dom(read_file(dom), runs);
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
int table_command(const std::string& file) {
  const Run r = read_run(file);
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
  CLI::App app{"partita_perf: benchmark runs, the regression gate and the dashboard"};
  app.require_subcommand(1);
  std::function<int()> action;

  auto ro = std::make_shared<RunOptions>();
  CLI::App* run_cmd = app.add_subcommand("run", "run the benchmarks under mpiexec into a run file");
  run_cmd->add_option("--ranks", ro->ranks, "rank counts")->check(partita::cli::ranks_list())
      ->capture_default_str();
  run_cmd->add_flag("--oversubscribed", ro->oversubscribed, "also run at 4 ranks");
  run_cmd->add_option("--repetitions", ro->repetitions, "passes over the whole suite")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  run_cmd->add_option("--min-time", ro->min_time, "Google Benchmark's --benchmark_min_time")
      ->check(CLI::PositiveNumber)->capture_default_str();
  run_cmd->add_option("--filter", ro->filter, "Google Benchmark's --benchmark_filter")
      ->capture_default_str();
  run_cmd->add_option("--out", ro->out, "the run file (default: perf/history/DATE_COMMIT.json)");
  run_cmd->add_option("--bench", ro->bench, "the benchmark program")->check(CLI::ExistingFile)
      ->capture_default_str();
  run_cmd->add_option("--mpiexec", ro->mpiexec, "MPICH's mpiexec")->capture_default_str();
  run_cmd->add_option("--like", ro->like,
                      "a run file (the baseline) whose rank counts, passes, min time and filter "
                      "this run takes, where not given here")
      ->check(CLI::ExistingFile);
  run_cmd->callback([ro, run_cmd, &action] {
    Given given;
    given.ranks = run_cmd->count("--ranks") > 0 || run_cmd->count("--oversubscribed") > 0;
    given.repetitions = run_cmd->count("--repetitions") > 0;
    given.min_time = run_cmd->count("--min-time") > 0;
    given.filter = run_cmd->count("--filter") > 0;
    action = [ro, given] {
      if (!ro->like.empty()) take_settings(ro->like, given, *ro);
      return run(*ro);
    };
  });

  auto go = std::make_shared<GateOptions>();
  auto gate_files = std::make_shared<std::vector<std::string>>();
  CLI::App* gate_cmd = app.add_subcommand(
      "gate", "compare a run with a baseline; exit status 1 on a regression");
  gate_cmd->add_option("files", *gate_files, "BASELINE.json RUN.json")
      ->required()->expected(2)->check(CLI::ExistingFile);
  gate_cmd->add_option("--threshold", go->threshold, "the slowdown that counts as a regression")
      ->check(CLI::PositiveNumber)->capture_default_str();
  gate_cmd->add_option("--alpha", go->alpha, "the significance level of the test")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  gate_cmd->add_flag("--time", go->gate_time,
                     "also gate on partita's time per call (a baseline and run of one host)");
  // The default since issue 34; kept so that scripts written for it still run.
  gate_cmd->add_flag("--ratio-only", "gate on the ratio to raw MPI only (the default)");
  gate_cmd->callback([go, gate_files, &action] {
    action = [go, gate_files] { return gate_command(*gate_files, *go); };
  });

  auto dash_where = std::make_shared<std::vector<std::string>>();
  auto dash_out = std::make_shared<std::string>();
  CLI::App* dash_cmd = app.add_subcommand("dashboard", "draw the dashboard page from runs");
  dash_cmd->add_option("runs", *dash_where, "run files or directories of them")
      ->required()->check(CLI::ExistingPath);
  dash_cmd->add_option("--out", *dash_out, "the page to write")->required();
  dash_cmd->callback([dash_where, dash_out, &action] {
    action = [dash_where, dash_out] { return dashboard_command(*dash_where, *dash_out); };
  });

  auto verify_dom = std::make_shared<std::string>();
  auto verify_where = std::make_shared<std::vector<std::string>>();
  CLI::App* verify_cmd = app.add_subcommand(
      "verify-dashboard", "check a browser's DOM of the dashboard against the runs it draws");
  verify_cmd->add_option("dom", *verify_dom, "the DOM, as the browser dumped it")
      ->required()->check(CLI::ExistingFile);
  verify_cmd->add_option("runs", *verify_where, "run files or directories of them")
      ->required()->check(CLI::ExistingPath);
  verify_cmd->callback([verify_dom, verify_where, &action] {
    action = [verify_dom, verify_where] { return verify_command(*verify_dom, *verify_where); };
  });

  auto table_file = std::make_shared<std::string>();
  CLI::App* table_cmd = app.add_subcommand("table", "the markdown table docs/benchmarks.md quotes");
  table_cmd->add_option("run", *table_file, "a run file")->required()->check(CLI::ExistingFile);
  table_cmd->callback([table_file, &action] {
    action = [table_file] { return table_command(*table_file); };
  });

  const int parsed = partita::cli::parse(app, argc, argv);
  if (parsed >= 0) return parsed;
  try {
    return action();
  } catch (const std::exception& e) {
    std::cerr << "partita_perf " << app.get_subcommands().front()->get_name() << ": " << e.what()
              << "\n";
    return 2;
  }
}
