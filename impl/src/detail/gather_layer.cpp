// AllGather and ReduceScatter's shared team code (gather_layer.hpp).
#include "detail/gather_layer.hpp"

#include <ATen/core/grad_mode.h>

#include "detail/agreement.hpp"
#include "detail/layer_checks.hpp"
#include "detail/team_comm.hpp"
#include "partita/errors.hpp"

namespace partita::nn::detail {

using namespace partita::mpi::detail;

std::vector<PeerClaim> GatherLayer::claims(const at::Tensor& x,
                                           const std::vector<int64_t>& lengths) const {
  std::vector<PeerClaim> c(P_x.size());
  if (!team.active()) return c;
  int64_t row = 1;  // elements per index along `dim`
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d != dim) row *= x.size(d);
  const int64_t mine = lengths.at(team.rank()) * row;
  std::vector<int64_t> send, recv;
  for (int64_t len : lengths) {
    send.push_back(gather ? mine : len * row);
    recv.push_back(gather ? len * row : mine);
  }
  add_team_claims(c, P_x, team.workers(), send, recv, static_cast<int64_t>(x.scalar_type()));
  return c;
}

std::shared_ptr<const GatherLayer::Compiled> GatherLayer::prepare(const at::Tensor& x) const {
  std::vector<Header> headers;
  if (auto hit = plans.lookup(P_x, make_header(x), name, headers)) return hit;
  check_inputs(name, P_x, P_x, headers);
  // `dim` must exist; the team's inputs agree except (for a gather) along it.
  for (int u = 0; u < P_x.size(); ++u)
    if (dim >= headers[u].ndim)
      throw ShapeError(name + ": worker " + std::to_string(P_x.workers()[u]) +
                       " passed a tensor of " + std::to_string(headers[u].ndim) +
                       " dimensions, which has no dimension " + std::to_string(dim),
                       rule_code::kMissingDim);
  for (const auto& g : groups) {
    for (size_t i = 1; i < g.size(); ++i) {
      Shape a = header_of(P_x, headers, g[0]).shape(), b = header_of(P_x, headers, g[i]).shape();
      if (gather) a[dim] = b[dim] = 0;
      if (a != b)
        throw ShapeError(name + ": workers " + std::to_string(g[0]) + " and " +
                         std::to_string(g[i]) + " of one team hold shapes [" +
                         list_string(header_of(P_x, headers, g[0]).shape()) + "] and [" +
                         list_string(header_of(P_x, headers, g[i]).shape()) + "]" +
                         (gather ? " that differ outside dimension " + std::to_string(dim) : ""),
                         rule_code::kTeamShapes);
    }
  }
  // Extents along `dim`: the members' own (gather) or the balanced split.
  std::vector<int64_t> lengths;
  for (int w : team.workers()) lengths.push_back(header_of(P_x, headers, w).dims[dim]);
  if (!gather) {
    const int64_t n = x.size(dim), k = team.size();
    for (int64_t i = 0; i < k; ++i) lengths[i] = local_length(n, k, i);
  }
  check_blocks_fit(name, P_x, groups, headers, dim, !gather);
  check_plan(P_x, name, claims(x, lengths));
  auto c = std::make_shared<Compiled>();
  c->lengths = std::move(lengths);
  c->attach = agree_attach(name, P_x, headers);
  plans.insert(headers, c);
  return c;
}

at::Tensor GatherLayer::forward(const at::Tensor& x) const {
  if (!P_x.active()) return x.clone();
  const auto c = prepare(x);
  const std::vector<int64_t>& lengths = c->lengths;
  at::Tensor y;
  {
    const NoGradIfNeeded no_grad(x);
    y = gather ? allgather_dim(team, x, dim, lengths, name, &out_slot)
               : reduce_scatter_dim(team, x, dim, lengths, name, &out_slot);
  }
  // (with_adjoint returns y as it is when no node is attached: the
  // adjoint's closure is only built when one is.)
  if (!c->attach) {
    out_slot.keep(y);
    return y;
  }
  auto adjoint = [t = team, d = dim, g = gather, c, what = adjoint_name](const at::Tensor& gy) {
    return g ? reduce_scatter_dim(t, gy, d, c->lengths, what)
             : allgather_dim(t, gy, d, c->lengths, what);
  };
  return with_adjoint(y, x, true, name, std::move(adjoint));
}

std::shared_ptr<GatherLayer> make(bool gather, const mpi::Partition& P_x, int axis, int64_t dim,
                                  Shapes shapes) {
  auto l = std::make_shared<GatherLayer>();
  l->gather = gather;
  l->name = std::string(gather ? "AllGather" : "ReduceScatter") + "(P_x " + P_x.describe() +
            ", axis " + std::to_string(axis) + ", dim " + std::to_string(dim) + ")";
  l->adjoint_name = l->name + " adjoint";
  l->P_x = P_x;
  l->axis = axis;
  l->dim = dim;
  // The tensor dimension must be valid and the same on every rank of P_x
  // (another dim on one rank moved the same bytes into another shape).
  const auto valid = [&] {
    if (dim < 0) throw PartitionError(l->name + ": negative tensor dimension", rule_code::kGatherNegativeDim);
  };
  if (P_x.active()) {
    mpi::detail::Fingerprint f;
    f.add(static_cast<int64_t>(axis));
    f.add(dim);
    mpi::detail::checked(P_x.comm(), l->name.c_str(), f, valid, "axes or tensor dimensions");
  } else {
    valid();
  }
  l->team = P_x.create_allreduction_partition({axis});
  l->groups = teams_along(P_x, {axis});
  l->plans.set_static_shapes(shapes == Shapes::kStatic);
  return l;
}

std::vector<int> resolve(const char* layer, const char* axes_name, const mpi::Partition& P_x,
                         const GatherAxes& a) {
  const std::string name = std::string(layer) + "(P_x " + P_x.describe() + ")";
  if (a.axes().has_value() == a.axes_keep().has_value())
    throw PartitionError(name + ": give exactly one of " + axes_name + " and axes_keep",
                         rule_code::kGatherAxesChoice);
  const int n = static_cast<int>(P_x.shape().size());
  auto check = [&](const std::vector<int>& dims, const char* what) {
    std::vector<bool> seen(n, false);
    for (int d : dims) {
      if (d < 0 || d >= n)
        throw PartitionError(name + ": " + what + " names dimension " + std::to_string(d) +
                             ", P_x has " + std::to_string(n), rule_code::kGatherAxesRange);
      if (seen[d])
        throw PartitionError(name + ": " + what + " names dimension " + std::to_string(d) +
                             " twice", rule_code::kGatherAxesRange);
      seen[d] = true;
    }
    return seen;
  };
  check(a.scale_backward(), "scale_backward");
  const auto listed = check(a.axes() ? *a.axes() : *a.axes_keep(), a.axes() ? axes_name : "axes_keep");
  std::vector<int> dims;
  for (int d = 0; d < n; ++d)
    if (listed[d] == a.axes().has_value()) dims.push_back(d);
  return dims;
}

at::Tensor run(const std::vector<std::shared_ptr<const GatherLayer>>& layers, const at::Tensor& x) {
  if (layers.empty()) return x.clone();  // nothing to gather: a copy
  at::Tensor y = x;
  for (const auto& l : layers) y = l->forward(y);
  return y;
}

}  // namespace partita::nn::detail
