#include "partita/reference/all_gather.hpp"

#include <algorithm>

#include "partita/errors.hpp"
#include "partita/tensor_rules.hpp"

namespace partita::reference {

// Every worker of P_x must have dimension `dim`; checked for all of them
// before any team's shapes, the order the MPI layer checks in (issue 9: a
// case breaking both rules names the same one on both sides).
void require_dim(const char* what, const Partition& P_x, int64_t dim, const Tensors& x) {
  if (dim < 0)  // an argument of the layer, before its inputs
    throw PartitionError(std::string(what) + ": negative tensor dimension",
                         rule_code::kGatherNegativeDim);
  check_inputs(what, P_x, x);
  for (int m : P_x.workers())
    if (dim < 0 || dim >= x[m].dim())
      throw ShapeError(std::string(what) + ": worker " + std::to_string(m) + " has no dimension " +
                       std::to_string(dim), rule_code::kMissingDim);
}

Tensors all_gather(const Partition& P_x, int axis, int64_t dim, const Tensors& x) {
  require_dim("all_gather", P_x, dim, x);
  return over_teams("all_gather", P_x, {axis}, x, [&](const Partition& team, int me) {
    std::vector<at::Tensor> pieces;
    for (int m : team.workers()) {
      if (dim < 0 || dim >= x[m].dim())
        throw ShapeError("all_gather: worker " + std::to_string(m) + " has no dimension " +
                         std::to_string(dim), rule_code::kMissingDim);
      auto a = x[m].sizes().vec(), b = x[me].sizes().vec();
      a[dim] = b[dim] = 0;
      if (a != b)
        throw ShapeError("all_gather: workers " + std::to_string(me) + " and " +
                         std::to_string(m) + " differ outside dimension " + std::to_string(dim), rule_code::kTeamShapes);
      pieces.push_back(x[m]);
    }
    return at::cat(pieces, dim);
  });
}

// The partition dimensions DistDL's axes name, checked, ascending.
std::vector<int> distdl_axes(const char* axes_name, const Partition& P_x, const GatherAxes& a) {
  if (a.axes() && a.axes_keep()) throw PartitionError(std::string("both ") + axes_name + " and axes_keep", rule_code::kGatherAxesChoice);
  if (!a.axes() && !a.axes_keep()) throw PartitionError(std::string("neither ") + axes_name + " nor axes_keep", rule_code::kGatherAxesChoice);
  const int n = static_cast<int>(P_x.shape().size());
  const std::vector<int>& listed = a.axes() ? *a.axes() : *a.axes_keep();
  for (const std::vector<int>* dims : {&listed, &a.scale_backward()})
    for (size_t i = 0; i < dims->size(); ++i) {
      if ((*dims)[i] < 0 || (*dims)[i] >= n) throw PartitionError("a dimension out of range", rule_code::kGatherAxesRange);
      for (size_t j = 0; j < i; ++j)
        if ((*dims)[j] == (*dims)[i]) throw PartitionError("a dimension named twice", rule_code::kGatherAxesRange);
    }
  std::vector<int> out;
  for (int d = 0; d < n; ++d) {
    const bool in = std::find(listed.begin(), listed.end(), d) != listed.end();
    if (in == a.axes().has_value()) out.push_back(d);
  }
  return out;
}

Tensors all_gather(const Partition& P_x, const GatherAxes& axes, const Tensors& x) {
  Tensors y = x;
  const auto dims = distdl_axes("axes_all_gather", P_x, axes);
  if (dims.empty())
    for (auto& t : y) t = t.clone();
  for (int d : dims) y = all_gather(P_x, d, d, y);
  double factor = 1;
  for (int d : axes.scale_backward()) factor *= static_cast<double>(P_x.shape()[d]);
  if (factor != 1)
    for (auto& t : y)  // the same values; d t / d y = 1 / factor (no gradient: no scaling)
      if (t.requires_grad()) t = t.detach() + (t - t.detach()) / factor;
  return y;
}

}  // namespace partita::reference
