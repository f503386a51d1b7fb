// The tensor-parallel causal self-attention's serial twin, on the global
// parameters: each replica's tokens put together, y = proj(attention(qkv(x)))
// on the whole sequence with every head, cut by tokens again. The global QKV
// weight's rows are ordered head by head (q, k, v of head 0, then of head 1,
// ...), as the layer's are.
#pragma once

#include <cstdint>

#include "partita/reference/tensors.hpp"

namespace partita::reference {

// P_tokens: d x t x 1 (replicas, tp ranks, 1); x on its workers [b, T_s, H]
// (world rank order), a clone elsewhere.
Tensors parallel_self_attention(const Partition& P_tokens, int64_t heads, const at::Tensor& W_qkv,
                                const at::Tensor& b_qkv, const at::Tensor& W_proj, const at::Tensor& b_proj,
                                const Tensors& x);

}  // namespace partita::reference
