#include "partita/nn/attention.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "detail/layer_checks.hpp"
#include "detail/plan_cache.hpp"
#include "partita/errors.hpp"
#include "partita/shape.hpp"

namespace partita::nn {

namespace {

// Causal attention of q, k, v [b, T, heads, head_dim]: [b, T, heads * head_dim].
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t T = q.size(1), hd = q.size(3);
  const bool narrow = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  const auto compute = narrow ? at::kFloat : q.scalar_type();
  // [b, heads, T, hd]
  const at::Tensor qh = q.transpose(1, 2).to(compute), kh = k.transpose(1, 2).to(compute),
                   vh = v.transpose(1, 2).to(compute);
  at::Tensor scores = at::matmul(qh, kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
  const at::Tensor future = at::ones({T, T}, at::TensorOptions().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  const at::Tensor out = at::matmul(at::softmax(scores, -1), vh);  // [b, heads, T, hd]
  return out.transpose(1, 2).reshape({q.size(0), T, q.size(2) * hd}).to(q.scalar_type());
}

// x's token split, agreed over P_tokens: the output projection's
// reduce-scatter splits the tokens in balanced pieces, so x must come so
// split, or y would be split otherwise than x (and a residual x + y would
// fail on some workers only). Every worker sees every header and raises
// alike; a split seen before is not checked again.
struct TokenSplit {
  std::string name;
  mpi::Partition P;
  std::vector<Ranks> teams;
  struct Ok {};
  mpi::detail::PlanCache<Ok> plans;

  void check(const at::Tensor& x) const {
    using namespace mpi::detail;
    std::vector<Header> headers;
    if (plans.lookup(P, make_header(x), name, headers)) return;
    for (const Ranks& team : teams) {
      std::vector<int64_t> lengths;
      int64_t total = 0;
      for (const int w : team) {
        const Header& h = header_of(P, headers, w);
        if (h.ndim < 2) return;  // the Linear layer names it
        lengths.push_back(h.dims[1]);
        total += h.dims[1];
      }
      const int64_t k = static_cast<int64_t>(team.size());
      for (int64_t i = 0; i < k; ++i)
        if (lengths[i] != local_length(total, k, i)) {
          std::vector<int64_t> balanced;
          for (int64_t j = 0; j < k; ++j) balanced.push_back(local_length(total, k, j));
          throw ShapeError(name + ": the workers [" + list_string(team) + "] hold [" + list_string(lengths) +
                               "] of the " + std::to_string(total) +
                               " tokens; the output is split as its reduce-scatter splits them, [" +
                               list_string(balanced) + "], so x must come split so",
                           rule_code::kTilingUneven);
        }
    }
    plans.insert(headers, std::make_shared<Ok>());
  }
};

}  // namespace

ParallelSelfAttentionImpl::ParallelSelfAttentionImpl(const mpi::Partition& P_tokens, const mpi::Partition& P_features,
                                                     int64_t hidden, int64_t heads, const LinearOptions& options)
    : P_tokens_(P_tokens), hidden_(hidden), heads_(heads) {
  const std::string name = "ParallelSelfAttention(hidden " + std::to_string(hidden) + ", heads " +
                           std::to_string(heads) + ")";
  const int64_t t = P_features.is_null() || P_features.shape().empty() ? 1 : P_features.shape().back();
  if (heads < 1 || hidden % heads != 0)
    throw PartitionError(name + ": hidden must be a positive multiple of heads", rule_code::kLinearLayout);
  if (heads % t != 0)
    throw PartitionError(name + ": " + std::to_string(heads) + " heads do not divide over the " + std::to_string(t) +
                             " tensor-parallel workers; every worker must hold whole heads",
                         rule_code::kLinearLayout);
  qkv = register_module("qkv", DistributedLinearAllGather(P_tokens, P_features, hidden, 3 * hidden, options));
  if (P_tokens.active() && P_tokens.shape().size() >= 2) {
    auto split = std::make_shared<TokenSplit>();
    split->name = name;
    split->P = P_tokens;
    split->teams = mpi::detail::teams_along(P_tokens, {1});
    split_ = split;
  }
  proj = register_module("proj", DistributedLinearReduceScatter(P_features, P_tokens, hidden, hidden, options));
}

torch::Tensor ParallelSelfAttentionImpl::forward(const torch::Tensor& x) {
  if (!P_tokens_.active()) return x.clone();
  if (split_) static_cast<const TokenSplit*>(split_.get())->check(x);
  const at::Tensor h = qkv->forward(x);  // [b, T, 3 H / t]: this worker's heads
  const int64_t hd = hidden_ / heads_, local = h.size(2) / (3 * hd);
  const at::Tensor parts = h.reshape({h.size(0), h.size(1), local, 3, hd});
  const at::Tensor out = causal_attention(parts.select(3, 0), parts.select(3, 1), parts.select(3, 2));
  return proj->forward(out);
}

}  // namespace partita::nn
