#include "partita/testing/case.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "partita/errors.hpp"
#include "partita/json.hpp"

namespace partita::testing {

namespace {

// One field of a case file being read. Every conversion that fails throws a
// CaseError of one form: `FILE: field "PATH": expected WHAT, got VALUE`.
struct Field {
  const std::string& source;
  std::string path;      // "P_x.shape", "local_shapes.3"
  const char* expected;  // "an array of positive integers"
  const json::Value& v;

  [[noreturn]] void fail(const std::string& why = "") const {
    throw CaseError(source + ": field \"" + path + "\": expected " + expected + ", got " +
                    json::dump(v) + why);
  }
  int64_t integer(int64_t min) const {
    if (!v.is_number_integer() || v.get<int64_t>() < min) fail();
    return v.get<int64_t>();
  }
  // An integer that is a rank, an axis or a rank count: at most 2^30 (a
  // larger one would wrap when held as an int).
  int small_integer(int64_t min) const {
    const int64_t x = integer(min);
    if (x > (1 << 30)) fail(" (above 2^30)");
    return static_cast<int>(x);
  }
  std::vector<int64_t> integers(int64_t min) const {
    if (!v.is_array()) fail();
    std::vector<int64_t> out;
    for (const auto& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < min) fail();
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
  std::vector<int> small_integers(int64_t min) const {
    std::vector<int> out;
    for (int64_t x : integers(min)) {
      if (x > (1 << 30)) fail(" (above 2^30)");
      out.push_back(static_cast<int>(x));
    }
    return out;
  }
  std::string text() const {
    if (!v.is_string()) fail();
    return v.get<std::string>();
  }
  bool flag() const {
    if (!v.is_boolean()) fail();
    return v.get<bool>();
  }
  // A member of this object; absent: the error says what was expected of it.
  Field member(const char* key, const char* member_expected) const {
    if (!v.is_object()) fail();
    if (!v.contains(key))
      throw CaseError(source + ": field \"" + path + "." + key + "\": expected " + member_expected +
                      ", but it is missing");
    return Field{source, path + "." + key, member_expected, v.at(key)};
  }
  // Keys of this object not in `known` are typos or fields of another version.
  void only(std::initializer_list<const char*> known) const {
    if (!v.is_object()) fail();
    // (No structured binding: clang before 16 cannot capture one in a
    // lambda, and the fuzz target builds this file with clang++-14.)
    for (const auto& item : v.items())
      if (const std::string& k = item.key();
          std::none_of(known.begin(), known.end(), [&](const char* n) { return k == n; }))
        throw CaseError(source + ": field \"" + path + "." + k + "\": unknown (expected " + expected +
                        ")");
  }
};

constexpr const char* kPrimitives[] = {"broadcast",      "sum_reduce",  "all_sum_reduce",
                                       "all_gather",     "reduce_scatter", "repartition",
                                       "transpose",      "halo_exchange",
                                       "linear",         "linear_all_gather",
                                       "linear_reduce_scatter", "linear_all_gather_zero",
                                       "linear_reduce_scatter_zero"};
constexpr const char* kDtypes[] = {"float32", "float",  "float64", "double", "bfloat16", "float16",
                                   "half",    "uint8",  "int8",    "int16",  "int32",    "int64"};
constexpr const char* kSpecExpected =
    "an object {\"ranks\": [non-negative integers], \"shape\": [positive integers]}";

template <size_t N>
bool one_of(const std::string& s, const char* const (&names)[N]) {
  return std::find(std::begin(names), std::end(names), s) != std::end(names);
}

PartitionSpec spec_from(const Field& f) {
  f.only({"ranks", "shape"});
  PartitionSpec s;
  const Field ranks = f.member("ranks", "an array of non-negative integers (world ranks)");
  s.ranks = ranks.small_integers(0);
  const Field shape = f.member("shape", "an array of positive integers");
  s.shape = shape.integers(1);
  // Extents are positive: a product that overflows is far above any rank
  // count (volume() itself would overflow; found by fuzz/case_reader_fuzz).
  int64_t product = 1;
  for (int64_t e : s.shape)
    if (__builtin_mul_overflow(product, e, &product))
      shape.fail(" (its volume exceeds 2^63; " + std::to_string(s.ranks.size()) + " ranks are listed)");
  if (volume(s.shape) != static_cast<int64_t>(s.ranks.size()))
    shape.fail(" (its volume " + std::to_string(volume(s.shape)) + " is not the " +
               std::to_string(s.ranks.size()) + " ranks listed)");
  return s;
}

json::Value spec_json(const PartitionSpec& s) {
  return json::Value{{"ranks", s.ranks}, {"shape", s.shape}};
}

GatherAxes& distdl_of(Case& c) {
  if (!c.distdl) c.distdl = GatherAxes{};
  return *c.distdl;
}

// The fields of a case file: one row each (name, what is expected, how it is
// read into the Case). A key not in this table is an error.
struct Rule {
  const char* name;
  const char* expected;
  void (*read)(const Field&, Case&);
};
const Rule kRules[] = {
    {"primitive",
     "one of \"broadcast\", \"sum_reduce\", \"all_sum_reduce\", \"all_gather\", \"reduce_scatter\", "
     "\"repartition\" (or \"transpose\"), \"halo_exchange\", \"linear\", \"linear_all_gather\", "
     "\"linear_reduce_scatter\", \"linear_all_gather_zero\", \"linear_reduce_scatter_zero\"",
     [](const Field& f, Case& c) {
       c.primitive = f.text();
       if (!one_of(c.primitive, kPrimitives)) f.fail();
       if (c.primitive == "transpose") c.primitive = "repartition";  // the seeds' name
     }},
    {"P_x", kSpecExpected, [](const Field& f, Case& c) { c.P_x = spec_from(f); }},
    {"P_y", kSpecExpected, [](const Field& f, Case& c) { c.P_y = spec_from(f); }},
    {"P_W", kSpecExpected, [](const Field& f, Case& c) { c.P_W = spec_from(f); }},
    {"out_features", "a positive integer (Linear layers)",
     [](const Field& f, Case& c) { c.out_features = f.integer(1); }},
    {"in_features", "a positive integer (Linear layers; default: global_shape's last extent)",
     [](const Field& f, Case& c) { c.in_features = f.integer(1); }},
    {"bias", "a boolean (Linear layers)", [](const Field& f, Case& c) { c.bias = f.flag(); }},
    {"in_place", "a boolean (halo_exchange)", [](const Field& f, Case& c) { c.in_place = f.flag(); }},
    {"axes", "an array of non-negative integers (dimensions of P_x)",
     [](const Field& f, Case& c) { c.axes = f.small_integers(0); }},
    {"axis", "a non-negative integer (a dimension of P_x)",
     [](const Field& f, Case& c) { c.axis = f.small_integer(0); }},
    {"dim", "a non-negative integer (a tensor dimension)",
     [](const Field& f, Case& c) { c.dim = f.integer(0); }},
    {"axes_all_gather", "an array of non-negative integers (dimensions of P_x; all_gather)",
     [](const Field& f, Case& c) { distdl_of(c).axes(f.small_integers(0)); }},
    {"axes_reduce_scatter", "an array of non-negative integers (dimensions of P_x; reduce_scatter)",
     [](const Field& f, Case& c) { distdl_of(c).axes(f.small_integers(0)); }},
    {"axes_keep", "an array of non-negative integers (dimensions of P_x)",
     [](const Field& f, Case& c) { distdl_of(c).axes_keep(f.small_integers(0)); }},
    {"scale_backward", "an array of non-negative integers (dimensions of P_x; all_gather)",
     [](const Field& f, Case& c) { distdl_of(c).scale_backward(f.small_integers(0)); }},
    {"left", "an array of non-negative integers (ghost widths)",
     [](const Field& f, Case& c) { c.left = f.integers(0); }},
    {"right", "an array of non-negative integers (ghost widths)",
     [](const Field& f, Case& c) { c.right = f.integers(0); }},
    {"options", "an object of booleans transpose_src, transpose_dest, preserve_batch",
     [](const Field& f, Case& c) {
       f.only({"transpose_src", "transpose_dest", "preserve_batch"});
       for (auto [key, flag] : {std::pair{"transpose_src", &c.options.transpose_src()},
                                {"transpose_dest", &c.options.transpose_dest()},
                                {"preserve_batch", &c.options.preserve_batch()}})
         if (f.v.contains(key)) *flag = f.member(key, "a boolean").flag();
     }},
    {"dtype",
     "one of \"float32\", \"float64\", \"bfloat16\", \"float16\", \"uint8\", \"int8\", \"int16\", "
     "\"int32\", \"int64\"",
     [](const Field& f, Case& c) {
       c.dtype = f.text();
       if (!one_of(c.dtype, kDtypes)) f.fail();
     }},
    {"global_shape", "an array of non-negative integers",
     [](const Field& f, Case& c) { c.global_shape = f.integers(0); }},
    {"local_shape", "an array of non-negative integers",
     [](const Field& f, Case& c) { c.local_shape = f.integers(0); }},
    {"local_shapes", "an object from world rank (\"0\", \"1\", ...) to an array of non-negative integers",
     [](const Field& f, Case& c) {
       if (!f.v.is_object()) f.fail();
       for (const auto& [k, s] : f.v.items()) {
         const Field shape{f.source, f.path + "." + k, "an array of non-negative integers", s};
         // One spelling per rank ("1", not " 1", "+1" or "01"): two keys
         // naming one rank would have one silently replace the other.
         const bool decimal = !k.empty() && k.size() <= 10 &&
                              std::all_of(k.begin(), k.end(), [](char d) { return d >= '0' && d <= '9'; }) &&
                              (k == "0" || k[0] != '0');
         if (!decimal || std::stoll(k) > (1 << 30))
           throw CaseError(f.source + ": field \"" + shape.path + "\": expected a world rank as key (0 to 2^30, "
                           "written without sign, blanks or leading zeros)");
         c.local_shapes[static_cast<int>(std::stoll(k))] = shape.integers(0);
       }
     }},
    {"ranks", "a positive integer (the world size)",
     [](const Field& f, Case& c) { c.ranks = f.small_integer(1); }},
    {"unused_outputs", "an array of world ranks (non-negative integers)",
     [](const Field& f, Case& c) { c.unused_outputs = f.small_integers(0); }},
    {"fill", "one of \"integers\", \"normal\" (what data_seed draws)",
     [](const Field& f, Case& c) {
       c.fill = f.text();
       if (c.fill != "integers" && c.fill != "normal") f.fail();
     }},
    {"data_seed", "a non-negative integer",
     [](const Field& f, Case& c) {
       // Seeds are 64-bit unsigned (property tests draw them over the whole range).
       if (f.v.is_number_unsigned()) c.data_seed = f.v.get<uint64_t>();
       else c.data_seed = static_cast<uint64_t>(f.integer(0));
     }},
};

const Rule& rule(const std::string& name) {
  for (const auto& r : kRules)
    if (name == r.name) return r;
  throw std::logic_error("case: no rule for " + name);
}

// The fields each primitive needs besides primitive and P_x.
std::vector<const char*> required_by(const std::string& primitive) {
  if (primitive == "all_sum_reduce") return {"axes"};
  if (primitive == "all_gather" || primitive == "reduce_scatter") return {"axis", "dim"};  // or DistDL's
  if (primitive == "halo_exchange") return {"left", "right"};
  if (primitive == "linear") return {"P_y", "P_W", "out_features"};
  if (primitive.rfind("linear_", 0) == 0) return {"out_features"};
  return {"P_y"};
}

bool along_one_axis(const std::string& p) { return p == "all_gather" || p == "reduce_scatter"; }

}  // namespace

Case Case::from_json(const json::Value& v, const std::string& source) {
  if (!v.is_object())
    throw CaseError(source + ": expected a JSON object (a case), got " + json::dump(v).substr(0, 60));
  Case c;
  for (const auto& item : v.items()) {
    const std::string& key = item.key();
    const auto& value = item.value();
    const auto it = std::find_if(std::begin(kRules), std::end(kRules),
                                 [&](const Rule& r) { return key == r.name; });
    if (it == std::end(kRules)) {
      std::string names;
      for (const auto& r : kRules) names += std::string(names.empty() ? "" : ", ") + r.name;
      throw CaseError(source + ": field \"" + key + "\": unknown (expected one of " + names + ")");
    }
    it->read(Field{source, key, it->expected, value}, c);
  }
  auto missing = [&](const char* name, const std::string& why) {
    throw CaseError(source + ": field \"" + name + "\": expected " + rule(name).expected + why +
                    ", but it is missing");
  };
  if (!v.contains("primitive")) missing("primitive", "");
  if (!v.contains("P_x")) missing("P_x", "");
  const bool distdl_form = c.distdl.has_value();
  for (const char* name : required_by(c.primitive))
    if (!v.contains(name) && !(distdl_form && along_one_axis(c.primitive)))
      missing(name, " (" + c.primitive + " needs it" +
                        (along_one_axis(c.primitive)
                             ? std::string(", or DistDL's axes_") + (c.primitive == "all_gather"
                                                                         ? "all_gather"
                                                                         : "reduce_scatter") +
                                   " or axes_keep"
                             : "") +
                        ")");
  if (distdl_form) {
    auto wrong = [&](const char* name, const std::string& why) {
      throw CaseError(source + ": field \"" + name + "\": " + why);
    };
    if (!along_one_axis(c.primitive))
      for (const char* k : {"axes_all_gather", "axes_reduce_scatter", "axes_keep", "scale_backward"})
        if (v.contains(k)) wrong(k, "only all_gather and reduce_scatter take it");
    for (const char* k : {"axis", "dim"})
      if (v.contains(k)) wrong(k, "not with DistDL's axes (axes_all_gather, axes_reduce_scatter, axes_keep)");
    if (c.primitive == "all_gather" && v.contains("axes_reduce_scatter"))
      wrong("axes_reduce_scatter", "all_gather takes axes_all_gather");
    if (c.primitive == "reduce_scatter" && v.contains("axes_all_gather"))
      wrong("axes_all_gather", "reduce_scatter takes axes_reduce_scatter");
  }

  if (c.is_linear()) {
    auto wrong = [&](const char* name, const std::string& why) {
      throw CaseError(source + ": field \"" + name + "\": " + why);
    };
    if (!v.contains("global_shape"))
      wrong("global_shape", "the Linear layers take x as the balanced decomposition of global_shape");
    if (c.global_shape->empty())
      wrong("global_shape", "the Linear layers need at least one dimension (in_features is the last "
                            "extent), got ()");
    // W is out_features x in_features: a product beyond 2^63 is no tensor.
    const int64_t in = c.in_features ? c.in_features : c.global_shape->back();
    if (int64_t w = 0; __builtin_mul_overflow(c.out_features, in, &w))
      wrong("out_features", "W's volume out_features x in_features (" + std::to_string(c.out_features) +
                                " x " + std::to_string(in) + ") exceeds 2^63");
    for (const char* k : {"local_shape", "local_shapes", "options", "axes", "axis", "dim", "left", "right"})
      if (v.contains(k)) wrong(k, "not a field of the Linear layers");
    if (c.dtype != "float32" && c.dtype != "float" && c.dtype != "float64" && c.dtype != "double" &&
        c.dtype != "bfloat16")
      wrong("dtype", "the Linear layers take float32, float64 or bfloat16, got \"" + c.dtype + "\"");
  } else {
    for (const char* k : {"P_W", "out_features", "in_features", "bias"})
      if (v.contains(k)) throw CaseError(source + ": field \"" + k + "\": only the Linear layers take it");
  }
  if (v.contains("in_place") && c.primitive != "halo_exchange")
    throw CaseError(source + ": field \"in_place\": only halo_exchange takes it");
  const int given = v.contains("global_shape") + v.contains("local_shape") + v.contains("local_shapes");
  if (given != 1)
    throw CaseError(source + ": fields \"global_shape\", \"local_shape\", \"local_shapes\": expected "
                    "exactly one of them, got " + std::to_string(given));
  auto bad = [&](const char* name, const std::string& what) {
    throw CaseError(source + ": field \"" + name + "\": " + what);
  };
  if (c.global_shape && c.global_shape->size() != c.P_x.shape.size())
    bad("global_shape", "expected " + std::to_string(c.P_x.shape.size()) +
                            " dimensions (as P_x.shape), got " + shape_string(*c.global_shape));
  // Every rank's shape has the same number of dimensions. That number is
  // the tensor's, not P_x's: a partition of fewer dimensions than the
  // tensor is read with leading ones (repartition, halo_exchange;
  // docs/primitives.md), and all_gather's tensor dimension is not a
  // partition dimension. The property tests' case lines draw both.
  for (const auto& [r, s] : c.local_shapes) {
    if (std::find(c.P_x.ranks.begin(), c.P_x.ranks.end(), r) == c.P_x.ranks.end())
      bad("local_shapes", "names rank " + std::to_string(r) + ", which is not in P_x.ranks");
    // (case_reader_fuzz: {"0": [3], "1": []} was accepted.)
    const auto& [r0, s0] = *c.local_shapes.begin();
    if (s.size() != s0.size())
      bad("local_shapes", "rank " + std::to_string(r) + "'s shape " + shape_string(s) + " has " +
                              std::to_string(s.size()) + " dimensions, rank " + std::to_string(r0) + "'s " +
                              shape_string(s0) + " " + std::to_string(s0.size()) +
                              " (every rank's shape has the same dimensions)");
  }
  // A tensor's volume beyond 2^63 wraps where LibTorch multiplies its
  // extents, and so do a halo window's extent and widths.
  auto fits = [&](const char* name, const Shape& s) {
    int64_t n = 1;
    for (int64_t e : s)
      if (__builtin_mul_overflow(n, e, &n))
        bad(name, "the volume of " + shape_string(s) + " exceeds 2^63");
  };
  if (c.global_shape) fits("global_shape", *c.global_shape);
  if (c.local_shape) fits("local_shape", *c.local_shape);
  for (const auto& item : c.local_shapes) fits("local_shapes", item.second);
  for (size_t d = 0; d < c.left.size() && d < c.right.size(); ++d) {
    const int64_t bulk = c.global_shape && d < c.global_shape->size() ? (*c.global_shape)[d] : 0;
    if (int64_t w = 0; __builtin_add_overflow(c.left[d], c.right[d], &w) || __builtin_add_overflow(w, bulk, &w))
      bad("right", "dimension " + std::to_string(d) + "'s widths left + right (" + std::to_string(c.left[d]) +
                       " + " + std::to_string(c.right[d]) + ") and global extent " + std::to_string(bulk) +
                       " exceed 2^63");
  }
  // And the window's volume: no rank's window is larger than the global
  // extents with both widths, whose product must fit too.
  if (c.global_shape && !c.left.empty() && !c.right.empty()) {
    int64_t n = 1;
    for (size_t d = 0; d < c.global_shape->size(); ++d) {
      int64_t w = (*c.global_shape)[d];
      if (d < c.left.size() && d < c.right.size()) w += c.left[d] + c.right[d];  // fits: checked above
      if (__builtin_mul_overflow(n, w, &n))
        bad("right", "the halo window's volume (the global extents " + shape_string(*c.global_shape) +
                         " with the widths left and right) exceeds 2^63");
    }
  }
  // An empty object gives no rank a shape and would print as no field at
  // all (case_reader_fuzz, issue 35 item 2).
  if (v.contains("local_shapes") && c.local_shapes.empty())
    bad("local_shapes", "is empty: expected a shape for every P_x rank");
  for (int r : c.P_x.ranks)
    if (!c.local_shapes.empty() && !c.local_shapes.count(r))
      bad("local_shapes", "has no shape for P_x rank " + std::to_string(r));
  if (c.ranks && c.ranks < c.world_size_needed())
    bad("ranks", "expected at least " + std::to_string(c.world_size_needed()) +
                     " (the ranks the partitions name), got " + std::to_string(c.ranks));
  return c;
}

Case Case::parse(const std::string& text, const std::string& source) {
  json::Value v;
  try {
    v = json::parse(text, source);
  } catch (const Error& e) {
    throw CaseError(e.what());
  }
  return from_json(v, source);
}

Case Case::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw CaseError(path + ": cannot read the case file");
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

json::Value Case::to_json() const {
  json::Value v;
  v["primitive"] = primitive;
  v["P_x"] = spec_json(P_x);
  if (P_y) v["P_y"] = spec_json(*P_y);
  if (primitive == "all_sum_reduce") v["axes"] = axes;
  if (along_one_axis(primitive) && distdl) {
    if (distdl->axes())
      v[primitive == "all_gather" ? "axes_all_gather" : "axes_reduce_scatter"] = *distdl->axes();
    if (distdl->axes_keep()) v["axes_keep"] = *distdl->axes_keep();
    if (!distdl->scale_backward().empty()) v["scale_backward"] = distdl->scale_backward();
  } else if (along_one_axis(primitive)) {
    v["axis"] = axis;
    v["dim"] = dim;
  }
  if (primitive == "halo_exchange") {
    v["left"] = left;
    v["right"] = right;
    if (in_place) v["in_place"] = true;
  }
  if (is_linear()) {
    if (P_W) v["P_W"] = spec_json(*P_W);
    v["out_features"] = out_features;
    if (in_features) v["in_features"] = in_features;
    v["bias"] = bias;
  }
  if (global_shape) v["global_shape"] = *global_shape;
  if (local_shape) v["local_shape"] = *local_shape;
  if (!local_shapes.empty()) {
    json::Value m = json::Value::object();
    for (const auto& [r, s] : local_shapes) m[std::to_string(r)] = s;
    v["local_shapes"] = m;
  }
  if (!is_linear())
    v["options"] = {{"transpose_src", options.transpose_src()},
                    {"transpose_dest", options.transpose_dest()},
                    {"preserve_batch", options.preserve_batch()}};
  v["dtype"] = dtype;
  if (ranks) v["ranks"] = ranks;
  if (data_seed) v["data_seed"] = *data_seed;
  if (data_seed && fill != "integers") v["fill"] = fill;
  if (!unused_outputs.empty()) v["unused_outputs"] = unused_outputs;
  return v;
}

std::string Case::repro() const { return json::dump(to_json()); }

bool Case::is_linear() const { return primitive == "linear" || primitive.rfind("linear_", 0) == 0; }

int Case::world_size_needed() const {
  int n = 0;
  for (int r : P_x.ranks) n = std::max(n, r + 1);
  for (const auto* P : {&P_y, &P_W})
    if (*P)
      for (int r : (*P)->ranks) n = std::max(n, r + 1);
  return std::max(n, ranks);
}

Shape Case::input_shape(int worker) const {
  const auto it = std::find(P_x.ranks.begin(), P_x.ranks.end(), worker);
  if (it == P_x.ranks.end()) return {0};
  if (local_shape) return *local_shape;
  if (!local_shapes.empty()) return local_shapes.at(worker);
  const Index idx = unravel(it - P_x.ranks.begin(), P_x.shape);
  Shape s;
  for (size_t d = 0; d < idx.size(); ++d) {
    s.push_back(local_length((*global_shape)[d], P_x.shape[d], idx[d]));
    if (primitive == "halo_exchange" && d < left.size() && d < right.size())
      s.back() += left[d] + right[d];
  }
  return s;
}

}  // namespace partita::testing
