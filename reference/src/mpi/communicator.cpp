// The communicator's reference: the operations on the list of every rank's
// tensor, written from their definitions (no MPI, nothing from impl/). This
// file holds the arithmetic they share (comm_internal.hpp); the calls are in
// collectives.cpp and point_to_point.cpp, as in impl/src/mpi/.
#include "partita/reference/communicator.hpp"

#include "comm_internal.hpp"
#include "partita/errors.hpp"

namespace partita::reference::comm::detail {

at::Tensor combine(const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMax: return at::maximum(a, b);
    case ReduceOp::kMin: return at::minimum(a, b);
    // MPI's logical operations give 1 or 0 in the operands' type.
    case ReduceOp::kLand: return at::logical_and(a, b).to(a.scalar_type());
    case ReduceOp::kLor: return at::logical_or(a, b).to(a.scalar_type());
    case ReduceOp::kLxor: return at::logical_xor(a, b).to(a.scalar_type());
    case ReduceOp::kBand: return at::bitwise_and(a, b);
    case ReduceOp::kBor: return at::bitwise_or(a, b);
    case ReduceOp::kBxor: return at::bitwise_xor(a, b);
  }
  throw Error("reference: unknown reduction operation");
}

at::Tensor reduce_all(const Tensors& x, ReduceOp op) {
  if (x.empty()) throw Error("reference: no ranks");
  at::Tensor acc = x[0];
  for (size_t r = 1; r < x.size(); ++r) acc = combine(acc, x[r], op);
  // A fold: one rank's tensor is its own reduction (as in MPI, even for the
  // logical operations).
  return acc.clone();
}

std::vector<int64_t> offsets(const std::vector<int64_t>& n) {
  std::vector<int64_t> at(n.size() + 1, 0);
  for (size_t i = 0; i < n.size(); ++i) at[i + 1] = at[i] + n[i];
  return at;
}

}  // namespace partita::reference::comm::detail
