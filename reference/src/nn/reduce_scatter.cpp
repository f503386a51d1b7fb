#include "partita/reference/reduce_scatter.hpp"

#include "layout.hpp"
#include "partita/errors.hpp"
#include "partita/tensor_rules.hpp"

namespace partita::reference {

void require_dim(const char* what, const Partition& P_x, int64_t dim, const Tensors& x);

Tensors reduce_scatter(const Partition& P_x, int axis, int64_t dim, const Tensors& x) {
  require_dim("reduce_scatter", P_x, dim, x);
  return over_teams("reduce_scatter", P_x, {axis}, x, [&](const Partition& team, int me) {
    at::Tensor sum;
    for (int m : team.workers()) {
      if (dim < 0 || dim >= x[m].dim())
        throw ShapeError("reduce_scatter: worker " + std::to_string(m) + " has no dimension " +
                         std::to_string(dim), rule_code::kMissingDim);
      if (sum.defined() && x[m].sizes() != sum.sizes())
        throw ShapeError("reduce_scatter: the inputs of one team differ in shape", rule_code::kTeamShapes);
      sum = sum.defined() ? sum + x[m] : x[m].clone();
    }
    const int64_t n = sum.size(dim), k = team.size(), i = team.rank(me);
    const auto [start, length] = balanced_piece(n, k, i);
    return sum.narrow(dim, start, length).clone();
  });
}

std::vector<int> distdl_axes(const char* axes_name, const Partition& P_x, const GatherAxes& a);

Tensors reduce_scatter(const Partition& P_x, const GatherAxes& axes, const Tensors& x) {
  if (!axes.scale_backward().empty()) throw PartitionError("scale_backward is AllGather's", rule_code::kScaleBackward);
  Tensors y = x;
  const auto dims = distdl_axes("axes_reduce_scatter", P_x, axes);
  if (dims.empty())
    for (auto& t : y) t = t.clone();
  for (int d : dims) y = reduce_scatter(P_x, d, d, y);
  return y;
}

}  // namespace partita::reference
