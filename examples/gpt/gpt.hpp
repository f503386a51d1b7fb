// A small GPT under pp x tp x dp with partita's transformer layers
// (docs/transformer.md), and the same model on one process, written from
// its global parameters. examples/train_gpt.cpp trains it; spec_gpt checks
// it equal to one process parameter by parameter.
//
// Layers (a torch::nn::Sequential that smp::DistributedModel cuts into
// stages): an embedding (token and position tables, vocabulary-parallel),
// `layers` pre-norm transformer blocks (x + attention(LN(x)), then
// x + MLP(LN(x)) with a 4x GELU MLP), and a head (final LN, then the
// output projection to the vocabulary, split over tp). Activations between
// layers are [batch, tokens / tp, hidden], split by tokens over the stage's
// tp ranks; the head's output is the logits [batch, tokens, vocab / tp],
// which nn::VocabParallelCrossEntropy takes with the token-split targets.
//
// Dropout (Sizes::dropout > 0): Megatron's hidden dropout, after the
// embedding and on each block's attention and MLP output before it is
// added to x, as nn::SeededDropout over the stage's `tokens` partition
// (docs/transformer.md, "Seeded dropout"). Site k (the embedding 0, block
// l's attention 2l + 1, its MLP 2l + 2) is seeded dropout_seed + k.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "partita/nn/attention.hpp"
#include "partita/nn/dropout.hpp"
#include "partita/nn/layer_norm.hpp"
#include "partita/nn/linear.hpp"
#include "partita/nn/vocab_parallel.hpp"
#include "partita/smp/tensor_parallel.hpp"

namespace gpt {

struct Sizes {
  int64_t vocab = 128, context = 64, hidden = 64, heads = 4, layers = 4;
  at::ScalarType dtype = at::kFloat;
  // The Linear layers' data parallelism (docs/3d.md): every replica holds
  // its blocks and the step averages their gradients (true, as torch's
  // DistributedDataParallel), or seed 002's, stored on replica 0 and
  // broadcast in every forward (false).
  bool replicated = true;
  // The probability of the hidden dropout (0: none, and no dropout layer).
  double dropout = 0;
  uint64_t dropout_seed = 1000;
};

// The dropout sites' numbers (see above).
inline int embedding_site() { return 0; }
inline int attention_site(int64_t l) { return static_cast<int>(2 * l + 1); }
inline int mlp_site(int64_t l) { return static_cast<int>(2 * l + 2); }

using Parameters = std::map<std::string, at::Tensor>;

inline std::string block_name(int64_t l, const std::string& p) { return "blocks." + std::to_string(l) + "." + p; }

// The global parameters, the same on every rank for a seed. The QKV
// weight's rows are ordered head by head (q, k, v of each head together).
inline Parameters init_parameters(const Sizes& s, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  const auto o = at::TensorOptions().dtype(at::kDouble);
  auto normal = [&](std::vector<int64_t> shape, double scale) { return (at::randn(shape, gen, o) * scale).to(s.dtype); };
  // LayerNorm weights near 1 and biases near 0, drawn so that a wrong
  // gradient of either shows.
  auto near = [&](double centre) { return (at::randn({s.hidden}, gen, o) * 0.1 + centre).to(s.dtype); };
  const int64_t H = s.hidden;
  Parameters p;
  p["embed.tokens"] = normal({s.vocab, H}, 0.5);
  p["embed.positions"] = normal({s.context, H}, 0.5);
  for (int64_t l = 0; l < s.layers; ++l) {
    p[block_name(l, "ln1.weight")] = near(1);
    p[block_name(l, "ln1.bias")] = near(0);
    p[block_name(l, "attn.qkv.weight")] = normal({3 * H, H}, 1 / std::sqrt(double(H)));
    p[block_name(l, "attn.qkv.bias")] = normal({3 * H}, 0.1);
    p[block_name(l, "attn.proj.weight")] = normal({H, H}, 1 / std::sqrt(double(H)));
    p[block_name(l, "attn.proj.bias")] = normal({H}, 0.1);
    p[block_name(l, "ln2.weight")] = near(1);
    p[block_name(l, "ln2.bias")] = near(0);
    p[block_name(l, "mlp.up.weight")] = normal({4 * H, H}, 1 / std::sqrt(double(H)));
    p[block_name(l, "mlp.up.bias")] = normal({4 * H}, 0.1);
    p[block_name(l, "mlp.down.weight")] = normal({H, 4 * H}, 1 / std::sqrt(double(4 * H)));
    p[block_name(l, "mlp.down.bias")] = normal({H}, 0.1);
  }
  p["head.ln.weight"] = near(1);
  p["head.ln.bias"] = near(0);
  p["head.out.weight"] = normal({s.vocab, H}, 1 / std::sqrt(double(H)));
  p["head.out.bias"] = normal({s.vocab}, 0.1);
  return p;
}

// ---- One process, on the global parameters --------------------------------

inline at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return at::layer_norm(x, {x.size(-1)}, w, b, 1e-5);
}

// Causal attention with every head; qkv rows head by head.
inline at::Tensor attention(const Parameters& p, int64_t l, const Sizes& s, const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), H = s.hidden, hd = H / s.heads;
  const at::Tensor qkv =
      at::linear(x, p.at(block_name(l, "attn.qkv.weight")), p.at(block_name(l, "attn.qkv.bias"))).reshape({B, T, s.heads, 3, hd});
  const at::Tensor q = qkv.select(3, 0).transpose(1, 2), k = qkv.select(3, 1).transpose(1, 2),
                   v = qkv.select(3, 2).transpose(1, 2);  // [B, heads, T, hd]
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(hd));
  const at::Tensor future = at::ones({T, T}, at::TensorOptions().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -INFINITY);
  const at::Tensor out = at::matmul(at::softmax(scores, -1), v).transpose(1, 2).reshape({B, T, H});
  return at::linear(out, p.at(block_name(l, "attn.proj.weight")), p.at(block_name(l, "attn.proj.bias")));
}

// Dropout on one process: site k's x [B, T, H] -> x with the site's masks
// applied (none when empty).
using Dropout = std::function<at::Tensor(int site, const at::Tensor& x)>;

// ids [B, T] -> logits [B, T, vocab].
inline at::Tensor forward(const Parameters& p, const Sizes& s, const at::Tensor& ids, const Dropout& drop = {}) {
  const int64_t T = ids.size(1);
  auto dropped = [&](int site, const at::Tensor& x) { return drop ? drop(site, x) : x; };
  at::Tensor x = dropped(embedding_site(),
                         at::embedding(p.at("embed.tokens"), ids) + p.at("embed.positions").narrow(0, 0, T).unsqueeze(0));
  for (int64_t l = 0; l < s.layers; ++l) {
    x = x + dropped(attention_site(l),
                    attention(p, l, s, layer_norm(x, p.at(block_name(l, "ln1.weight")), p.at(block_name(l, "ln1.bias")))));
    const at::Tensor h = layer_norm(x, p.at(block_name(l, "ln2.weight")), p.at(block_name(l, "ln2.bias")));
    x = x + dropped(mlp_site(l),
                    at::linear(at::gelu(at::linear(h, p.at(block_name(l, "mlp.up.weight")), p.at(block_name(l, "mlp.up.bias")))),
                               p.at(block_name(l, "mlp.down.weight")), p.at(block_name(l, "mlp.down.bias"))));
  }
  x = layer_norm(x, p.at("head.ln.weight"), p.at("head.ln.bias"));
  return at::linear(x, p.at("head.out.weight"), p.at("head.out.bias"));
}

// ---- The distributed model ---------------------------------------------------

namespace pn = partita::nn;

inline pn::LinearOptions linear_options(const Sizes& s) {
  return pn::LinearOptions().dtype(s.dtype).replicated(s.replicated);
}
inline pn::LayerNormOptions norm_options(const Sizes& s) { return pn::LayerNormOptions().dtype(s.dtype); }

// Site k's dropout on the stage's token-split activations, or none.
inline pn::SeededDropout dropout(torch::nn::Module& m, const partita::smp::StagePartitions& P, const Sizes& s,
                                 const std::string& name, int site) {
  if (s.dropout == 0) return nullptr;
  return m.register_module(name, pn::SeededDropout(P.tokens, pn::DropoutOptions().p(s.dropout).seed(s.dropout_seed + site)));
}
inline at::Tensor maybe_drop(pn::SeededDropout& d, const at::Tensor& x) { return d ? d(x) : x; }

// Input [b, T_s, 2] int64: each token's id and position.
struct EmbedImpl : torch::nn::Module {
  EmbedImpl(const partita::smp::StagePartitions& P, const Sizes& s) {
    const auto o = pn::EmbeddingOptions().dtype(s.dtype);
    tokens = register_module("tokens", pn::VocabParallelEmbedding(P.tokens, s.vocab, s.hidden, o));
    positions = register_module("positions", pn::VocabParallelEmbedding(P.tokens, s.context, s.hidden, o));
    drop = dropout(*this, P, s, "drop", embedding_site());
  }
  at::Tensor forward(const at::Tensor& x) {
    return gpt::maybe_drop(drop, tokens(x.select(2, 0).contiguous()) + positions(x.select(2, 1).contiguous()));
  }
  pn::VocabParallelEmbedding tokens{nullptr}, positions{nullptr};
  pn::SeededDropout drop{nullptr};
};
TORCH_MODULE(Embed);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const partita::smp::StagePartitions& P, const Sizes& s, int64_t l) {
    ln1 = register_module("ln1", pn::SequenceParallelLayerNorm(P.tokens, s.hidden, norm_options(s)));
    attn = register_module("attn", pn::ParallelSelfAttention(P.tokens, P.features, s.hidden, s.heads, linear_options(s)));
    ln2 = register_module("ln2", pn::SequenceParallelLayerNorm(P.tokens, s.hidden, norm_options(s)));
    up = register_module("up", pn::DistributedLinearAllGather(P.tokens, P.features, s.hidden, 4 * s.hidden, linear_options(s)));
    down = register_module("down", pn::DistributedLinearReduceScatter(P.features, P.tokens, 4 * s.hidden, s.hidden, linear_options(s)));
    attn_drop = dropout(*this, P, s, "attn_drop", attention_site(l));
    mlp_drop = dropout(*this, P, s, "mlp_drop", mlp_site(l));
  }
  at::Tensor forward(at::Tensor x) {
    x = x + gpt::maybe_drop(attn_drop, attn(ln1(x)));
    return x + gpt::maybe_drop(mlp_drop, down(at::gelu(up(ln2(x)))));
  }
  pn::SeededDropout attn_drop{nullptr}, mlp_drop{nullptr};
  pn::SequenceParallelLayerNorm ln1{nullptr}, ln2{nullptr};
  pn::ParallelSelfAttention attn{nullptr};
  pn::DistributedLinearAllGather up{nullptr};
  pn::DistributedLinearReduceScatter down{nullptr};
};
TORCH_MODULE(Block);

struct HeadImpl : torch::nn::Module {
  HeadImpl(const partita::smp::StagePartitions& P, const Sizes& s) {
    ln = register_module("ln", pn::SequenceParallelLayerNorm(P.tokens, s.hidden, norm_options(s)));
    out = register_module("out", pn::DistributedLinearAllGather(P.tokens, P.features, s.hidden, s.vocab, linear_options(s)));
  }
  at::Tensor forward(const at::Tensor& x) { return out(ln(x)); }
  pn::SequenceParallelLayerNorm ln{nullptr};
  pn::DistributedLinearAllGather out{nullptr};
};
TORCH_MODULE(Head);

// The model's layers (embedding, blocks, head), each built on the stage
// `stage_of(layer)` will run it on; every rank builds every layer.
struct Model {
  Embed embed{nullptr};
  std::vector<Block> blocks;
  Head head{nullptr};
  torch::nn::Sequential layers;
  std::vector<int> stage_of;  // pp rank of each layer
};

// Balanced split points of `layers + 2` layers into `stages` (pp x virtual).
inline std::vector<int> split_points(const Sizes& s, int stages) {
  const int n = static_cast<int>(s.layers) + 2;
  std::vector<int> out;
  for (int k = 1; k < stages; ++k) out.push_back(k * n / stages);
  return out;
}

inline Model build(const std::vector<partita::smp::StagePartitions>& parts, const Sizes& s, int virtual_stages = 1) {
  const int pp = static_cast<int>(parts.size());
  const auto splits = split_points(s, pp * virtual_stages);
  auto stage = [&](int layer) {
    int g = 0;
    while (g < static_cast<int>(splits.size()) && layer >= splits[g]) ++g;
    return g % pp;  // virtual stage g runs on pp rank g mod pp
  };
  Model m;
  int k = 0;
  m.embed = Embed(parts[stage(k)], s);
  m.stage_of.push_back(stage(k++));
  m.layers->push_back(m.embed);
  for (int64_t l = 0; l < s.layers; ++l) {
    m.blocks.emplace_back(parts[stage(k)], s, l);
    m.stage_of.push_back(stage(k++));
    m.layers->push_back(m.blocks.back());
  }
  m.head = Head(parts[stage(k)], s);
  m.stage_of.push_back(stage(k++));
  m.layers->push_back(m.head);
  return m;
}

inline torch::nn::Linear as_linear(const at::Tensor& w, const at::Tensor& b) {
  torch::nn::Linear l(torch::nn::LinearOptions(w.size(1), w.size(0)));
  l->to(w.scalar_type());
  torch::NoGradGuard no_grad;
  l->weight.copy_(w);
  l->bias.copy_(b);
  return l;
}

inline void load_rows(pn::VocabParallelEmbeddingImpl& e, const at::Tensor& table) {
  torch::NoGradGuard no_grad;
  e.weight.copy_(table.narrow(0, e.vocab_start(), e.weight.size(0)));
}

inline void load_norm(pn::SequenceParallelLayerNormImpl& n, const at::Tensor& w, const at::Tensor& b) {
  torch::NoGradGuard no_grad;
  n.weight.copy_(w);
  n.bias.copy_(b);
}

// Each rank's pieces of the global parameters (no communication but the
// Linear layers' agreement that the global layer fits).
inline void load(Model& m, const Parameters& p) {
  load_rows(*m.embed->tokens, p.at("embed.tokens"));
  load_rows(*m.embed->positions, p.at("embed.positions"));
  for (size_t l = 0; l < m.blocks.size(); ++l) {
    auto& b = *m.blocks[l];
    const auto L = static_cast<int64_t>(l);
    load_norm(*b.ln1, p.at(block_name(L, "ln1.weight")), p.at(block_name(L, "ln1.bias")));
    load_norm(*b.ln2, p.at(block_name(L, "ln2.weight")), p.at(block_name(L, "ln2.bias")));
    b.attn->qkv->scatter_parameters(as_linear(p.at(block_name(L, "attn.qkv.weight")), p.at(block_name(L, "attn.qkv.bias"))));
    b.attn->proj->scatter_parameters(as_linear(p.at(block_name(L, "attn.proj.weight")), p.at(block_name(L, "attn.proj.bias"))));
    b.up->scatter_parameters(as_linear(p.at(block_name(L, "mlp.up.weight")), p.at(block_name(L, "mlp.up.bias"))));
    b.down->scatter_parameters(as_linear(p.at(block_name(L, "mlp.down.weight")), p.at(block_name(L, "mlp.down.bias"))));
  }
  load_norm(*m.head->ln, p.at("head.ln.weight"), p.at("head.ln.bias"));
  m.head->out->scatter_parameters(as_linear(p.at("head.out.weight"), p.at("head.out.bias")));
}

// Every parameter of the layers this rank runs (pp rank `pp_rank`) against
// the global ones: name -> this rank's piece and the same piece of
// `global`. The Linear layers are gathered (collective over each layer's
// workers: every rank of a stage calls this for the same layers).
inline std::vector<std::tuple<std::string, at::Tensor, at::Tensor>> pieces(Model& m, const Parameters& global, int pp_rank) {
  std::vector<std::tuple<std::string, at::Tensor, at::Tensor>> out;
  auto linear = [&](const std::string& name, pn::DistributedLinearBase& l) {
    const torch::nn::Linear g = l.gather_parameters();
    out.emplace_back(name + ".weight", g->weight, global.at(name + ".weight"));
    out.emplace_back(name + ".bias", g->bias, global.at(name + ".bias"));
    // This rank's own blocks too (every replica's, where each holds them).
    if (l.local_weight().defined()) {
      const auto [r0, rn, c0, cn] = l.weight_block();
      out.emplace_back(name + ".weight (this rank's block)", l.local_weight(),
                       global.at(name + ".weight").slice(0, r0, r0 + rn).slice(1, c0, c0 + cn));
    }
    if (l.local_bias().defined()) {
      const auto [b0, bn] = l.bias_block();
      out.emplace_back(name + ".bias (this rank's block)", l.local_bias(), global.at(name + ".bias").slice(0, b0, b0 + bn));
    }
  };
  auto norm = [&](const std::string& name, pn::SequenceParallelLayerNormImpl& n) {
    out.emplace_back(name + ".weight", n.weight, global.at(name + ".weight"));
    out.emplace_back(name + ".bias", n.bias, global.at(name + ".bias"));
  };
  auto rows = [&](const std::string& name, pn::VocabParallelEmbeddingImpl& e) {
    out.emplace_back(name, e.weight, global.at(name).narrow(0, e.vocab_start(), e.weight.size(0)));
  };
  int k = 0;
  if (m.stage_of[k++] == pp_rank) {
    rows("embed.tokens", *m.embed->tokens);
    rows("embed.positions", *m.embed->positions);
  }
  for (size_t l = 0; l < m.blocks.size(); ++l) {
    if (m.stage_of[k++] != pp_rank) continue;
    auto& b = *m.blocks[l];
    const auto L = static_cast<int64_t>(l);
    norm(block_name(L, "ln1"), *b.ln1);
    norm(block_name(L, "ln2"), *b.ln2);
    linear(block_name(L, "attn.qkv"), *b.attn->qkv);
    linear(block_name(L, "attn.proj"), *b.attn->proj);
    linear(block_name(L, "mlp.up"), *b.up);
    linear(block_name(L, "mlp.down"), *b.down);
  }
  if (m.stage_of[k++] == pp_rank) {
    norm("head.ln", *m.head->ln);
    linear("head.out", *m.head->out);
  }
  return out;
}

}  // namespace gpt
