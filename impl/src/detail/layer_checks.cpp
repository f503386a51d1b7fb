#include "detail/layer_checks.hpp"

#include <algorithm>
#include <climits>
#include <map>

namespace partita::mpi::detail {

namespace {
bool member(const Partition& P, int w) {
  return std::find(P.workers().begin(), P.workers().end(), w) != P.workers().end();
}
std::string shape_text(const Header& h) { return "[" + list_string(h.shape()) + "]"; }
}  // namespace

const Header& header_of(const Partition& P_union, const std::vector<Header>& headers, int worker) {
  const auto& w = P_union.workers();
  return headers.at(std::find(w.begin(), w.end(), worker) - w.begin());
}

void check_inputs(const std::string& layer, const Partition& P_union, const Partition& P_x,
                  const std::vector<Header>& headers) {
  int first_px = -1;
  for (int u = 0; u < P_union.size(); ++u) {
    const int w = P_union.workers()[u];
    const Header& h = headers[u];
    if (h.status == Header::kTooManyDims)
      throw ShapeError(layer + ": worker " + std::to_string(w) + " passed a tensor of more than " +
                       std::to_string(kMaxTensorDims) + " dimensions", rule_code::kTooManyDims);
    if (!member(P_x, w)) {
      if (h.numel() != 0)
        throw ShapeError(layer + ": worker " + std::to_string(w) +
                         " is not in P_x but passed a tensor of shape " + shape_text(h) +
                         "; workers outside P_x must pass a zero-volume tensor",
                         rule_code::kOutsideNotEmpty);
      continue;
    }
    if (h.status == Header::kInPlaceLeaf)
      throw ShapeError(layer + ": worker " + std::to_string(w) +
                       " passed a leaf tensor that requires grad to an in-place exchange, which "
                       "would overwrite it; pass a tensor computed from it (e.g. x.clone()) or "
                       "use the out-of-place form", rule_code::kInPlaceLeaf);
    if (h.status == Header::kInPlaceInference)
      throw ShapeError(layer + ": worker " + std::to_string(w) +
                       " passed an inference tensor to an in-place exchange outside c10::InferenceMode, where "
                       "it may not change in place; call it under InferenceMode, or pass a clone",
                       rule_code::kInPlaceRefused);
    if (h.status == Header::kInPlaceView)
      throw ShapeError(layer + ": worker " + std::to_string(w) +
                       " passed a view that autograd cannot rebase (one of several outputs, as chunk or "
                       "split make, or one made under grad mode off) to an in-place exchange; pass a clone "
                       "of it or use the out-of-place form",
                       rule_code::kInPlaceRefused);
    if (h.status == Header::kBadDtype)
      throw ShapeError(layer + ": worker " + std::to_string(w) + " passed dtype " +
                       dtype_name(h.scalar_type()) + ", which partita cannot move",
                       rule_code::kDtypeUnsupported);
    if (first_px < 0) {
      first_px = u;
    } else if (h.dtype != headers[first_px].dtype) {
      throw ShapeError(layer + ": dtypes differ between workers: worker " +
                       std::to_string(P_union.workers()[first_px]) + " passed " +
                       dtype_name(headers[first_px].scalar_type()) + ", worker " +
                       std::to_string(w) + " passed " + dtype_name(h.scalar_type()),
                       rule_code::kDtypeMismatch);
    }
  }
}

void check_same_shapes(const std::string& layer, const Partition& P_union,
                       const std::vector<Ranks>& groups, const std::vector<Header>& headers,
                       const char* group_kind) {
  for (const auto& g : groups) {
    for (size_t i = 1; i < g.size(); ++i) {
      const Header& a = header_of(P_union, headers, g[0]);
      const Header& b = header_of(P_union, headers, g[i]);
      // a.shape() != b.shape(), without building the two vectors per pair
      if (a.ndim != b.ndim || !std::equal(a.dims, a.dims + a.ndim, b.dims))
        throw ShapeError(layer + ": workers " + std::to_string(g[0]) + " and " +
                         std::to_string(g[i]) + " of one " + group_kind +
                         " hold different shapes " + shape_text(a) + " and " + shape_text(b),
                         rule_code::kTeamShapes);
    }
  }
}

std::vector<Ranks> teams_along(const Partition& P_x, const std::vector<int>& axes) {
  std::map<Index, Ranks> by_key;
  for (int r = 0; P_x.active() && r < P_x.size(); ++r) {
    Index key = unravel(r, P_x.shape());
    for (int a : axes) key.at(a) = 0;
    by_key[key].push_back(P_x.workers()[r]);
  }
  std::vector<Ranks> out;
  for (auto& kv : by_key) out.push_back(kv.second);
  return out;
}

void check_volumes_fit(const std::string& layer, const Partition& P_union,
                       const std::vector<Header>& headers) {
  for (int u = 0; u < P_union.size(); ++u)
    if (headers[u].numel() > INT_MAX)
      throw ShapeError(layer + ": worker " + std::to_string(P_union.workers()[u]) +
                       "'s tensor of shape " + shape_text(headers[u]) + " would be one MPI count of " +
                       std::to_string(headers[u].numel()) +
                       " elements, above the MPI count limit (INT_MAX = 2147483647); nothing was sent",
                       rule_code::kCountOverflow);
}

void check_blocks_fit(const std::string& layer, const Partition& P_x,
                      const std::vector<Ranks>& teams, const std::vector<Header>& headers,
                      int64_t dim, bool split) {
  std::vector<int> counts, displs;
  for (const auto& team : teams) {
    if (team.size() < 2) continue;  // nothing goes through MPI
    const Header& first = header_of(P_x, headers, team[0]);
    std::vector<int64_t> lens;
    for (size_t i = 0; i < team.size(); ++i)
      lens.push_back(split ? local_length(first.dims[dim], static_cast<int64_t>(team.size()),
                                          static_cast<int64_t>(i))
                           : header_of(P_x, headers, team[i]).dims[dim]);
    block_counts(lens, row_volume(at::IntArrayRef(first.dims, first.ndim), dim),
                 layer + " (the team of workers [" + workers_string(team) + "])", counts, displs);
  }
}

void check_grad_modes_alike(const std::string& layer, const Partition& P_union,
                            const std::vector<Header>& headers) {
  int on = -1, off = -1;
  for (size_t u = 0; u < headers.size(); ++u) {
    const int w = P_union.workers()[u];
    if (headers[u].requires_grad == Header::kGradModeOff) {
      if (off < 0) off = w;
    } else if (on < 0) {
      on = w;
    }
  }
  if (on >= 0 && off >= 0)
    throw ShapeError(layer + ": the plan of the first call attaches the adjoint, and worker " + std::to_string(on) +
                         " would record it while worker " + std::to_string(off) +
                         " runs with grad mode off (torch::NoGradGuard or c10::InferenceMode) and records "
                         "nothing, so worker " + std::to_string(on) +
                         "'s backward would wait for it; turn grad mode on or off on every worker alike",
                     rule_code::kGradMode);
}

bool agree_attach(const std::string& layer, const Partition& P_union,
                  const std::vector<Header>& headers, const Ranks& members) {
  const Ranks& who = members.empty() ? P_union.workers() : members;
  int wants = -1, off = -1;
  for (const int w : who) {
    const Header& h = header_of(P_union, headers, w);
    if (h.requires_grad == Header::kWantsGrad && wants < 0) wants = w;
    if (h.requires_grad == Header::kGradModeOff && off < 0) off = w;
  }
  if (wants >= 0 && off >= 0)
    throw ShapeError(layer + ": worker " + std::to_string(wants) +
                         " wants a gradient, but worker " + std::to_string(off) +
                         " runs with grad mode off (torch::NoGradGuard or c10::InferenceMode), "
                         "so it would record no backward and worker " + std::to_string(wants) +
                         "'s backward would wait for it; turn grad mode on or off on every "
                         "worker of the call alike",
                     rule_code::kGradMode);
  return wants >= 0;
}

}  // namespace partita::mpi::detail
