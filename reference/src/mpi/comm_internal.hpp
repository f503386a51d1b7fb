// Internal to the communicator's reference: the arithmetic every call shares
// (the reduction operators, the offsets of a split), as impl/src/mpi/
// comm_internal.hpp holds what the MPI communicator's calls share.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "partita/reference/communicator.hpp"

namespace partita::reference::comm::detail {

// a op b, elementwise, as MPI computes it for the operands' type.
at::Tensor combine(const at::Tensor& a, const at::Tensor& b, ReduceOp op);
// x[0] op x[1] op ... (a new tensor, even for one rank).
at::Tensor reduce_all(const Tensors& x, ReduceOp op);
// Where each of the pieces of lengths n starts, and the total last.
std::vector<int64_t> offsets(const std::vector<int64_t>& n);

}  // namespace partita::reference::comm::detail
