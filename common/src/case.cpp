#include "partita/case.hpp"

#include <algorithm>

#include "partita/errors.hpp"

namespace partita {

namespace {

PartitionSpec spec_from(const json::Value& v, const char* name) {
  PartitionSpec s;
  for (auto r : v["ranks"].as_int_list()) s.ranks.push_back(static_cast<int>(r));
  s.shape = v["shape"].as_int_list();
  if (volume(s.shape) != static_cast<int64_t>(s.ranks.size()))
    throw Error(std::string("case: ") + name + " shape " + shape_string(s.shape) +
                " does not fit " + std::to_string(s.ranks.size()) + " ranks");
  return s;
}

json::Value spec_json(const PartitionSpec& s) {
  json::Value v;
  v.set("ranks", json::Value::array_of(s.ranks));
  v.set("shape", json::Value::array_of(s.shape));
  return v;
}

const char* kPrimitives[] = {"broadcast", "sum_reduce", "all_sum_reduce", "all_gather",
                             "reduce_scatter", "repartition", "transpose", "halo_exchange"};

bool along_one_axis(const std::string& p) { return p == "all_gather" || p == "reduce_scatter"; }

}  // namespace

Case Case::from_json(const json::Value& v) {
  Case c;
  c.primitive = v["primitive"].as_string();
  if (c.primitive == "transpose") c.primitive = "repartition";  // the seeds' name
  if (std::find(std::begin(kPrimitives), std::end(kPrimitives), c.primitive) ==
      std::end(kPrimitives))
    throw Error("case: unknown primitive '" + c.primitive +
                "' (broadcast, sum_reduce, all_sum_reduce, all_gather, reduce_scatter, repartition, "
                "halo_exchange)");
  c.P_x = spec_from(v["P_x"], "P_x");
  if (c.primitive == "all_sum_reduce") {
    for (auto a : v["axes"].as_int_list()) c.axes.push_back(static_cast<int>(a));
  } else if (along_one_axis(c.primitive)) {
    c.axis = static_cast<int>(v["axis"].as_int());
    c.dim = v["dim"].as_int();
  } else if (c.primitive == "halo_exchange") {
    c.left = v["left"].as_int_list();
    c.right = v["right"].as_int_list();
  } else {
    c.P_y = spec_from(v["P_y"], "P_y");
  }
  if (v.contains("options")) {
    const auto& o = v["options"];
    if (o.contains("transpose_src")) c.options.transpose_src = o["transpose_src"].as_bool();
    if (o.contains("transpose_dest")) c.options.transpose_dest = o["transpose_dest"].as_bool();
    if (o.contains("preserve_batch")) c.options.preserve_batch = o["preserve_batch"].as_bool();
  }
  if (v.contains("dtype")) c.dtype = v["dtype"].as_string();
  int given = 0;
  if (v.contains("global_shape")) {
    c.global_shape = v["global_shape"].as_int_list();
    ++given;
  }
  if (v.contains("local_shape")) {
    c.local_shape = v["local_shape"].as_int_list();
    ++given;
  }
  if (v.contains("local_shapes")) {
    for (const auto& [k, s] : v["local_shapes"].as_object())
      c.local_shapes[std::stoi(k)] = s.as_int_list();
    ++given;
  }
  if (given != 1)
    throw Error("case: give exactly one of global_shape, local_shape, local_shapes");
  if (c.global_shape && c.global_shape->size() != c.P_x.shape.size())
    throw Error("case: global_shape " + shape_string(*c.global_shape) + " has " +
                std::to_string(c.global_shape->size()) + " dimensions but P_x has " +
                std::to_string(c.P_x.shape.size()));
  for (const auto& [r, s] : c.local_shapes)
    if (std::find(c.P_x.ranks.begin(), c.P_x.ranks.end(), r) == c.P_x.ranks.end())
      throw Error("case: local_shapes names rank " + std::to_string(r) + ", which is not in P_x");
  for (int r : c.P_x.ranks)
    if (!c.local_shapes.empty() && !c.local_shapes.count(r))
      throw Error("case: local_shapes has no shape for P_x rank " + std::to_string(r));
  if (v.contains("ranks")) c.ranks = static_cast<int>(v["ranks"].as_int());
  if (v.contains("data_seed")) c.data_seed = static_cast<uint64_t>(v["data_seed"].as_int());
  if (v.contains("unused_outputs"))
    for (int64_t r : v["unused_outputs"].as_int_list()) c.unused_outputs.push_back(static_cast<int>(r));
  if (c.ranks && c.ranks < c.world_size_needed())
    throw Error("case: \"ranks\": " + std::to_string(c.ranks) + " is fewer than the ranks it names");
  return c;
}

json::Value Case::to_json() const {
  json::Value v;
  v.set("primitive", primitive);
  v.set("P_x", spec_json(P_x));
  if (P_y) v.set("P_y", spec_json(*P_y));
  if (primitive == "all_sum_reduce") v.set("axes", json::Value::array_of(axes));
  if (along_one_axis(primitive)) {
    v.set("axis", axis);
    v.set("dim", dim);
  }
  if (primitive == "halo_exchange") {
    v.set("left", json::Value::array_of(left));
    v.set("right", json::Value::array_of(right));
  }
  if (global_shape) v.set("global_shape", json::Value::array_of(*global_shape));
  if (local_shape) v.set("local_shape", json::Value::array_of(*local_shape));
  if (!local_shapes.empty()) {
    json::Value m;
    for (const auto& [r, s] : local_shapes) m.set(std::to_string(r), json::Value::array_of(s));
    v.set("local_shapes", m);
  }
  json::Value o;
  o.set("transpose_src", options.transpose_src);
  o.set("transpose_dest", options.transpose_dest);
  o.set("preserve_batch", options.preserve_batch);
  v.set("options", o);
  v.set("dtype", dtype);
  if (ranks) v.set("ranks", ranks);
  if (data_seed) v.set("data_seed", static_cast<int64_t>(*data_seed));
  if (!unused_outputs.empty()) v.set("unused_outputs", json::Value::array_of(unused_outputs));
  return v;
}

int Case::world_size_needed() const {
  int n = 0;
  for (int r : P_x.ranks) n = std::max(n, r + 1);
  if (P_y)
    for (int r : P_y->ranks) n = std::max(n, r + 1);
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

}  // namespace partita
