// Internal: a Box (partita/tiling.hpp) of a tensor, as a view or as an MPI
// datatype that addresses it in place (no packing, no landing buffer).
#pragma once

#include <ATen/ATen.h>
#include <mpi.h>

#include <string>

#include "partita/tiling.hpp"

namespace partita::mpi::detail {

inline at::Tensor narrow_to(const at::Tensor& t, const Box& b) {
  at::Tensor v = t;
  for (size_t k = 0; k < b.start.size(); ++k)
    v = v.narrow(static_cast<int64_t>(k), b.start[k], b.len[k]);
  return v;
}

// The offset (in elements) of `box` in a C-ordered tensor of shape `full`
// when the box is one contiguous run of it, else -1.
inline int64_t contiguous_offset(const Shape& full, const Box& box) {
  size_t first = 0;  // the first dimension along which the box is longer than 1
  while (first < full.size() && box.len[first] == 1) ++first;
  for (size_t k = first + 1; k < full.size(); ++k)
    if (box.start[k] != 0 || box.len[k] != full[k]) return -1;
  int64_t offset = 0;
  for (size_t k = 0; k < full.size(); ++k) offset = offset * full[k] + box.start[k];
  return offset;
}

// A committed MPI_Type_create_subarray of `box` within a C-ordered tensor of
// shape `full` (the box non-empty), freed with the object. Send or receive
// one of it at the tensor's data pointer.
class BoxType {
 public:
  BoxType(const Shape& full, const Box& box, MPI_Datatype element, const std::string& what);
  ~BoxType();
  BoxType(const BoxType&) = delete;
  BoxType& operator=(const BoxType&) = delete;
  BoxType(BoxType&& o) noexcept : type_(o.type_) { o.type_ = MPI_DATATYPE_NULL; }
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

}  // namespace partita::mpi::detail
