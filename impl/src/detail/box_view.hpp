// Internal: a Box (partita/tiling.hpp) of a tensor: as a view, as planned
// copy loops (packing, unpacking, zeroing, adding), as the route it takes
// point to point, or as an MPI datatype that addresses it in place.
#pragma once

#include <ATen/ATen.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

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

// A copy of a box between two C-ordered arrays, planned once: the box's
// innermost dimension is one run of bytes (with the dimensions before it
// merged in while the box covers the later ones whole in both arrays), the
// other dimensions are loops of memcpy. What a hand-written exchange does to
// pack a strided block, without a tensor view or a dispatcher call per use.
struct BoxCopy {
  int64_t run = 0;                         // bytes per contiguous run (0: nothing to copy)
  int64_t src_offset = 0, dst_offset = 0;  // bytes to the first run
  std::vector<int64_t> count, src_stride, dst_stride;  // the outer loops (strides in bytes)
  void operator()(const void* src, void* dst) const;
};
// `src_box` of an array of shape `src_full` into `dst_box` (same lengths) of
// an array of shape `dst_full`, `elsize` bytes per element.
BoxCopy box_copy(const Shape& src_full, const Box& src_box, const Shape& dst_full,
                 const Box& dst_box, int64_t elsize);
// Packing a box into a contiguous buffer of its own shape, and back.
BoxCopy box_pack(const Shape& full, const Box& box, int64_t elsize);
BoxCopy box_unpack(const Shape& full, const Box& box, int64_t elsize);

// How a box travels point to point, fixed once per plan (repartition's
// pieces, the halo exchange's boxes). A contiguous run of its tensor goes as
// plain elements at its offset, which MPICH moves by its single-copy path; a
// strided box is packed into (or received into and unpacked from) a
// contiguous buffer by the memcpy loops above, as a hand-written exchange
// does. A subarray datatype cost MPICH time that grew with the message even
// when the box it addressed was one contiguous run: the halo's row slabs at
// 256 KiB took 1.8x the hand-written exchange that way, 0.64x as plain
// runs (docs/benchmarks.md).
struct BoxRoute {
  int64_t elements = 0;  // the box's volume (0: nothing travels)
  int64_t offset = -1;   // >= 0: a contiguous run at this element offset
  BoxCopy pack;          // a strided box (offset < 0): into its buffer
  BoxCopy unpack;        // any box: from a buffer of its shape into place (also
                         // what the halo's adjoint zeroes and adds through)
  bool strided() const { return elements > 0 && offset < 0; }
};
BoxRoute box_route(const Shape& full, const Box& box, int64_t elsize);

// A staging buffer of `bytes` for strided boxes: plain heap memory when
// small, a tensor (the buffer cache's, when it is on) when large.
struct Staging {
  std::unique_ptr<char[]> small;
  at::Tensor large;
  char* data = nullptr;
  explicit Staging(int64_t bytes);
};

// The same loops, writing zeros over the destination side of `c`, or adding
// its source side into its destination side element by element (elements
// of `type`; integers wrap, half and bfloat16 round each sum as at::add_
// does): the halo's adjoint zeroes ghosts and adds their gradients into the
// bulk without a view or a TensorIterator per box.
void box_zero(const BoxCopy& c, void* dst);
void box_add(const BoxCopy& c, const void* src, void* dst, at::ScalarType type);

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
