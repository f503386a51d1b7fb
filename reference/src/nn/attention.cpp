#include "partita/reference/attention.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

namespace partita::reference {

Tensors parallel_self_attention(const Partition& P_tokens, int64_t heads, const at::Tensor& W_qkv,
                                const at::Tensor& b_qkv, const at::Tensor& W_proj, const at::Tensor& b_proj,
                                const Tensors& x) {
  Tensors y;
  for (const auto& t : x) y.push_back(t.clone());
  for (const auto& team : P_tokens.create_allreduction_partition({1}).parts) {
    Tensors pieces;
    for (int w : team.workers()) pieces.push_back(x[w]);
    const at::Tensor X = at::cat(pieces, 1);  // [b, T, H]
    const int64_t b = X.size(0), T = X.size(1), H = X.size(2), hd = H / heads;
    const at::Tensor qkv = (at::matmul(X, W_qkv.t()) + b_qkv).reshape({b, T, heads, 3, hd});
    Tensors per_head;
    for (int64_t h = 0; h < heads; ++h) {
      // float16 and bfloat16 attend in float32 (scores, softmax and the
      // weighted sum), other dtypes in their own.
      const at::ScalarType dtype = qkv.scalar_type();
      const at::ScalarType in = dtype == at::kHalf || dtype == at::kBFloat16 ? at::kFloat : dtype;
      const at::Tensor q = qkv.select(2, h).select(2, 0).to(in), k = qkv.select(2, h).select(2, 1).to(in),
                       v = qkv.select(2, h).select(2, 2).to(in);  // [b, T, hd]
      at::Tensor s = at::matmul(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(hd));  // [b, T, T]
      // Token i sees tokens 0..i.
      const at::Tensor allowed = at::ones({T, T}, at::TensorOptions().dtype(at::kBool)).tril();
      s = at::where(allowed, s, at::full_like(s, -std::numeric_limits<double>::infinity()));
      per_head.push_back(at::matmul(at::softmax(s, -1), v).to(dtype));
    }
    const at::Tensor Y = at::matmul(at::cat(per_head, 2), W_proj.t()) + b_proj;
    int64_t at = 0;
    for (int w : team.workers()) {
      y[w] = Y.narrow(1, at, x[w].size(1));
      at += x[w].size(1);
    }
  }
  return y;
}

}  // namespace partita::reference
