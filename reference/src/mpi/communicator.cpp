// The communicator's reference: the operations on the list of every rank's
// tensor, written from their definitions (no MPI, nothing from impl/).
#include "partita/reference/communicator.hpp"

#include <numeric>

#include "partita/errors.hpp"

namespace partita::reference::comm {

namespace {

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

}  // namespace

Tensors allreduce(const Tensors& x, ReduceOp op) {
  const at::Tensor all = reduce_all(x, op);
  return Tensors(x.size(), all);
}

Tensors bcast(const Tensors& x, int root) {
  Tensors out;
  for (size_t r = 0; r < x.size(); ++r) out.push_back(x.at(root).clone());
  return out;
}

Tensors reduce(const Tensors& x, ReduceOp op, int root) {
  Tensors out;
  const at::Tensor all = reduce_all(x, op);
  for (size_t r = 0; r < x.size(); ++r)
    out.push_back(static_cast<int>(r) == root ? all : at::zeros_like(x[r]));
  return out;
}

Tensors gather(const Tensors& x, int64_t axis, int root) {
  Tensors out;
  for (size_t r = 0; r < x.size(); ++r)
    out.push_back(static_cast<int>(r) == root ? at::cat(x, axis) : x[r].narrow(axis, 0, 0).clone());
  return out;
}

Tensors allgather(const Tensors& x, int64_t axis) {
  const at::Tensor all = at::cat(x, axis);
  return Tensors(x.size(), all);
}

Tensors scatter(const Tensors& x, int64_t axis, const std::vector<int64_t>& numelem, int root) {
  const auto off = offsets(numelem);
  Tensors out;
  for (size_t r = 0; r < x.size(); ++r)
    out.push_back(x.at(root).narrow(axis, off[r], numelem[r]).clone());
  return out;
}

Tensors alltoall(const Tensors& x, int64_t gather_axis, int64_t scatter_axis,
                 const std::vector<int64_t>& numelem) {
  const auto off = offsets(numelem);
  Tensors out;
  if (gather_axis == scatter_axis) {
    const at::Tensor all = at::cat(x, gather_axis);
    for (size_t j = 0; j < x.size(); ++j)
      out.push_back(all.narrow(gather_axis, off[j], numelem[j]).clone());
    return out;
  }
  for (size_t j = 0; j < x.size(); ++j) {
    Tensors pieces;
    for (const auto& xi : x) pieces.push_back(xi.narrow(scatter_axis, off[j], numelem[j]));
    out.push_back(at::cat(pieces, gather_axis));
  }
  return out;
}

Tensors ring(const Tensors& x, int shift) {
  const int p = static_cast<int>(x.size());
  Tensors out;
  for (int r = 0; r < p; ++r) out.push_back(x[((r - shift) % p + p) % p].clone());
  return out;
}

}  // namespace partita::reference::comm
