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
  v["median"] = m.summary.median;
  v["min"] = m.summary.min;
  v["max"] = m.summary.max;
  v["reps"] = static_cast<int64_t>(m.summary.reps);
  json::Value a = json::Value::array();
  for (double x : m.samples) a.push_back(x);
  v["samples"] = a;
  return v;
}

Metric metric_from(const json::Value& v) {
  std::vector<double> s;
  for (const auto& x : v.at("samples")) s.push_back(json::to_double(x));
  return metric(std::move(s));
}

double counter(const json::Value& b, const char* name) {
  return b.contains(name) ? json::to_double(b.at(name)) : 0;
}

}  // namespace

void BenchResult::absorb(const BenchResult& o) {
  if (o.key() != key()) throw Error("cannot merge " + o.key() + " into " + key());
  for (auto [mine, theirs] : {std::pair<Metric*, const Metric*>{&time_us, &o.time_us},
                              {&mpi_time_us, &o.mpi_time_us},
                              {&ratio, &o.ratio},
                              {&bytes_per_second, &o.bytes_per_second},
                              {&peer_time_us, &o.peer_time_us}}) {
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
  m["host"] = c.contains("host_name") ? c.at("host_name").get<std::string>() : "";
  m["cores"] = c.contains("num_cpus") ? c.at("num_cpus").get<int64_t>() : 0;
  m["mhz_per_cpu"] = c.contains("mhz_per_cpu") ? c.at("mhz_per_cpu").get<int64_t>() : 0;
  m["mpi_library"] = c.contains("mpi_library") ? c.at("mpi_library").get<std::string>() : "unknown";
  m["libtorch"] = c.contains("libtorch") ? c.at("libtorch").get<std::string>() : "unknown";
  return m;
}

std::vector<BenchResult> from_google_benchmark(const json::Value& doc, int ranks) {
  const auto& context = doc["context"];
  // Repetitions in order of appearance, grouped by benchmark.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const json::Value*>> reps;
  for (const auto& b : doc.at("benchmarks")) {
    if (b.contains("run_type") && b.at("run_type").get<std::string>() != "iteration") continue;
    if (b.contains("error_occurred") && b.at("error_occurred").get<bool>())
      throw Error("benchmark " + b.at("name").get<std::string>() + " failed: " +
                  (b.contains("error_message") ? b.at("error_message").get<std::string>() : "?"));
    std::string name = b.at("run_name").get<std::string>();
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
    r.twin = context.contains(twin_key) ? context.at(twin_key).get<std::string>() : "";
    const std::string peer_key = "peer:" + r.primitive;
    r.peer = context.contains(peer_key) ? context.at(peer_key).get<std::string>() : "";
    std::vector<double> t, m, q, bps, peer;
    for (const json::Value* b : reps[name]) {
      const double us = counter(*b, "partita_us");
      t.push_back(us);
      m.push_back(counter(*b, "mpi_us"));
      q.push_back(counter(*b, "ratio"));
      if (!r.peer.empty()) {
        if (!b->contains("peer_us"))
          throw Error("benchmark " + name + " has a peer (" + r.peer + ") but no peer_us counter");
        peer.push_back(counter(*b, "peer_us"));
      }
      bps.push_back(us > 0 ? static_cast<double>(r.bytes) / (us * 1e-6) : 0);
      r.peak_rss_mib = std::max(r.peak_rss_mib, counter(*b, "peak_rss_mib"));
      r.peak_rss_mib_min_rank = std::max(r.peak_rss_mib_min_rank, counter(*b, "peak_rss_mib_min_rank"));
      r.rss_growth_mib = std::max(r.rss_growth_mib, counter(*b, "rss_growth_mib"));
    }
    r.time_us = metric(t);
    r.mpi_time_us = metric(m);
    r.ratio = metric(q);
    r.bytes_per_second = metric(bps);
    if (!r.peer.empty()) r.peer_time_us = metric(peer);
    out.push_back(std::move(r));
  }
  return out;
}

json::Value to_json(const Run& run) {
  json::Value v;
  v["schema"] = kSchema;
  v["commit"] = run.commit;
  v["date"] = run.date;
  v["machine"] = run.machine;
  v["settings"] = run.settings;
  json::Value list = json::Value::array();
  for (const auto& b : run.benchmarks) {
    json::Value e;
    e["name"] = b.name;
    e["primitive"] = b.primitive;
    e["bytes"] = b.bytes;
    e["ranks"] = b.ranks;
    e["twin"] = b.twin;
    e["time_us"] = metric_json(b.time_us);
    e["mpi_time_us"] = metric_json(b.mpi_time_us);
    e["ratio"] = metric_json(b.ratio);
    e["bytes_per_second"] = metric_json(b.bytes_per_second);
    if (!b.peer.empty()) {  // absent in runs without a peer (and in every run before issue 34)
      e["peer"] = b.peer;
      e["peer_time_us"] = metric_json(b.peer_time_us);
    }
    e["peak_rss_mib"] = b.peak_rss_mib;
    e["peak_rss_mib_min_rank"] = b.peak_rss_mib_min_rank;
    e["rss_growth_mib"] = b.rss_growth_mib;
    list.push_back(e);
  }
  v["benchmarks"] = list;
  return v;
}

Run run_from_json(const json::Value& v) {
  if (!v.contains("schema") || v.at("schema").get<std::string>() != kSchema)
    throw Error(std::string("not a ") + kSchema + " result (no \"schema\": \"" + kSchema + "\")");
  Run r;
  r.commit = v.at("commit").get<std::string>();
  r.date = v.at("date").get<std::string>();
  r.machine = v["machine"];
  r.settings = v["settings"];
  for (const auto& e : v.at("benchmarks")) {
    BenchResult b;
    b.name = e.at("name").get<std::string>();
    b.primitive = e.at("primitive").get<std::string>();
    b.bytes = e.at("bytes").get<int64_t>();
    b.ranks = static_cast<int>(e.at("ranks").get<int64_t>());
    b.twin = e.at("twin").get<std::string>();
    b.time_us = metric_from(e["time_us"]);
    b.mpi_time_us = metric_from(e["mpi_time_us"]);
    b.ratio = metric_from(e["ratio"]);
    b.bytes_per_second = metric_from(e["bytes_per_second"]);
    if (e.contains("peer")) {
      b.peer = e.at("peer").get<std::string>();
      b.peer_time_us = metric_from(e.at("peer_time_us"));
    }
    b.peak_rss_mib = json::to_double(e.at("peak_rss_mib"));
    b.peak_rss_mib_min_rank = json::to_double(e.at("peak_rss_mib_min_rank"));
    b.rss_growth_mib = json::to_double(e.at("rss_growth_mib"));
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
    return run_from_json(json::parse(read_file(path), path));
  } catch (const nlohmann::json::exception& e) {
    // A missing key or a value of the wrong type in a well-formed file.
    throw Error(path + ": not a partita-perf result: " + e.what());
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

void write_run(const Run& run, const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream out(path);
  out << json::dump(to_json(run)) << "\n";
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
