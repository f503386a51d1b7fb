#include "partita/json.hpp"

#include <cmath>
#include <limits>

#include "partita/errors.hpp"

namespace partita::json {

namespace {

// nlohmann prefixes its messages with "[json.exception.parse_error.101] ":
// an id for its own docs, noise for a partita user.
std::string without_id(const char* what) {
  std::string s(what);
  if (!s.empty() && s[0] == '[') {
    const auto close = s.find("] ");
    if (close != std::string::npos) s.erase(0, close + 2);
  }
  return s;
}

void dump_into(const Value& v, std::string& out) {
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [k, e] : v.items()) {
      if (!first) out += ", ";
      first = false;
      out += Value(k).dump();
      out += ": ";
      dump_into(e, out);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    bool first = true;
    for (const auto& e : v) {
      if (!first) out += ", ";
      first = false;
      dump_into(e, out);
    }
    out += ']';
  } else {
    out += v.dump();
  }
}

}  // namespace

// Arrays and objects nested deeper than this are refused before parsing:
// nlohmann parses any depth, but its dump recurses once per level, so a
// few hundred kilobytes of brackets in a file partita reads (a checkpoint's
// header or manifest) would overflow the stack of the message that names
// the value. Nothing partita reads nests more than a few levels.
namespace {

constexpr int kMaxDepth = 512;

void check_depth(const std::string& text, const std::string& source) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth)
        throw Error(source + ": not valid JSON for partita: arrays and objects nested deeper than " +
                    std::to_string(kMaxDepth) + " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

}  // namespace

Value parse(const std::string& text, const std::string& source) {
  check_depth(text, source);
  try {
    return Value::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // Not only parse_error: a number beyond double's range ("1e999") is an
    // out_of_range (406), which escaped every reader before (found by
    // fuzz/smp_config_fuzz; issue 35).
    throw Error(source + ": not valid JSON: " + without_id(e.what()));
  }
}

Value parse_benchmark(const std::string& text, const std::string& source) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      continue;
    }
    const bool negative = c == '-';
    const size_t word = negative ? i + 1 : i;
    bool replaced = false;
    for (const char* w : {"nan", "NaN", "Infinity", "inf"}) {
      const std::string s(w);
      if (text.compare(word, s.size(), s) == 0) {
        const bool is_nan = s[0] == 'n' || s[0] == 'N';
        out += is_nan ? "\"NaN\"" : negative ? "\"-Infinity\"" : "\"Infinity\"";
        i = word + s.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += c;
  }
  return parse(out, source);
}

double to_double(const Value& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return HUGE_VAL;
    if (s == "-Infinity") return -HUGE_VAL;
  }
  throw Error("json: expected a number, got " + dump(v));
}

std::string dump(const Value& v) {
  std::string out;
  dump_into(v, out);
  return out;
}

}  // namespace partita::json
