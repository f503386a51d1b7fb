// A small JSON value: enough for case files, `partita explain --json` and
// benchmark records. Objects keep their keys in insertion order so output is
// stable and diffable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace partita::json {

class Value {
 public:
  enum class Kind { Null, Bool, Int, Double, String, Array, Object };
  using Array = std::vector<Value>;
  using Object = std::vector<std::pair<std::string, Value>>;

  Value() = default;
  Value(std::nullptr_t) {}
  Value(bool b) : kind_(Kind::Bool), b_(b) {}
  Value(int v) : kind_(Kind::Int), i_(v) {}
  Value(int64_t v) : kind_(Kind::Int), i_(v) {}
  Value(double v) : kind_(Kind::Double), d_(v) {}
  Value(const char* s) : kind_(Kind::String), s_(s) {}
  Value(std::string s) : kind_(Kind::String), s_(std::move(s)) {}
  Value(Array a) : kind_(Kind::Array), a_(std::move(a)) {}
  Value(Object o) : kind_(Kind::Object), o_(std::move(o)) {}
  template <typename T>
  static Value array_of(const std::vector<T>& values) {
    Array a;
    for (const auto& v : values) a.emplace_back(static_cast<int64_t>(v));
    return Value(std::move(a));
  }

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  const Object& as_object() const;
  std::vector<int64_t> as_int_list() const;

  bool contains(const std::string& key) const;
  const Value& operator[](const std::string& key) const;  // throws if absent
  Value& set(const std::string& key, Value v);            // object only
  void push_back(Value v);                                // array only

  std::string dump() const;  // compact, one line

 private:
  Kind kind_ = Kind::Null;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  Array a_;
  Object o_;
};

// Throws partita::Error with the position on malformed input.
Value parse(const std::string& text);

}  // namespace partita::json
