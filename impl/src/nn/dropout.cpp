#include "partita/nn/dropout.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "partita/mpi/runtime.hpp"

#include "detail/layer_checks.hpp"
#include "detail/plan_cache.hpp"
#include "detail/team_comm.hpp"

namespace partita::nn {

namespace detail {

using namespace partita::mpi::detail;

uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct DropoutPlan {
  std::string name;
  mpi::Partition P;
  std::vector<int> replicated;
  struct Compiled {
    std::vector<int64_t> offset, global;  // this worker's piece in the global tensor
  };
  PlanCache<Compiled> plans;

  std::shared_ptr<const Compiled> place(const at::Tensor& x) const {
    std::vector<Header> headers;
    if (auto hit = plans.lookup(P, make_header(x), name, headers)) return hit;
    check_inputs(name, P, P, headers);
    const int dims = static_cast<int>(P.shape().size());
    for (const int w : P.workers())
      if (header_of(P, headers, w).ndim != dims)
        throw ShapeError(name + ": world rank " + std::to_string(w) + " holds x of shape " +
                             shape_string(header_of(P, headers, w).shape()) + "; it must have " +
                             std::to_string(dims) + " dimensions, as P has",
                         rule_code::kTilingDims);
    auto c = std::make_shared<Compiled>();
    const int me = mpi::world_rank();
    for (int a = 0; a < dims; ++a) {
      int64_t before = 0, total = 0;
      bool seen = false;
      const bool same = std::count(replicated.begin(), replicated.end(), a) > 0;
      for (const auto& g : teams_along(P, {a})) {
        if (std::find(g.begin(), g.end(), me) == g.end()) continue;
        for (const int w : g) {
          const int64_t n = header_of(P, headers, w).dims[a];
          if (w == me) seen = true;
          else if (!seen && !same) before += n;
          if (!same) total += n;
        }
      }
      c->offset.push_back(before);
      c->global.push_back(same ? x.size(a) : total);
    }
    plans.insert(headers, c);
    return c;
  }
};

}  // namespace detail

SeededDropoutImpl::SeededDropoutImpl(const mpi::Partition& P, const DropoutOptions& options)
    : P_(P), options_(options) {
  const std::string name = "SeededDropout(P " + P.describe() + ", p " + std::to_string(options.p()) + ")";
  if (P.is_null()) throw PartitionError(name + ": P is the null partition", rule_code::kNullPartition);
  if (!(options.p() >= 0 && options.p() < 1)) throw PartitionError(name + ": p must be in [0, 1)", rule_code::kAxisRange);
  for (const int a : options.replicated_axes())
    if (a < 0 || a >= static_cast<int>(P.shape().size()))
      throw PartitionError(name + ": replicated axis " + std::to_string(a) + " is no axis of P", rule_code::kAxisRange);
  auto plan = std::make_shared<detail::DropoutPlan>();
  plan->name = name;
  plan->P = P;
  plan->replicated = options.replicated_axes();
  plan_ = plan;
}

void SeededDropoutImpl::reseed(uint64_t seed) {
  options_.seed(seed);
  calls_ = 0;
}

torch::Tensor SeededDropoutImpl::forward(const torch::Tensor& x) {
  if (!is_training() || options_.p() == 0 || !P_.active()) return x;
  const auto place = plan_->place(x);
  const uint64_t key = detail::splitmix64(detail::splitmix64(options_.seed()) ^ calls_++);
  const double p = options_.p();
  // The mask, element by element, at each element's global row-major index.
  const int64_t dims = x.dim(), n = x.numel();
  std::vector<int64_t> stride(static_cast<size_t>(dims), 1);
  for (int64_t d = dims - 2; d >= 0; --d) stride[d] = stride[d + 1] * place->global[d + 1];
  at::Tensor keep = at::empty(x.sizes(), at::TensorOptions().dtype(at::kBool));
  bool* out = keep.data_ptr<bool>();
  std::vector<int64_t> idx(static_cast<size_t>(dims), 0);
  for (int64_t e = 0; e < n; ++e) {
    uint64_t g = 0;
    for (int64_t d = 0; d < dims; ++d) g += static_cast<uint64_t>((place->offset[d] + idx[d]) * stride[d]);
    const double u = static_cast<double>(detail::splitmix64(key ^ g) >> 11) / 9007199254740992.0;
    out[e] = u >= p;
    for (int64_t d = dims - 1; d >= 0; --d) {
      if (++idx[d] < x.size(d)) break;
      idx[d] = 0;
    }
  }
  return x * keep.to(x.scalar_type()) / (1 - p);
}

}  // namespace partita::nn
