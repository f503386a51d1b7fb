#include "partita/safetensors.hpp"

#include <algorithm>
#include <limits>

#include "partita/errors.hpp"
#include "partita/json.hpp"

namespace partita::safetensors {

int64_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, int64_t> sizes = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2},
                                                       {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
                                                       {"U8", 1},  {"BOOL", 1}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

int64_t header_length(const std::string& first8, int64_t file_size, const std::string& source) {
  if (first8.size() < 8 || file_size < 8)
    throw Error(source + ": " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<unsigned char>(first8[b]);
  if (n == 0 || n > static_cast<uint64_t>(kMaxHeaderBytes))
    throw Error(source + ": a header length of " + std::to_string(n) + " bytes (1 to " +
                std::to_string(kMaxHeaderBytes) + " allowed)");
  if (static_cast<int64_t>(n) > file_size - 8)
    throw Error(source + ": the header length " + std::to_string(n) + " passes the end of the " +
                std::to_string(file_size) + "-byte file");
  return static_cast<int64_t>(n);
}

namespace {

int64_t integer(const json::Value& v, const std::string& what) {
  if (!v.is_number_integer()) throw Error(what + " is " + v.dump() + ", not an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw Error(what + " is " + v.dump() + ", too large");
  return v.get<int64_t>();
}

Entry entry_of(const std::string& name, const json::Value& v) {
  const std::string what = "tensor \"" + name + "\"";
  if (!v.is_object()) throw Error(what + " is " + v.dump() + ", not an object");
  for (const auto& [k, unused] : v.items())
    if (k != "dtype" && k != "shape" && k != "data_offsets") throw Error(what + " has an unknown field \"" + k + "\"");
  for (const char* k : {"dtype", "shape", "data_offsets"})
    if (!v.contains(k)) throw Error(what + " has no \"" + k + "\"");
  Entry e;
  e.name = name;
  if (!v["dtype"].is_string()) throw Error(what + ": dtype " + v["dtype"].dump() + " is not a string");
  e.dtype = v["dtype"].get<std::string>();
  const int64_t size = dtype_size(e.dtype);
  if (size == 0) throw Error(what + ": unknown dtype \"" + e.dtype + "\"");
  if (!v["shape"].is_array()) throw Error(what + ": shape " + v["shape"].dump() + " is not an array");
  int64_t elements = 1;
  for (const auto& d : v["shape"]) {
    const int64_t n = integer(d, what + ": an extent");
    if (n < 0) throw Error(what + ": a negative extent " + std::to_string(n));
    if (n != 0 && elements > std::numeric_limits<int64_t>::max() / 8 / n)
      throw Error(what + ": shape " + v["shape"].dump() + " is too large");
    elements *= n;
    e.shape.push_back(n);
  }
  const auto& o = v["data_offsets"];
  if (!o.is_array() || o.size() != 2) throw Error(what + ": data_offsets " + o.dump() + " is not [begin, end]");
  e.begin = integer(o[0], what + ": data_offsets[0]");
  e.end = integer(o[1], what + ": data_offsets[1]");
  if (e.begin < 0 || e.end < e.begin) throw Error(what + ": data_offsets " + o.dump() + " is not a range");
  if (e.end - e.begin != elements * size)
    throw Error(what + ": data_offsets " + o.dump() + " hold " + std::to_string(e.end - e.begin) + " bytes, its " +
                e.dtype + " shape " + shape_string(e.shape) + " " + std::to_string(elements * size));
  return e;
}

}  // namespace

Header parse_header(const std::string& text, int64_t file_size, const std::string& source) {
  Header h;
  h.data_start = 8 + static_cast<int64_t>(text.size());
  try {
    const json::Value v = json::parse(text, "the header");
    if (!v.is_object()) throw Error("the header is not a JSON object");
    for (const auto& [name, e] : v.items()) {
      if (name == "__metadata__") {
        if (!e.is_object()) throw Error("__metadata__ is not an object");
        for (const auto& [k, s] : e.items()) {
          if (!s.is_string()) throw Error("__metadata__ \"" + k + "\" is " + s.dump() + ", not a string");
          h.metadata[k] = s.get<std::string>();
        }
        continue;
      }
      h.tensors.push_back(entry_of(name, e));
    }
    std::stable_sort(h.tensors.begin(), h.tensors.end(),
                     [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
    int64_t at = 0;
    for (const Entry& e : h.tensors) {
      // A zero-byte tensor may sit anywhere its neighbours meet.
      if (e.begin != at)
        throw Error("tensor \"" + e.name + "\" begins at byte " + std::to_string(e.begin) + " of the data, " +
                    (e.begin < at ? "inside the previous tensor" : "after a gap") + " (the previous one ends at " +
                    std::to_string(at) + ")");
      at = e.end;
    }
    const int64_t data = file_size - h.data_start;
    if (at != data)
      throw Error("the tensors' data ends at byte " + std::to_string(at) + " of the data section, which holds " +
                  std::to_string(data) + " bytes" + (at > data ? " (the file is truncated)" : ""));
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
  return h;
}

std::string format_header(std::vector<Entry>& tensors, const std::map<std::string, std::string>& metadata) {
  json::Value v = json::Value::object();
  if (!metadata.empty()) {
    json::Value m = json::Value::object();
    for (const auto& [k, s] : metadata) m[k] = s;
    v["__metadata__"] = m;
  }
  int64_t at = 0;
  for (Entry& e : tensors) {
    e.begin = at;
    e.end = at + volume(e.shape) * dtype_size(e.dtype);
    at = e.end;
    v[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string json = v.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>((n >> (8 * b)) & 0xff);
  return out + json;
}

}  // namespace partita::safetensors
