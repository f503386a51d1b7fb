// smp's configuration (JSON, file, environment) and its rank layout: pure
// code, no MPI, no LibTorch.
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "partita/json.hpp"
#include "partita/smp.hpp"

namespace partita::smp {

namespace {

// Every schedule name, smp's (SageMaker's words) and
// torch.distributed.pipelining's, with smp's name of the same schedule.
struct PipelineName {
  const char* name;
  const char* smp;
};
constexpr PipelineName kPipelines[] = {
    {"interleaved", "interleaved"},  {"1f1b", "interleaved"},
    {"simple", "simple"},            {"gpipe", "simple"},
    {"zero_bubble", "zero_bubble"},  {"zbh1", "zero_bubble"},          {"zb_h1", "zero_bubble"},
    {"interleaved_virtual", "interleaved_virtual"}, {"interleaved1f1b", "interleaved_virtual"},
    {"interleaved_1f1b", "interleaved_virtual"}};
constexpr const char* kPipelineNames =
    "\"interleaved\" (or \"1F1B\"), \"simple\" (or \"GPipe\"), \"zero_bubble\" (or \"ZBH1\") or "
    "\"interleaved_virtual\" (or \"Interleaved1F1B\")";

[[noreturn]] void field_error(const std::string& source, const std::string& field, const std::string& expected,
                              const json::Value& got) {
  throw ConfigError(source + ": field \"" + field + "\": expected " + expected + ", got " + json::dump(got));
}

int positive(const std::string& source, const char* field, const json::Value& v) {
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 30))
    field_error(source, field, "a positive integer", v);
  return static_cast<int>(v.get<int64_t>());
}

}  // namespace

std::string canonical_pipeline(const std::string& name) {
  std::string lower = name;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& p : kPipelines)
    if (lower == p.name) return p.smp;
  return "";
}

const char* pipeline_names() { return kPipelineNames; }

Config& Config::pipeline(const std::string& name) {
  const std::string smp = canonical_pipeline(name);
  pipeline_ = smp.empty() ? name : smp;
  return *this;
}

const char* name(CommGroup group) {
  switch (group) {
    case CommGroup::WORLD: return "WORLD";
    case CommGroup::MP_GROUP: return "MP_GROUP";
    case CommGroup::DP_GROUP: return "DP_GROUP";
    case CommGroup::TP_GROUP: return "TP_GROUP";
    case CommGroup::PP_GROUP: return "PP_GROUP";
  }
  return "an unknown CommGroup";
}

const char* name(RankType type) {
  switch (type) {
    case RankType::WORLD_RANK: return "WORLD_RANK";
    case RankType::MP_RANK: return "MP_RANK";
    case RankType::DP_RANK: return "DP_RANK";
    case RankType::TP_RANK: return "TP_RANK";
    case RankType::PP_RANK: return "PP_RANK";
  }
  return "an unknown RankType";
}

Config Config::from_json(const std::string& text, const std::string& source) {
  json::Value doc;
  try {
    doc = json::parse(text, source);
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
  if (!doc.is_object())
    throw ConfigError(source + ": expected an object {\"partitions\": N, \"tensor_parallel_degree\": T, "
                               "\"microbatches\": M, "
                               "\"pipeline\": " + std::string(kPipelineNames) + ", \"ddp\": true|false, "
                               "\"virtual_pipeline_model_parallel_size\": V}, got " +
                      json::dump(doc));
  Config c;
  for (const auto& [key, v] : doc.items()) {
    if (key == "partitions") {
      c.partitions(positive(source, "partitions", v));
    } else if (key == "tensor_parallel_degree") {
      c.tensor_parallel_degree(positive(source, "tensor_parallel_degree", v));
    } else if (key == "microbatches") {
      c.microbatches(positive(source, "microbatches", v));
    } else if (key == "pipeline") {
      if (!v.is_string()) field_error(source, "pipeline", kPipelineNames, v);
      if (canonical_pipeline(v.get<std::string>()).empty()) field_error(source, "pipeline", kPipelineNames, v);
      c.pipeline(v.get<std::string>());
    } else if (key == "virtual_pipeline_model_parallel_size") {
      c.virtual_pipeline_model_parallel_size(positive(source, "virtual_pipeline_model_parallel_size", v));
    } else if (key == "ddp") {
      if (!v.is_boolean()) field_error(source, "ddp", "a boolean", v);
      c.ddp(v.get<bool>());
    } else {
      throw ConfigError(source + ": field \"" + key +
                        "\": unknown (expected partitions, tensor_parallel_degree, microbatches, pipeline, ddp, "
                        "virtual_pipeline_model_parallel_size)");
    }
  }
  return c;
}

Config Config::from_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open the smp configuration file");
  std::ostringstream text;
  text << in.rdbuf();
  return from_json(text.str(), path);
}

Config Config::from_environment() {
  const char* v = std::getenv(kConfigVariable);
  if (!v) return Config{};
  return from_json(v, std::string("$") + kConfigVariable);
}

std::string Config::to_json() const {
  json::Value doc;
  doc["partitions"] = partitions_;
  // Only when set: a configuration without tensor parallelism reads as it
  // did before the field existed.
  if (tensor_parallel_degree_ != 1) doc["tensor_parallel_degree"] = tensor_parallel_degree_;
  doc["microbatches"] = microbatches_;
  doc["pipeline"] = pipeline_;
  doc["ddp"] = ddp_;
  if (virtual_pipeline_model_parallel_size_ != 1)
    doc["virtual_pipeline_model_parallel_size"] = virtual_pipeline_model_parallel_size_;
  return json::dump(doc);
}

void Config::validate(int world_size) const {
  const std::string what = "smp configuration " + to_json() + " on " + std::to_string(world_size) + " processes: ";
  if (partitions_ < 1) throw ConfigError(what + "partitions must be at least 1");
  if (tensor_parallel_degree_ < 1) throw ConfigError(what + "tensor_parallel_degree must be at least 1");
  if (microbatches_ < 1) throw ConfigError(what + "microbatches must be at least 1");
  if (canonical_pipeline(pipeline_).empty())
    throw ConfigError(what + "unknown pipeline \"" + pipeline_ + "\" (expected " + kPipelineNames + ")");
  if (virtual_pipeline_model_parallel_size_ < 1)
    throw ConfigError(what + "virtual_pipeline_model_parallel_size must be at least 1");
  if (static_cast<int64_t>(partitions_) * virtual_pipeline_model_parallel_size_ > (1 << 20))
    throw ConfigError(what + "partitions x virtual_pipeline_model_parallel_size = " +
                      std::to_string(static_cast<int64_t>(partitions_) * virtual_pipeline_model_parallel_size_) +
                      " stages, above 2^20 (1048576)");
  if (virtual_pipeline_model_parallel_size_ > 1 && pipeline_ != "interleaved_virtual")
    throw ConfigError(what + "virtual_pipeline_model_parallel_size " +
                      std::to_string(virtual_pipeline_model_parallel_size_) + " needs the pipeline \"interleaved_virtual\" (the "
                      "only schedule with virtual stages), not \"" + pipeline_ + "\"");
  if (tensor_parallel_degree_ == 1) {
    if (world_size % partitions_ != 0)
      throw ConfigError(what + "the world of " + std::to_string(world_size) + " processes is not divisible into " +
                        std::to_string(partitions_) + " partitions");
    if (!ddp_ && world_size != partitions_)
      throw ConfigError(what + "with ddp off the world must be exactly the " + std::to_string(partitions_) +
                        " partitions (dp_size " + std::to_string(world_size / partitions_) + " needs ddp on)");
    return;
  }
  const long long mp = static_cast<long long>(partitions_) * tensor_parallel_degree_;
  const std::string replica = std::to_string(partitions_) + " partitions x tensor_parallel_degree " +
                              std::to_string(tensor_parallel_degree_) + " = " + std::to_string(mp) + " processes";
  if (world_size % mp != 0)
    throw ConfigError(what + "the world of " + std::to_string(world_size) +
                      " processes is not divisible into model replicas of " + replica);
  if (!ddp_ && world_size != mp)
    throw ConfigError(what + "with ddp off the world must be exactly one model replica of " + replica + " (dp_size " +
                      std::to_string(world_size / mp) + " needs ddp on)");
}

int Config::mp_size() const { return partitions_ * tensor_parallel_degree_; }

Layout::Layout(int size, int mp_size) : size_(size), mp_size_(mp_size) {
  if (size < 1 || mp_size < 1 || size % mp_size != 0)
    throw ConfigError("smp layout: " + std::to_string(size) + " processes cannot hold model replicas of " +
                      std::to_string(mp_size) + " partitions");
}

Layout::Layout(int size, int pp_size, int tp_size) : size_(size), mp_size_(0), tp_size_(tp_size) {
  const long long mp = static_cast<long long>(pp_size) * tp_size;
  if (size < 1 || pp_size < 1 || tp_size < 1 || mp > size || size % mp != 0)
    throw ConfigError("smp layout: " + std::to_string(size) + " processes cannot hold model replicas of " +
                      std::to_string(pp_size) + " pipeline stages x " + std::to_string(tp_size) +
                      " tensor-parallel ranks");
  mp_size_ = static_cast<int>(mp);
}

RankPlace Layout::place(int rank) const {
  if (rank < 0 || rank >= size_)
    throw UsageError("smp layout: rank " + std::to_string(rank) + " is not in a world of " + std::to_string(size_));
  RankPlace p;
  p.rank = rank;
  p.mp_rank = rank % mp_size_;
  p.dp_rank = rank / mp_size_;
  p.tp_rank = p.mp_rank % tp_size_;
  p.pp_rank = p.mp_rank / tp_size_;
  p.mp_group = members(rank, CommGroup::MP_GROUP);
  p.dp_group = members(rank, CommGroup::DP_GROUP);
  p.tp_group = members(rank, CommGroup::TP_GROUP);
  p.pp_group = members(rank, CommGroup::PP_GROUP);
  return p;
}

int Layout::world_rank(int from, int rank, RankType type) const {
  const int mp_rank = from % mp_size_, dp_rank = from / mp_size_;
  const int tp_rank = mp_rank % tp_size_, pp_rank = mp_rank / tp_size_;
  auto check = [&](int n) {
    if (rank < 0 || rank >= n) {
      const char* in = type == RankType::WORLD_RANK ? "the world has "
                       : type == RankType::MP_RANK  ? "the mp group has "
                       : type == RankType::DP_RANK  ? "the dp group has "
                       : type == RankType::TP_RANK  ? "the tp group has "
                                                    : "the pp group has ";
      throw UsageError("smp: " + std::string(name(type)) + " " + std::to_string(rank) + " does not exist (" + in +
                       std::to_string(n) + " ranks)");
    }
  };
  switch (type) {
    case RankType::WORLD_RANK: check(size_); return rank;
    case RankType::MP_RANK: check(mp_size_); return dp_rank * mp_size_ + rank;
    case RankType::DP_RANK: check(dp_size()); return rank * mp_size_ + mp_rank;
    case RankType::TP_RANK: check(tp_size_); return dp_rank * mp_size_ + pp_rank * tp_size_ + rank;
    case RankType::PP_RANK: check(pp_size()); return dp_rank * mp_size_ + rank * tp_size_ + tp_rank;
  }
  throw UsageError("smp: unknown RankType " + std::to_string(static_cast<int>(type)));
}

std::vector<int> Layout::members(int from, CommGroup group) const {
  std::vector<int> out;
  switch (group) {
    case CommGroup::WORLD:
      for (int r = 0; r < size_; ++r) out.push_back(r);
      return out;
    case CommGroup::MP_GROUP:
      for (int i = 0; i < mp_size_; ++i) out.push_back(from / mp_size_ * mp_size_ + i);
      return out;
    case CommGroup::DP_GROUP:
      for (int i = 0; i < dp_size(); ++i) out.push_back(i * mp_size_ + from % mp_size_);
      return out;
    case CommGroup::TP_GROUP:
      for (int i = 0; i < tp_size_; ++i) out.push_back(from / tp_size_ * tp_size_ + i);
      return out;
    case CommGroup::PP_GROUP:
      for (int i = 0; i < pp_size(); ++i) out.push_back(from / mp_size_ * mp_size_ + i * tp_size_ + from % tp_size_);
      return out;
  }
  throw UsageError("smp: unknown CommGroup " + std::to_string(static_cast<int>(group)));
}

std::vector<std::vector<int>> Layout::mp_groups() const {
  std::vector<std::vector<int>> out;
  for (int d = 0; d < dp_size(); ++d) out.push_back(members(d * mp_size_, CommGroup::MP_GROUP));
  return out;
}

std::vector<std::vector<int>> Layout::dp_groups() const {
  std::vector<std::vector<int>> out;
  for (int m = 0; m < mp_size_; ++m) out.push_back(members(m, CommGroup::DP_GROUP));
  return out;
}

std::vector<std::vector<int>> Layout::tp_groups() const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < size_; r += tp_size_) out.push_back(members(r, CommGroup::TP_GROUP));
  return out;
}

std::vector<std::vector<int>> Layout::pp_groups() const {
  std::vector<std::vector<int>> out;
  for (int d = 0; d < dp_size(); ++d)
    for (int t = 0; t < tp_size_; ++t) out.push_back(members(d * mp_size_ + t, CommGroup::PP_GROUP));
  return out;
}

}  // namespace partita::smp
