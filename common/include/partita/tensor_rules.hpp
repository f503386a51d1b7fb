// Tensor vocabulary shared by the reference and the MPI implementation:
// zero-volume tensors, supported dtypes and the checks every primitive makes
// on its inputs. Header-only; needs LibTorch.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "partita/errors.hpp"
#include "partita/shape.hpp"

namespace partita {

// The most dimensions a partita tensor may have (fixed-size metadata).
constexpr int kMaxTensorDims = 8;

// docs/design.md, "Workers with no data": a worker with no data holds {0}, or {batch, 0} when
// preserve_batch keeps the batch size of `like`.
inline at::Tensor zero_volume_like(const at::Tensor& like, bool preserve_batch) {
  if (preserve_batch && like.dim() >= 1)
    return at::empty({like.size(0), 0}, like.options().requires_grad(false));
  return at::empty({0}, like.options().requires_grad(false));
}

inline Shape shape_of(const at::Tensor& t) {
  return Shape(t.sizes().begin(), t.sizes().end());
}

inline bool dtype_supported(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kBFloat16: case at::kHalf:
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
      return true;
    default:
      return false;
  }
}

inline std::string dtype_name(at::ScalarType t) { return c10::toString(t); }

// "float64" / "bfloat16" / "int64" ... and back (case files, reports).
inline at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "float") return at::kFloat;
  if (name == "float64" || name == "double") return at::kDouble;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16" || name == "half") return at::kHalf;
  if (name == "uint8") return at::kByte;
  if (name == "int8") return at::kChar;
  if (name == "int16") return at::kShort;
  if (name == "int32") return at::kInt;
  if (name == "int64") return at::kLong;
  throw Error("unsupported dtype '" + name + "'");
}

inline std::string dtype_string(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kByte: return "uint8";
    case at::kChar: return "int8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    default: return dtype_name(t);
  }
}

}  // namespace partita
