// The communicator's collectives on the list of every rank's tensor.
#include "comm_internal.hpp"
#include "partita/reference/communicator.hpp"

namespace partita::reference::comm {

using namespace detail;

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

}  // namespace partita::reference::comm
