#include "partita/nn/attention.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "partita/errors.hpp"

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
  proj = register_module("proj", DistributedLinearReduceScatter(P_features, P_tokens, hidden, hidden, options));
}

torch::Tensor ParallelSelfAttentionImpl::forward(const torch::Tensor& x) {
  if (!P_tokens_.active()) return x.clone();
  const at::Tensor h = qkv->forward(x);  // [b, T, 3 H / t]: this worker's heads
  const int64_t hd = hidden_ / heads_, local = h.size(2) / (3 * hd);
  const at::Tensor parts = h.reshape({h.size(0), h.size(1), local, 3, hd});
  const at::Tensor out = causal_attention(parts.select(3, 0), parts.select(3, 1), parts.select(3, 2));
  return proj->forward(out);
}

}  // namespace partita::nn
