#include "results.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "partita/errors.hpp"

namespace partita::perf {

namespace {

constexpr const char* kSchema = "partita-perf/1";

Metric metric(std::vector<double> samples) {
  Metric m;
  m.summary = summarize(samples);
  m.samples = std::move(samples);
  return m;
}

json::Value metric_json(const Metric& m) {
  json::Value v;
  v.set("median", m.summary.median);
  v.set("min", m.summary.min);
  v.set("max", m.summary.max);
  v.set("reps", static_cast<int64_t>(m.summary.reps));
  json::Value a = json::Value::Array{};
  for (double x : m.samples) a.push_back(x);
  v.set("samples", a);
  return v;
}

Metric metric_from(const json::Value& v) {
  std::vector<double> s;
  for (const auto& x : v["samples"].as_array()) s.push_back(x.as_double());
  return metric(std::move(s));
}

double counter(const json::Value& b, const char* name) {
  return b.contains(name) ? b[name].as_double() : 0;
}

}  // namespace

void BenchResult::absorb(const BenchResult& o) {
  if (o.key() != key()) throw Error("cannot merge " + o.key() + " into " + key());
  for (auto [mine, theirs] : {std::pair<Metric*, const Metric*>{&time_us, &o.time_us},
                              {&mpi_time_us, &o.mpi_time_us},
                              {&ratio, &o.ratio},
                              {&bytes_per_second, &o.bytes_per_second}}) {
    mine->samples.insert(mine->samples.end(), theirs->samples.begin(), theirs->samples.end());
    mine->summary = summarize(mine->samples);
  }
  peak_rss_mib = std::max(peak_rss_mib, o.peak_rss_mib);
  peak_rss_mib_min_rank = std::max(peak_rss_mib_min_rank, o.peak_rss_mib_min_rank);
  rss_growth_mib = std::max(rss_growth_mib, o.rss_growth_mib);
}

const BenchResult* Run::find(const std::string& key) const {
  for (const auto& b : benchmarks)
    if (b.key() == key) return &b;
  return nullptr;
}

json::Value machine_of(const json::Value& doc) {
  const auto& c = doc["context"];
  json::Value m;
  m.set("host", c.contains("host_name") ? c["host_name"].as_string() : "");
  m.set("cores", c.contains("num_cpus") ? c["num_cpus"].as_int() : 0);
  m.set("mhz_per_cpu", c.contains("mhz_per_cpu") ? c["mhz_per_cpu"].as_int() : 0);
  m.set("mpi_library", c.contains("mpi_library") ? c["mpi_library"].as_string() : "unknown");
  m.set("libtorch", c.contains("libtorch") ? c["libtorch"].as_string() : "unknown");
  return m;
}

std::vector<BenchResult> from_google_benchmark(const json::Value& doc, int ranks) {
  const auto& context = doc["context"];
  // Repetitions in order of appearance, grouped by benchmark.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const json::Value*>> reps;
  for (const auto& b : doc["benchmarks"].as_array()) {
    if (b.contains("run_type") && b["run_type"].as_string() != "iteration") continue;
    if (b.contains("error_occurred") && b["error_occurred"].as_bool())
      throw Error("benchmark " + b["name"].as_string() + " failed: " +
                  (b.contains("error_message") ? b["error_message"].as_string() : "?"));
    std::string name = b["run_name"].as_string();
    const auto suffix = name.find("/manual_time");
    if (suffix != std::string::npos) name.erase(suffix);
    if (!reps.count(name)) order.push_back(name);
    reps[name].push_back(&b);
  }
  std::vector<BenchResult> out;
  for (const auto& name : order) {
    BenchResult r;
    r.name = name;
    const auto slash = name.find('/');
    r.primitive = name.substr(0, slash);
    r.bytes = slash == std::string::npos ? 0 : std::stoll(name.substr(slash + 1));
    r.ranks = ranks;
    const std::string twin_key = "twin:" + r.primitive;
    r.twin = context.contains(twin_key) ? context[twin_key].as_string() : "";
    std::vector<double> t, m, q, bps;
    for (const json::Value* b : reps[name]) {
      const double us = counter(*b, "partita_us");
      t.push_back(us);
      m.push_back(counter(*b, "mpi_us"));
      q.push_back(counter(*b, "ratio"));
      bps.push_back(us > 0 ? static_cast<double>(r.bytes) / (us * 1e-6) : 0);
      r.peak_rss_mib = std::max(r.peak_rss_mib, counter(*b, "peak_rss_mib"));
      r.peak_rss_mib_min_rank = std::max(r.peak_rss_mib_min_rank, counter(*b, "peak_rss_mib_min_rank"));
      r.rss_growth_mib = std::max(r.rss_growth_mib, counter(*b, "rss_growth_mib"));
    }
    r.time_us = metric(t);
    r.mpi_time_us = metric(m);
    r.ratio = metric(q);
    r.bytes_per_second = metric(bps);
    out.push_back(std::move(r));
  }
  return out;
}

json::Value to_json(const Run& run) {
  json::Value v;
  v.set("schema", kSchema);
  v.set("commit", run.commit);
  v.set("date", run.date);
  v.set("machine", run.machine);
  v.set("settings", run.settings);
  json::Value list = json::Value::Array{};
  for (const auto& b : run.benchmarks) {
    json::Value e;
    e.set("name", b.name);
    e.set("primitive", b.primitive);
    e.set("bytes", b.bytes);
    e.set("ranks", b.ranks);
    e.set("twin", b.twin);
    e.set("time_us", metric_json(b.time_us));
    e.set("mpi_time_us", metric_json(b.mpi_time_us));
    e.set("ratio", metric_json(b.ratio));
    e.set("bytes_per_second", metric_json(b.bytes_per_second));
    e.set("peak_rss_mib", b.peak_rss_mib);
    e.set("peak_rss_mib_min_rank", b.peak_rss_mib_min_rank);
    e.set("rss_growth_mib", b.rss_growth_mib);
    list.push_back(e);
  }
  v.set("benchmarks", list);
  return v;
}

Run run_from_json(const json::Value& v) {
  if (!v.contains("schema") || v["schema"].as_string() != kSchema)
    throw Error(std::string("not a ") + kSchema + " result (no \"schema\": \"" + kSchema + "\")");
  Run r;
  r.commit = v["commit"].as_string();
  r.date = v["date"].as_string();
  r.machine = v["machine"];
  r.settings = v["settings"];
  for (const auto& e : v["benchmarks"].as_array()) {
    BenchResult b;
    b.name = e["name"].as_string();
    b.primitive = e["primitive"].as_string();
    b.bytes = e["bytes"].as_int();
    b.ranks = static_cast<int>(e["ranks"].as_int());
    b.twin = e["twin"].as_string();
    b.time_us = metric_from(e["time_us"]);
    b.mpi_time_us = metric_from(e["mpi_time_us"]);
    b.ratio = metric_from(e["ratio"]);
    b.bytes_per_second = metric_from(e["bytes_per_second"]);
    b.peak_rss_mib = e["peak_rss_mib"].as_double();
    b.peak_rss_mib_min_rank = e["peak_rss_mib_min_rank"].as_double();
    b.rss_growth_mib = e["rss_growth_mib"].as_double();
    r.benchmarks.push_back(std::move(b));
  }
  return r;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

Run read_run(const std::string& path) {
  try {
    return run_from_json(json::parse(read_file(path)));
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

void write_run(const Run& run, const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream out(path);
  out << to_json(run).dump() << "\n";
  if (!out) throw Error("cannot write " + path);
}

std::vector<Run> read_runs(const std::vector<std::string>& files_or_dirs) {
  std::vector<std::string> paths;
  for (const auto& w : files_or_dirs) {
    if (!std::filesystem::is_directory(w)) {
      paths.push_back(w);
      continue;
    }
    std::vector<std::string> in_dir;
    for (const auto& e : std::filesystem::directory_iterator(w))
      if (e.path().extension() == ".json") in_dir.push_back(e.path().string());
    std::sort(in_dir.begin(), in_dir.end());
    paths.insert(paths.end(), in_dir.begin(), in_dir.end());
  }
  std::vector<Run> runs;
  for (const auto& p : paths) runs.push_back(read_run(p));
  std::stable_sort(runs.begin(), runs.end(),
                   [](const Run& a, const Run& b) { return a.date < b.date; });
  return runs;
}

}  // namespace partita::perf
