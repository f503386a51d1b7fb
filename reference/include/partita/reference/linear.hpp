// Seed 002's five distributed Linear layers as serial twins: each works on
// the global tensors. The inputs of P_x's workers are put together into the
// global x, y = x W^T + b is computed once, and y is cut over P_y by the
// balanced decomposition (docs/linear.md: x and y are decomposed over their
// partitions by the same rule in every dimension). What each worker stores
// of W and b is stated here too, from the table in docs/linear.md, so the
// MPI layers' blocks are checked against something they do not share.
#pragma once

#include <cstdint>
#include <string>

#include "partita/reference/tensors.hpp"

namespace partita::reference {

enum class LinearKind { General, AllGather, ReduceScatter, AllGatherZero, ReduceScatterZero };

// "linear", "linear_all_gather", "linear_reduce_scatter",
// "linear_all_gather_zero", "linear_reduce_scatter_zero" (case files).
LinearKind linear_kind(const std::string& primitive);

struct LinearLayer {
  LinearKind kind = LinearKind::General;
  Partition P_x;  // where x lives
  Partition P_y;  // where y lives (the same as P_x in the single forms)
  Partition P_W;  // the general layer's P_fout x P_fin; null otherwise
  int64_t in = 0, out = 0;
  bool bias = true;
};

// The block of the global W ([out, in]) and b ([out]) that a worker stores:
// rows [r0, r0 + rn) and columns [c0, c0 + cn) of W, entries [b0, b0 + bn)
// of b. All lengths are zero where the worker stores nothing.
struct ParameterBlock {
  int64_t r0 = 0, rn = 0, c0 = 0, cn = 0, b0 = 0, bn = 0;
  bool operator==(const ParameterBlock& o) const {
    return r0 == o.r0 && rn == o.rn && c0 == o.c0 && cn == o.cn && b0 == o.b0 && bn == o.bn;
  }
};
ParameterBlock parameter_block(const LinearLayer& layer, int worker);

// Throws PartitionError unless the partitions and feature counts fit the
// layer (docs/linear.md).
void check_layer(const std::string& what, const LinearLayer& layer);

// What each world rank returns: its block of y on P_y; a zero-volume
// {batch, 0} elsewhere in the layer (the general layer's P_W and P_x
// workers); a clone of its input outside. W and b (undefined without bias)
// are the global parameters; gradients reach x, W and b by autograd.
// Throws ShapeError unless P_x's inputs are the balanced decomposition of a
// global x with `in` features.
Tensors linear(const LinearLayer& layer, const at::Tensor& W, const at::Tensor& b, const Tensors& x);

}  // namespace partita::reference
