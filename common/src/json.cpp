#include "partita/json.hpp"

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <sstream>

#include "partita/errors.hpp"

namespace partita::json {

namespace {
[[noreturn]] void kind_error(const char* wanted) {
  throw Error(std::string("json: value is not ") + wanted);
}

void dump_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void dump_value(const Value& v, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::Null: out += "null"; break;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; break;
    case Value::Kind::Int: out += std::to_string(v.as_int()); break;
    case Value::Kind::Double: {
      const double d = v.as_double();
      if (!std::isfinite(d)) {
        out += "null";
      } else {
        // The shortest form that reads back as the same double.
        char buf[32];
        for (int precision = 15; precision <= 17; ++precision) {
          std::snprintf(buf, sizeof buf, "%.*g", precision, d);
          if (std::strtod(buf, nullptr) == d) break;
        }
        out += buf;
      }
      break;
    }
    case Value::Kind::String: dump_string(v.as_string(), out); break;
    case Value::Kind::Array: {
      out += '[';
      bool first = true;
      for (const auto& e : v.as_array()) {
        if (!first) out += ", ";
        first = false;
        dump_value(e, out);
      }
      out += ']';
      break;
    }
    case Value::Kind::Object: {
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.as_object()) {
        if (!first) out += ", ";
        first = false;
        dump_string(k, out);
        out += ": ";
        dump_value(e, out);
      }
      out += '}';
      break;
    }
  }
}

class Parser {
 public:
  explicit Parser(const std::string& t) : t_(t) {}
  Value document() {
    Value v = value();
    ws();
    if (p_ != t_.size()) fail("trailing characters");
    return v;
  }

 private:
  const std::string& t_;
  size_t p_ = 0;

  [[noreturn]] void fail(const std::string& what) {
    throw Error("json: " + what + " at offset " + std::to_string(p_));
  }
  void ws() {
    while (p_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[p_]))) ++p_;
  }
  bool eat(char c) {
    ws();
    if (p_ < t_.size() && t_[p_] == c) {
      ++p_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  bool word(const char* w) {
    const std::string s(w);
    if (t_.compare(p_, s.size(), s) == 0) {
      p_ += s.size();
      return true;
    }
    return false;
  }
  Value value() {
    ws();
    if (p_ >= t_.size()) fail("unexpected end");
    const char c = t_[p_];
    if (c == '{') return object();
    if (c == '[') return array();
    if (c == '"') return Value(string());
    if (word("true")) return Value(true);
    if (word("false")) return Value(false);
    if (word("null")) return Value();
    return number();
  }
  Value object() {
    expect('{');
    Value::Object o;
    if (eat('}')) return Value(std::move(o));
    do {
      ws();
      std::string k = string();
      expect(':');
      o.emplace_back(std::move(k), value());
    } while (eat(','));
    expect('}');
    return Value(std::move(o));
  }
  Value array() {
    expect('[');
    Value::Array a;
    if (eat(']')) return Value(std::move(a));
    do a.push_back(value());
    while (eat(','));
    expect(']');
    return Value(std::move(a));
  }
  std::string string() {
    if (p_ >= t_.size() || t_[p_] != '"') fail("expected a string");
    ++p_;
    std::string s;
    while (p_ < t_.size() && t_[p_] != '"') {
      char c = t_[p_++];
      if (c == '\\') {
        if (p_ >= t_.size()) fail("unterminated escape");
        const char e = t_[p_++];
        switch (e) {
          case 'n': s += '\n'; break;
          case 't': s += '\t'; break;
          case 'r': s += '\r'; break;
          case 'b': s += '\b'; break;
          case 'f': s += '\f'; break;
          case 'u': {
            if (p_ + 4 > t_.size()) fail("short \\u escape");
            const unsigned code = std::stoul(t_.substr(p_, 4), nullptr, 16);
            p_ += 4;
            if (code < 0x80) {
              s += static_cast<char>(code);
            } else if (code < 0x800) {
              s += static_cast<char>(0xC0 | (code >> 6));
              s += static_cast<char>(0x80 | (code & 0x3F));
            } else {
              s += static_cast<char>(0xE0 | (code >> 12));
              s += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
              s += static_cast<char>(0x80 | (code & 0x3F));
            }
            break;
          }
          default: s += e;
        }
      } else {
        s += c;
      }
    }
    if (p_ >= t_.size()) fail("unterminated string");
    ++p_;
    return s;
  }
  Value number() {
    const size_t start = p_;
    if (p_ < t_.size() && (t_[p_] == '-' || t_[p_] == '+')) ++p_;
    bool is_double = false;
    while (p_ < t_.size()) {
      const char c = t_[p_];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        ++p_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+') {
        is_double = true;
        ++p_;
      } else {
        break;
      }
    }
    // Google Benchmark writes non-finite counters bare (nan, -nan, NaN,
    // inf, Infinity): read them as doubles rather than reject its file.
    for (const char* word : {"nan", "NaN", "Infinity", "inf"}) {
      const size_t len = std::char_traits<char>::length(word);
      if (t_.compare(p_, len, word) == 0) {
        const bool negative = p_ > start && t_[start] == '-';
        p_ += len;
        const double v = word[0] == 'n' || word[0] == 'N' ? std::nan("") : HUGE_VAL;
        return Value(negative ? -v : v);
      }
    }
    const std::string n = t_.substr(start, p_ - start);
    if (n.empty() || n == "-") fail("expected a value");
    try {
      if (is_double) return Value(std::stod(n));
      return Value(static_cast<int64_t>(std::stoll(n)));
    } catch (const std::exception&) {
      fail("bad number '" + n + "'");
    }
  }
};
}  // namespace

bool Value::as_bool() const {
  if (kind_ != Kind::Bool) kind_error("a boolean");
  return b_;
}
int64_t Value::as_int() const {
  if (kind_ == Kind::Double && d_ == std::floor(d_)) return static_cast<int64_t>(d_);
  if (kind_ != Kind::Int) kind_error("an integer");
  return i_;
}
double Value::as_double() const {
  if (kind_ == Kind::Int) return static_cast<double>(i_);
  if (kind_ != Kind::Double) kind_error("a number");
  return d_;
}
const std::string& Value::as_string() const {
  if (kind_ != Kind::String) kind_error("a string");
  return s_;
}
const Value::Array& Value::as_array() const {
  if (kind_ != Kind::Array) kind_error("an array");
  return a_;
}
const Value::Object& Value::as_object() const {
  if (kind_ != Kind::Object) kind_error("an object");
  return o_;
}
std::vector<int64_t> Value::as_int_list() const {
  std::vector<int64_t> out;
  for (const auto& v : as_array()) out.push_back(v.as_int());
  return out;
}
bool Value::contains(const std::string& key) const {
  if (kind_ != Kind::Object) return false;
  for (const auto& kv : o_)
    if (kv.first == key) return true;
  return false;
}
const Value& Value::operator[](const std::string& key) const {
  for (const auto& kv : as_object())
    if (kv.first == key) return kv.second;
  throw Error("json: missing key '" + key + "'");
}
Value& Value::set(const std::string& key, Value v) {
  if (kind_ == Kind::Null) kind_ = Kind::Object;
  if (kind_ != Kind::Object) kind_error("an object");
  for (auto& kv : o_)
    if (kv.first == key) return kv.second = std::move(v);
  o_.emplace_back(key, std::move(v));
  return o_.back().second;
}
void Value::push_back(Value v) {
  if (kind_ == Kind::Null) kind_ = Kind::Array;
  if (kind_ != Kind::Array) kind_error("an array");
  a_.push_back(std::move(v));
}
std::string Value::dump() const {
  std::string out;
  dump_value(*this, out);
  return out;
}

Value parse(const std::string& text) { return Parser(text).document(); }

}  // namespace partita::json
