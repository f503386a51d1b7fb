// Deep comparison of two c10::IValues for the smp tests: same kinds, same
// types of lists and dicts, same values (doubles and tensor bytes bit for
// bit, so NaN equals NaN), same tensor dtype, shape and requires_grad.
// Returns "" when equal, else where and how they differ.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <cstring>
#include <string>

namespace partita::testing {

inline std::string ivalue_difference(const c10::IValue& a, const c10::IValue& b, const std::string& path = "obj") {
  if (a.tagKind() != b.tagKind()) return path + ": " + a.tagKind() + " vs " + b.tagKind();
  if (a.isNone()) return "";
  if (a.isBool()) return a.toBool() == b.toBool() ? "" : path + ": bool differs";
  if (a.isInt()) return a.toInt() == b.toInt() ? "" : path + ": " + std::to_string(a.toInt()) + " vs " + std::to_string(b.toInt());
  if (a.isDouble()) {
    const double x = a.toDouble(), y = b.toDouble();
    return std::memcmp(&x, &y, sizeof x) == 0 ? "" : path + ": " + std::to_string(x) + " vs " + std::to_string(y);
  }
  if (a.isString()) return a.toStringRef() == b.toStringRef() ? "" : path + ": strings differ";
  if (a.isDevice()) return a.toDevice() == b.toDevice() ? "" : path + ": devices differ";
  if (a.isTensor()) {
    const at::Tensor& x = a.toTensor();
    const at::Tensor& y = b.toTensor();
    if (x.defined() != y.defined()) return path + ": one tensor is undefined";
    if (!x.defined()) return "";
    if (x.scalar_type() != y.scalar_type())
      return path + ": dtype " + c10::toString(x.scalar_type()) + " vs " + c10::toString(y.scalar_type());
    if (x.sizes() != y.sizes()) return path + ": shapes differ";
    if (x.requires_grad() != y.requires_grad()) return path + ": requires_grad differs";
    // The values as read: a conjugate or negative view's flag resolved
    // (the bits beneath it are not the tensor's values).
    if (x.is_quantized() || y.is_quantized()) return path + ": quantized tensors are not compared";
    const at::Tensor cx = x.detach().resolve_conj().resolve_neg().contiguous(),
                     cy = y.detach().resolve_conj().resolve_neg().contiguous();
    const size_t n = cx.numel() * cx.element_size();
    if (n && std::memcmp(cx.data_ptr(), cy.data_ptr(), n) != 0) return path + ": tensor values differ";
    return "";
  }
  if (a.isTuple()) {
    const auto& x = a.toTupleRef().elements();
    const auto& y = b.toTupleRef().elements();
    if (x.size() != y.size()) return path + ": tuple sizes differ";
    for (size_t i = 0; i < x.size(); ++i)
      if (auto d = ivalue_difference(x[i], y[i], path + "[" + std::to_string(i) + "]"); !d.empty()) return d;
    return "";
  }
  if (a.isList()) {
    if (a.type()->str() != b.type()->str()) return path + ": " + a.type()->str() + " vs " + b.type()->str();
    const auto x = a.toListRef();
    const auto y = b.toListRef();
    if (x.size() != y.size()) return path + ": list sizes differ";
    for (size_t i = 0; i < x.size(); ++i)
      if (auto d = ivalue_difference(x[i], y[i], path + "[" + std::to_string(i) + "]"); !d.empty()) return d;
    return "";
  }
  if (a.isGenericDict()) {
    if (a.type()->str() != b.type()->str()) return path + ": " + a.type()->str() + " vs " + b.type()->str();
    const auto x = a.toGenericDict();
    const auto y = b.toGenericDict();
    if (x.size() != y.size()) return path + ": dict sizes differ";
    auto i = x.begin();
    auto j = y.begin();
    for (size_t k = 0; i != x.end(); ++i, ++j, ++k) {
      const std::string at = path + "{" + std::to_string(k) + "}";
      if (auto d = ivalue_difference(i->key(), j->key(), at + ".key"); !d.empty()) return d;
      if (auto d = ivalue_difference(i->value(), j->value(), at + ".value"); !d.empty()) return d;
    }
    return "";
  }
  return path + ": cannot compare " + a.tagKind();
}

}  // namespace partita::testing
