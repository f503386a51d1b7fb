// PARTITA_ARG(T, name): one field of an options struct in LibTorch's style.
// It declares a private field `name_` and three public members:
//   auto& name(T value)   sets it and returns the struct, so setters chain:
//                         LinearOptions().bias(false).dtype(at::kDouble)
//   const T& name() const reads it
//   T& name()             reads or changes it in place
// A struct whose fields are all declared this way has private fields, so it
// is not an aggregate: `Config{2, 4}` or `Options{.preserve_batch = false}`
// do not compile, and a positional brace can never set another field than
// the one it meant (docs/design.md, "Options").
#pragma once

#include <utility>

#define PARTITA_ARG(T, name)                      \
 public:                                          \
  auto& name(T value) {                           \
    name##_ = std::move(value);                   \
    return *this;                                 \
  }                                               \
  const T& name() const noexcept { return name##_; } \
  T& name() noexcept { return name##_; }          \
                                                  \
 private:                                         \
  T name##_
