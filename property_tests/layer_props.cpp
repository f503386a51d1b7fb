// Lockstep properties of partita's layers with parameters, through
// partita::testing's module checks (docs/testing-library.md, "Checks for a
// module with parameters"): every rank's outputs, input gradients and
// parameter gradients (a shard against the slice of the twin's global
// gradient, a replicated parameter against the whole) against a twin
// written here on the global parameters, the adjoint identity in the
// parameters, and finite differences in one case of ten.
//
//  - SequenceParallelLayerNorm: tokens split over the world (uneven, some
//    ranks with none), the weight and bias replicated and their gradients
//    summed over the team; on a partition with a data-parallel axis too.
//  - VocabParallelEmbedding: the table's rows split over the world (uneven),
//    token ids split by tokens; VocabParallelCrossEntropy: logits split by
//    vocabulary, targets by tokens, on replicas too (ids and targets drawn
//    in 0..7, so the vocabulary has 8 to 13 entries); both against the
//    reference's twins (reference::vocab_parallel_embedding and
//    reference::vocab_parallel_cross_entropy).
//  - ParallelSelfAttention: heads split over t (1 or 2 per worker), tokens
//    uneven, on replicas too, against reference::parallel_self_attention.
//  - SeededDropout: each worker's mask against one process's mask of the
//    whole tensor (the global batch and sequence), cut as the input is; and
//    a region replicated over t drawing the same mask on every worker.
//  - DistributedLinearAllGather and DistributedLinearReduceScatter on a
//    stage's partitions (batch over d replicas, tokens or features over t):
//    W and b stored on replica 0 in blocks, their gradients the sum of every
//    replica's share.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "partita/errors.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/attention.hpp"
#include "partita/nn/dropout.hpp"
#include "partita/nn/layer_norm.hpp"
#include "partita/nn/linear.hpp"
#include "partita/nn/vocab_parallel.hpp"
#include "partita/reference/attention.hpp"
#include "partita/reference/dropout.hpp"
#include "partita/reference/layer_norm.hpp"
#include "partita/reference/vocab_parallel.hpp"
#include "partita/reference/linear.hpp"
#include "partita/reference/partition.hpp"
#include "partita/testing/lockstep.hpp"
#include "partita/testing/module_checks.hpp"
#include "partita/testing/partition_cases.hpp"

namespace partita::testing {
namespace {

int64_t length(int64_t n, int64_t p, int64_t i) { return n / p + (i < n % p ? 1 : 0); }
int64_t first(int64_t n, int64_t p, int64_t i) { return i * (n / p) + std::min(i, n % p); }

struct LayoutCase {
  int64_t d = 1;  // replicas (axis 0); the world is d x t
  int64_t batch = 1, tokens = 1, features = 1, out = 1;
  uint64_t seed = 0;
};
std::ostream& operator<<(std::ostream& os, const LayoutCase& c) {
  return os << "{\"d\": " << c.d << ", \"batch\": " << c.batch << ", \"tokens\": " << c.tokens
            << ", \"features\": " << c.features << ", \"out\": " << c.out << ", \"seed\": " << c.seed << "}";
}

rc::Gen<LayoutCase> gen_layout(int world, int64_t min_features) {
  std::vector<int64_t> ds;
  for (int64_t d = 1; d <= world; ++d)
    if (world % d == 0) ds.push_back(d);
  return rc::gen::apply(
      [world](int64_t d, int64_t b, int64_t tokens, int64_t f, int64_t out, uint64_t seed) {
        LayoutCase c;
        c.d = d;
        c.batch = d * b;
        c.tokens = tokens;
        c.features = f;
        c.out = out;
        c.seed = seed;
        (void)world;
        return c;
      },
      rc::gen::elementOf(ds), rc::gen::inRange<int64_t>(1, 3), rc::gen::inRange<int64_t>(1, 2 * world + 2),
      rc::gen::inRange<int64_t>(min_features, min_features + 5), rc::gen::inRange<int64_t>(min_features, min_features + 5),
      rc::gen::inRange<uint64_t>(0, 1000000));
}

// World rank (q, s) of a d x t grid, q the replica.
int rank_of(int64_t t, int64_t q, int64_t s) { return static_cast<int>(q * t + s); }

TEST(LayerProperty, SequenceParallelLayerNormMatchesItsTwin) {
  const int p = mpi::world_size();
  EXPECT_TRUE(check_lockstep<LayoutCase>("sequence-parallel layer norm", gen_layout(p, 1), [&](const LayoutCase& c,
                                                                                               Verdict& v) {
    const int64_t t = p / c.d, me = mpi::world_rank();
    const auto P = mpi::Partition::world().create_cartesian_topology_partition({c.d, t, 1});
    // Over a data-parallel axis the gradient is summed over the whole
    // world here (outside a pipeline nothing averages the replicas).
    nn::SequenceParallelLayerNorm layer(
        P, c.features, nn::LayerNormOptions().dtype(at::kDouble).grad_sum_axes(c.d > 1 ? std::vector<int>{0, 1} : std::vector<int>{}));
    auto shape_of = [&](int r) {
      return Shape{c.batch / c.d, length(c.tokens, t, r % t), c.features};
    };
    DistributedModule m;
    m.name = "SequenceParallelLayerNorm";
    m.run = [&](const Tensors& xs) { return Tensors{layer->forward(xs[0])}; };
    m.shards = [&] { return std::vector<ParameterShard>{{"weight", layer->weight, {}}, {"bias", layer->bias, {}}}; };
    m.parameters = {{"weight", {c.features}}, {"bias", {c.features}}};
    m.input_shapes = [&](int r) { return std::vector<Shape>{shape_of(r)}; };
    // The reference's layer norm (mean and variance written out), not
    // LibTorch's at::layer_norm, which the layer itself calls.
    m.twin = [&](const std::vector<Tensors>& xs, const ParameterMap& w) {
      Tensors x;
      for (const auto& v : xs) x.push_back(v[0]);
      const auto ref = reference::Partition::world(p).create_cartesian_topology_partition({c.d, t, 1});
      std::vector<Tensors> ys;
      for (const at::Tensor& y :
           reference::sequence_parallel_layer_norm(ref, c.features, w.at("weight"), w.at("bias"), 1e-5, x))
        ys.push_back({y});
      return ys;
    };
    (void)me;
    check_module_all(m, c.seed, v,
                     ModuleCheckOptions().adjoint_parameters(true).finite_differences(c.seed % 10 == 0));
  }));
}

// The all-gather layer: x split by tokens over t (and by batch over d), y
// by output features; the reduce-scatter layer the other way round.
TEST(LayerProperty, DistributedLinearLayersMatchTheirTwins) {
  const int p = mpi::world_size();
  for (const bool all_gather : {true, false}) {
    EXPECT_TRUE(check_lockstep<LayoutCase>(
        all_gather ? "linear all-gather, global parameters" : "linear reduce-scatter, global parameters",
        gen_layout(p, p), [&](const LayoutCase& c, Verdict& v) {
          const int64_t t = p / c.d;
          const auto tokens = mpi::Partition::world().create_cartesian_topology_partition({c.d, t, 1});
          const auto features = mpi::Partition::world().create_cartesian_topology_partition({c.d, 1, t});
          const auto o = nn::LinearOptions().dtype(at::kDouble);
          std::shared_ptr<nn::DistributedLinearBase> layer;
          if (all_gather)
            layer = nn::DistributedLinearAllGather(tokens, features, c.features, c.out, o).ptr();
          else
            layer = nn::DistributedLinearReduceScatter(features, tokens, c.features, c.out, o).ptr();
          const int64_t rows = c.batch / c.d;
          DistributedModule m;
          m.name = all_gather ? "DistributedLinearAllGather" : "DistributedLinearReduceScatter";
          m.run = [&](const Tensors& xs) { return Tensors{layer->forward(xs[0])}; };
          m.shards = [&] {
            std::vector<ParameterShard> s;
            const auto wb = layer->weight_block();
            const auto bb = layer->bias_block();
            if (layer->local_weight().defined() && wb[1] > 0) s.push_back({"weight", layer->local_weight(), {wb[0], wb[2]}});
            if (layer->local_bias().defined() && bb[1] > 0) s.push_back({"bias", layer->local_bias(), {bb[0]}});
            return s;
          };
          m.parameters = {{"weight", {c.out, c.features}}, {"bias", {c.out}}};
          m.input_shapes = [&](int r) {
            const int64_t s = r % t;
            return std::vector<Shape>{all_gather ? Shape{rows, length(c.tokens, t, s), c.features}
                                                 : Shape{rows, c.tokens, length(c.features, t, s)}};
          };
          // The twin, the obvious way: each replica's whole x, one GEMM with
          // the global W and b, cut as the layer's output is cut.
          m.twin = [&](const std::vector<Tensors>& xs, const ParameterMap& w) {
            std::vector<Tensors> ys(xs.size());
            for (int64_t q = 0; q < c.d; ++q) {
              Tensors pieces;
              for (int64_t s = 0; s < t; ++s) pieces.push_back(xs[rank_of(t, q, s)][0]);
              const at::Tensor X = at::cat(pieces, all_gather ? 1 : 2);
              const at::Tensor Y = at::linear(X, w.at("weight"), w.at("bias"));
              for (int64_t s = 0; s < t; ++s)
                ys[rank_of(t, q, s)] = {all_gather ? Y.narrow(2, first(c.out, t, s), length(c.out, t, s))
                                                   : Y.narrow(1, first(c.tokens, t, s), length(c.tokens, t, s))};
            }
            return ys;
          };
          check_module_all(m, c.seed, v,
                           ModuleCheckOptions().adjoint_parameters(true).finite_differences(c.seed % 10 == 0));
        }));
  }
}

// The table's rows over t = world ranks (one replica: over replicas the
// table is replicated and smp's pipeline averages it, docs/3d.md).
TEST(LayerProperty, VocabParallelEmbeddingMatchesItsTwin) {
  const int p = mpi::world_size();
  EXPECT_TRUE(check_lockstep<LayoutCase>("vocab-parallel embedding", gen_layout(p, 1), [&](const LayoutCase& c,
                                                                                          Verdict& v) {
    const int64_t t = p, vocab = 8 + c.out % 6, rows = c.batch / c.d;
    const auto P = mpi::Partition::world().create_cartesian_topology_partition({1, t, 1});
    nn::VocabParallelEmbedding layer(P, vocab, c.features, nn::EmbeddingOptions().dtype(at::kDouble));
    DistributedModule m;
    m.name = "VocabParallelEmbedding";
    m.run = [&](const Tensors& xs) { return Tensors{layer->forward(xs[0])}; };
    m.shards = [&] { return std::vector<ParameterShard>{{"weight", layer->weight, {layer->vocab_start(), 0}}}; };
    m.parameters = {{"weight", {vocab, c.features}}};
    m.input_shapes = [&](int r) { return std::vector<Shape>{{rows, length(c.tokens, t, r)}}; };
    m.integer_inputs = {{0, at::kLong}};
    m.integer_high = {{0, vocab}};
    // The reference's embedding (rows picked from the global table), not
    // at::embedding, which the layer itself calls.
    m.twin = [&](const std::vector<Tensors>& xs, const ParameterMap& w) {
      Tensors ids;
      for (const auto& x : xs) ids.push_back(x[0]);
      const auto ref = reference::Partition::world(p).create_cartesian_topology_partition({1, t, 1});
      std::vector<Tensors> ys;
      for (const at::Tensor& y : reference::vocab_parallel_embedding(ref, w.at("weight"), ids)) ys.push_back({y});
      return ys;
    };
    check_module_all(m, c.seed, v,
                     ModuleCheckOptions().adjoint_parameters(true).finite_differences(c.seed % 10 == 0));
  }));
}

TEST(LayerProperty, VocabParallelCrossEntropyMatchesItsTwin) {
  const int p = mpi::world_size();
  EXPECT_TRUE(check_lockstep<LayoutCase>("vocab-parallel cross-entropy", gen_layout(p, 1), [&](const LayoutCase& c,
                                                                                              Verdict& v) {
    const int64_t t = p / c.d, vocab = 8 + c.out % 6, rows = c.batch / c.d;
    const auto P = mpi::Partition::world().create_cartesian_topology_partition({c.d, t, 1});
    nn::VocabParallelCrossEntropy loss(P, vocab);
    DistributedModule m;
    m.name = "VocabParallelCrossEntropy";
    m.run = [&](const Tensors& xs) { return Tensors{loss->forward(xs[0], xs[1])}; };
    m.shards = [] { return std::vector<ParameterShard>{}; };
    m.input_shapes = [&](int r) {
      const int64_t s = r % t;
      return std::vector<Shape>{{rows, c.tokens, length(vocab, t, s)}, {rows, length(c.tokens, t, s)}};
    };
    m.integer_inputs = {{1, at::kLong}};
    m.integer_high = {{1, vocab}};
    // The reference's loss: each replica's whole logits and targets,
    // logsumexp less the target's logit, cut by tokens.
    m.twin = [&](const std::vector<Tensors>& xs, const ParameterMap&) {
      Tensors logits, targets;
      for (const auto& x : xs) {
        logits.push_back(x[0]);
        targets.push_back(x[1]);
      }
      const auto ref = reference::Partition::world(p).create_cartesian_topology_partition({c.d, t, 1});
      std::vector<Tensors> ys;
      for (const at::Tensor& y : reference::vocab_parallel_cross_entropy(ref, logits, targets)) ys.push_back({y});
      return ys;
    };
    check_module_all(m, c.seed, v, ModuleCheckOptions().finite_differences(c.seed % 10 == 0));
  }));
}

// 16-bit logits are taken in float32 (docs/transformer.md): the loss is
// float32, equal to the float64 twin's on the same 16-bit values within
// float32 rounding, also where the workers' maxima lie far apart (an
// all-reduce of the maximum over 16-bit bit patterns would pick a negative
// one over a positive one); the gradient comes back in the logits' dtype.
TEST(LayerProperty, VocabParallelCrossEntropyTakes16BitLogitsInFloat32) {
  const int p = mpi::world_size(), r = mpi::world_rank();
  const auto P = mpi::Partition::world().create_cartesian_topology_partition({1, p, 1});
  const int64_t vocab = 3 * p + 1, rows = vocab / p + (r < vocab % p ? 1 : 0);
  nn::VocabParallelCrossEntropy loss(P, vocab);
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    // Worker r's logits around 20 - 40 r: the maxima differ in sign and by far more than exp's range in 16 bits.
    std::vector<at::Tensor> all_logits, all_targets;
    for (int q = 0; q < p; ++q) {
      at::manual_seed(100 + q);
      const int64_t rq = vocab / p + (q < vocab % p ? 1 : 0);
      all_logits.push_back((at::randn({2, 2 * p, rq}, at::kDouble) + 20 - 40 * q).to(dtype));
      all_targets.push_back(at::randint(vocab, {2, 2}, at::kLong));
    }
    const at::Tensor logits = all_logits[r].clone().requires_grad_();
    const at::Tensor l = loss->forward(logits, all_targets[r]);
    l.sum().backward();
    // The twin, in float64 on the same values.
    const at::Tensor whole = at::cat(all_logits, 2).to(at::kDouble).requires_grad_();
    const at::Tensor targets = at::cat(all_targets, 1);
    const at::Tensor want = at::logsumexp(whole, -1) - whole.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
    want.sum().backward();
    const at::Tensor mine = want.narrow(1, 2 * r, 2).detach();
    const at::Tensor grad = whole.grad().narrow(2, vocab / p * r + std::min<int64_t>(r, vocab % p), rows);
    EXPECT_EQ(l.scalar_type(), at::kFloat) << dtype;
    EXPECT_TRUE(at::allclose(l.to(at::kDouble), mine, 1e-5, 1e-5)) << dtype << ", rank " << r << ": " << l << " for " << mine;
    if (!logits.grad().defined()) {
      ADD_FAILURE() << "no gradient, rank " << r;
      continue;  // (in step with the other ranks)
    }
    EXPECT_EQ(logits.grad().scalar_type(), dtype);
    EXPECT_TRUE(at::allclose(logits.grad().to(at::kDouble), grad, 0, 1e-2)) << dtype << ", rank " << r;
  }
}

// An id or a target outside the vocabulary on one rank raises ShapeError on
// every rank of its team (each sees the whole team's after the all-gather),
// never a silent zero row; a good call works afterwards.
TEST(LayerProperty, TokensOutsideTheVocabularyRaiseOnEveryRank) {
  const int p = mpi::world_size();
  const auto P = mpi::Partition::world().create_cartesian_topology_partition({1, p, 1});
  nn::VocabParallelEmbedding embed(P, 8, 3, nn::EmbeddingOptions().dtype(at::kDouble));
  nn::VocabParallelCrossEntropy loss(P, 8);
  at::Tensor ids = at::zeros({2, 2}, at::kLong);
  if (mpi::world_rank() == p - 1) ids[1][1] = 8;
  std::string e1, e2;
  try {
    embed->forward(ids);
  } catch (const ShapeError& e) {
    e1 = e.what();
  }
  try {
    loss->forward(at::zeros({2, 2 * p, 8 / p + (mpi::world_rank() < 8 % p ? 1 : 0)}, at::kDouble), ids);
  } catch (const ShapeError& e) {
    e2 = e.what();
  }
  EXPECT_NE(e1.find("ids 8 lies outside the vocabulary [0, 8)"), std::string::npos) << e1;
  EXPECT_NE(e2.find("targets 8 lies outside the vocabulary [0, 8)"), std::string::npos) << e2;
  ids.zero_();
  EXPECT_EQ(embed->forward(ids).sizes(), (at::IntArrayRef{2, 2, 3}));
}

// The cross-entropy's edges (docs/transformer.md): logits shifted by 1000
// give the same loss (the maximum comes out before exp); a negative target
// raises on every rank; logits whose batch or tokens disagree with the
// targets raise ShapeError on every rank before any collective of unequal
// counts, also when the logits' shapes were seen before with other targets.
TEST(LayerProperty, VocabParallelCrossEntropyRefusesWhatItCannotCompute) {
  const int p = mpi::world_size(), r = mpi::world_rank();
  const auto P = mpi::Partition::world().create_cartesian_topology_partition({1, p, 1});
  nn::VocabParallelCrossEntropy loss(P, 8);
  const int64_t rows = 8 / p + (r < 8 % p ? 1 : 0);
  at::manual_seed(5 + r);
  const at::Tensor logits = at::randn({2, 2 * p, rows}, at::kDouble);
  const at::Tensor targets = (at::arange(4, at::kLong).reshape({2, 2}) + 3 * r) % 8;
  const at::Tensor base = loss->forward(logits, targets);
  const at::Tensor shifted = loss->forward(logits + 1000, targets);
  EXPECT_TRUE(at::allclose(shifted, base, 1e-9, 1e-9)) << "rank " << r << ": " << shifted << " for " << base;
  auto refused = [&](const at::Tensor& l, const at::Tensor& g) {
    try {
      loss->forward(l, g);
    } catch (const ShapeError& e) {
      return std::string(e.what());
    }
    return std::string("nothing raised on rank ") + std::to_string(r);
  };
  at::Tensor negative = targets.clone();
  if (r == p - 1) negative[0][0] = -1;
  EXPECT_NE(refused(logits, negative).find("targets -1 lies outside the vocabulary [0, 8)"), std::string::npos);
  // The last rank's logits of batch 3 (at 1 rank: against targets of 2).
  const at::Tensor three = at::zeros({3, 2 * p, rows}, at::kDouble);
  const std::string batch = refused(r == p - 1 ? three : logits, targets);
  EXPECT_NE(batch.find(p > 1 ? "the logits of world rank " + std::to_string(p - 1) + " are 3x" : std::string("the logits are [3, 2,")),
            std::string::npos)
      << batch;
  // The same logits as the first call, other targets: batch 3, then 3 tokens.
  const std::string more = refused(logits, at::zeros({3, 2}, at::kLong));
  EXPECT_NE(more.find("the logits are [2, " + std::to_string(2 * p) + ", ...] on every worker of the team, the targets [3, " +
                      std::to_string(2 * p) + "]"),
            std::string::npos)
      << more;
  const std::string tokens = refused(logits, at::zeros({2, 3}, at::kLong));
  EXPECT_NE(tokens.find("the targets [2, " + std::to_string(3 * p) + "]"), std::string::npos) << tokens;
  EXPECT_TRUE(at::equal(loss->forward(logits, targets), base));  // and a good call works afterwards
}

// The transformer layers' refusals (docs/transformer.md): arguments they
// cannot honour raise PartitionError at construction, and inputs of the
// wrong shape ShapeError at the call, on every rank, also where only the
// last rank's input is wrong.
TEST(LayerProperty, TransformerLayersRefuseOnEveryRank) {
  const int p = mpi::world_size(), r = mpi::world_rank();
  const bool last = r == p - 1;
  const auto tokens = mpi::Partition::world().create_cartesian_topology_partition({1, p, 1});
  const auto features = mpi::Partition::world().create_cartesian_topology_partition({1, 1, p});
  auto refused = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const PartitionError& e) {
      return e.what();
    } catch (const ShapeError& e) {
      return e.what();
    }
    return "nothing raised";
  };
  auto expect = [&](const std::string& got, const std::string& part) {
    EXPECT_NE(got.find(part), std::string::npos) << "rank " << r << ": '" << got << "' lacks '" << part << "'";
  };
  expect(refused([&] { nn::ParallelSelfAttention a(tokens, features, 6, 4); }), "hidden must be a positive multiple of heads");
  if (p > 1) {
    expect(refused([&] { nn::ParallelSelfAttention a(tokens, features, 2 * (p + 1), p + 1); }),
           std::to_string(p + 1) + " heads do not divide over the " + std::to_string(p) + " tensor-parallel workers");
    expect(refused([&] { nn::SequenceParallelLayerNorm n(features, 3); }),
           "the normalised (last) dimension is split over " + std::to_string(p) + " workers");
    expect(refused([&] { nn::VocabParallelEmbedding e(tokens, 1, 3); }),
           "vocab 1 must be at least the " + std::to_string(p) + " workers it is split over");
  }
  expect(refused([&] { nn::SequenceParallelLayerNorm n(tokens, 3, nn::LayerNormOptions().grad_sum_axes({1, 3})); }),
         "grad_sum_axes must be distinct axes of P_x");
  expect(refused([&] { nn::SequenceParallelLayerNorm n(tokens, 3, nn::LayerNormOptions().grad_sum_axes({1, 1})); }),
         "grad_sum_axes must be distinct axes of P_x");
  for (const double drop : {1.0, -0.1})
    expect(refused([&] { nn::SeededDropout d(tokens, nn::DropoutOptions().p(drop)); }), "p must be in [0, 1)");
  expect(refused([&] { nn::SeededDropout d(tokens, nn::DropoutOptions().replicated_axes({3})); }),
         "replicated axis 3 is no axis of P");
  // At the call: the last rank's x is wrong.
  nn::SequenceParallelLayerNorm norm(tokens, 3, nn::LayerNormOptions().dtype(at::kDouble));
  expect(refused([&] { norm->forward(at::zeros({2, 2, last ? 4 : 3}, at::kDouble)); }),
         "worker " + std::to_string(p - 1) + " of P_x holds x of shape 2x2x4; its last dimension must be the 3 normalised features");
  nn::SeededDropout drop(tokens, nn::DropoutOptions().p(0.5));
  expect(refused([&] { drop->forward(last ? at::zeros({2, 2}) : at::zeros({2, 2, 3})); }),
         "world rank " + std::to_string(p - 1) + " holds x of shape 2x2; it must have 3 dimensions, as P has");
  // The attention's x split otherwise than its reduce-scatter splits y
  // (rank 0 one token more, the last one less): refused before anything
  // moves, where y would have come back split otherwise than x.
  if (p > 1) {
    nn::ParallelSelfAttention attn(tokens, features, 4 * p, p, nn::LinearOptions().dtype(at::kDouble));
    const int64_t mine = r == 0 ? 3 : last ? 1 : 2;
    std::string all = "[3";
    for (int q = 1; q < p; ++q) all += q == p - 1 ? ",1" : ",2";
    expect(refused([&] { attn->forward(at::zeros({1, mine, 4 * p}, at::kDouble)); }),
           "hold " + all + "] of the " + std::to_string(2 * p) + " tokens; the output is split as its reduce-scatter");
    EXPECT_EQ(attn->forward(at::zeros({1, 2, 4 * p}, at::kDouble)).sizes(), (at::IntArrayRef{1, 2, 4 * p}));
  }
  // And a good call works afterwards.
  EXPECT_EQ(norm->forward(at::zeros({2, 2, 3}, at::kDouble)).sizes(), (at::IntArrayRef{2, 2, 3}));
}

// A parameter or input that wants a gradient on one rank only: every rank
// attaches the layer's adjoint (its collective needs them all), so every
// rank's backward runs, and rank 0's gradient is the one it gets when every
// rank wants it. The embedding's table and the LayerNorm's parameters frozen
// on every rank but 0; the cross-entropy's logits detached there.
TEST(LayerProperty, AGradientWantedOnOneRankRunsEveryRanksBackward) {
  const int p = mpi::world_size(), r = mpi::world_rank();
  const auto P = mpi::Partition::world().create_cartesian_topology_partition({1, p, 1});
  const at::Tensor ids = (at::arange(4, at::kLong).reshape({2, 2}) + 3 * r) % 8;
  // The backward is collective: run on every rank or on none.
  auto everywhere = [](bool here) { return sum_over_ranks(here ? 0.0 : 1.0) == 0; };
  // The gradients of rank 0 with `frozen` on the other ranks.
  auto embedding = [&](bool frozen) {
    at::manual_seed(1);
    nn::VocabParallelEmbedding embed(P, 8, 3, nn::EmbeddingOptions().dtype(at::kDouble));
    if (frozen && r != 0) embed->weight.requires_grad_(false);
    const at::Tensor y = embed->forward(ids);
    EXPECT_TRUE(y.requires_grad()) << "embedding, rank " << r;
    if (everywhere(y.requires_grad())) y.pow(2).sum().backward();
    return r == 0 ? embed->weight.grad() : at::Tensor();
  };
  auto layer_norm = [&](bool frozen) {
    nn::SequenceParallelLayerNorm norm(P, 3, nn::LayerNormOptions().dtype(at::kDouble));
    if (frozen && r != 0) {
      norm->weight.requires_grad_(false);
      norm->bias.requires_grad_(false);
    }
    const at::Tensor x = at::linspace(-1, 1, 12, at::kDouble).reshape({2, 2, 3}) * (r + 1);
    const at::Tensor y = norm->forward(x);
    EXPECT_TRUE(y.requires_grad()) << "layer norm, rank " << r;
    if (everywhere(y.requires_grad())) (y * at::arange(3, at::kDouble)).sum().backward();
    if (r != 0 || !norm->weight.grad().defined() || !norm->bias.grad().defined()) return at::Tensor();
    return at::cat({norm->weight.grad(), norm->bias.grad()});
  };
  nn::VocabParallelCrossEntropy loss(P, 8);
  auto cross_entropy = [&](bool frozen) {
    at::manual_seed(2 + r);
    at::Tensor logits = at::randn({2, 2 * p, 8 / p + (r < 8 % p ? 1 : 0)}, at::kDouble);
    if (!frozen || r == 0) logits.requires_grad_();
    const at::Tensor l = loss->forward(logits, ids);
    EXPECT_TRUE(l.requires_grad()) << "cross-entropy, rank " << r;
    if (everywhere(l.requires_grad())) l.sum().backward();
    return r == 0 ? logits.grad() : at::Tensor();
  };
  const std::vector<std::pair<std::string, std::function<at::Tensor(bool)>>> layers = {
      {"embedding", embedding}, {"layer norm", layer_norm}, {"cross-entropy", cross_entropy}};
  for (const auto& [name, run] : layers) {
    const at::Tensor one = run(true), all = run(false);
    if (r == 0) {
      EXPECT_TRUE(one.defined() && all.defined() && at::allclose(one, all, 1e-12, 1e-12))
          << name << ": rank 0's gradient " << one << " for " << all;
    }
  }
}

// A rank under NoGradGuard or InferenceMode records no backward: if another
// rank wants a gradient, its backward would wait for that rank forever.
// Every rank raises at the forward instead, before anything moves, and the
// layer works afterwards.
TEST(LayerProperty, GradModeOffOnOneRankWhileAnotherWantsAGradientRaisesOnEveryRank) {
  const int p = mpi::world_size(), r = mpi::world_rank();
  if (p < 2) GTEST_SKIP() << "needs 2 ranks";
  const bool last = r == p - 1;
  const auto P = mpi::Partition::world().create_cartesian_topology_partition({1, p, 1});
  const at::Tensor ids = (at::arange(4, at::kLong).reshape({2, 2}) + 3 * r) % 8;
  nn::VocabParallelEmbedding embed(P, 8, 3, nn::EmbeddingOptions().dtype(at::kDouble));
  nn::SequenceParallelLayerNorm norm(P, 3, nn::LayerNormOptions().dtype(at::kDouble));
  nn::VocabParallelCrossEntropy loss(P, 8);
  const at::Tensor x = at::linspace(-1, 1, 12, at::kDouble).reshape({2, 2, 3}) * (r + 1);
  const at::Tensor logits = at::randn({2, 2 * p, 8 / p + (r < 8 % p ? 1 : 0)}, at::kDouble).requires_grad_();
  const std::vector<std::pair<std::string, std::function<at::Tensor()>>> layers = {
      {"embedding", [&] { return embed->forward(ids); }},
      {"layer norm", [&] { return norm->forward(x); }},
      {"cross-entropy", [&] { return loss->forward(logits, ids); }}};
  for (const auto& [name, forward] : layers)
    for (const bool inference : {false, true}) {
      std::string got = "nothing raised";
      try {
        if (!last) {
          forward();
        } else if (inference) {
          c10::InferenceMode guard;
          forward();
        } else {
          torch::NoGradGuard guard;
          forward();
        }
      } catch (const ShapeError& e) {
        got = e.rule() == rule_code::kGradMode ? "" : e.what();
        if (got.empty() && std::string(e.what()).find("worker " + std::to_string(p - 1) + " runs with grad mode off") ==
                               std::string::npos)
          got = std::string("the message does not name the worker: ") + e.what();
      }
      EXPECT_EQ(got, "") << name << (inference ? " (InferenceMode)" : " (NoGradGuard)") << ", rank " << r;
      // Afterwards, grad mode alike everywhere: a forward and a backward.
      const at::Tensor y = forward();
      EXPECT_TRUE(y.requires_grad()) << name << ", rank " << r;
      y.sum().backward();
      {
        torch::NoGradGuard guard;  // and off everywhere: nothing attached, nothing raised
        EXPECT_FALSE(forward().requires_grad()) << name << ", rank " << r;
      }
    }
}

// Each Linear layer's shards: its W and b blocks where it stores them.
void add_linear_shards(std::vector<ParameterShard>& out, const std::string& name, const nn::DistributedLinearBase& l) {
  const auto wb = l.weight_block();
  const auto bb = l.bias_block();
  if (l.local_weight().defined() && wb[1] > 0) out.push_back({name + ".weight", l.local_weight(), {wb[0], wb[2]}});
  if (l.local_bias().defined() && bb[1] > 0) out.push_back({name + ".bias", l.local_bias(), {bb[0]}});
}

// Every one of seed 002's five Linear layers (the general one, the all-gather
// and reduce-scatter ones and their ZeRO-3 forms) on the partitions the case
// runner's generator draws (anywhere in the world, data-parallel axes,
// uneven blocks, idle ranks), checked as a module: each rank's blocks of W
// and b are its shards, and the twin is the reference's global layer on the
// global W and b (reference/linear.hpp). Cases drawn to be refused (a layer
// that does not fit), zero-volume x and other dtypes are left to
// prop_linear.
TEST(LayerProperty, EveryLinearLayerMatchesItsTwinAsAModule) {
  const int p = mpi::world_size();
  const auto gen = gen_linear_case(p, {"linear", "linear_all_gather", "linear_reduce_scatter",
                                       "linear_all_gather_zero", "linear_reduce_scatter_zero"});
  int checked = 0;
  EXPECT_TRUE(check_lockstep<Case>("every Linear layer as a module", gen, [&](const Case& c, Verdict& v) {
    if (c.dtype != "float64" || !c.global_shape || c.world_size_needed() > p) return;
    // Zero-volume x (no rows or no tokens): nothing for the adjoints to weigh.
    for (const int64_t n : *c.global_shape)
      if (n == 0) return;
    const auto rworld = reference::Partition::world(p);
    const auto mworld = mpi::Partition::world();
    auto rpart = [&](const PartitionSpec& s) {
      return rworld.create_partition_inclusive(s.ranks).create_cartesian_topology_partition(s.shape);
    };
    auto mpart = [&](const PartitionSpec& s) {
      return mworld.create_partition_inclusive(s.ranks).create_cartesian_topology_partition(s.shape);
    };
    reference::LinearLayer rl;
    rl.kind = reference::linear_kind(c.primitive);
    rl.P_x = rpart(c.P_x);
    rl.P_y = c.P_y ? rpart(*c.P_y) : rl.P_x;
    if (c.P_W) rl.P_W = rpart(*c.P_W);
    rl.in = c.in_features ? c.in_features : c.global_shape->back();
    rl.out = c.out_features;
    rl.bias = c.bias;
    try {  // a case drawn to be refused: the reference refuses it too
      reference::check_layer("probe", rl);
      Tensors xs;
      for (int r = 0; r < p; ++r) xs.push_back(at::zeros(c.input_shape(r), at::kDouble));
      reference::linear(rl, at::zeros({rl.out, rl.in}, at::kDouble), at::zeros({rl.out}, at::kDouble), xs);
    } catch (const Error&) {
      return;
    }
    ++checked;
    nn::LinearOptions o;
    o.bias(c.bias).dtype(at::kDouble);
    const mpi::Partition px = mpart(c.P_x);
    const mpi::Partition py = c.P_y ? mpi::Partition(mpart(*c.P_y)) : mpi::Partition();
    std::shared_ptr<nn::DistributedLinearBase> layer;
    using K = reference::LinearKind;
    switch (rl.kind) {  // as docs/linear.md builds each from the case's partitions
      case K::General: layer = nn::DistributedLinear(px, py, mpart(*c.P_W), rl.in, rl.out, o).ptr(); break;
      case K::AllGather:
        layer = nn::DistributedLinearAllGather(c.P_y ? px : mpi::Partition(), c.P_y ? py : px, rl.in, rl.out, o).ptr();
        break;
      case K::AllGatherZero:
        layer = nn::DistributedLinearAllGatherZero(c.P_y ? px : mpi::Partition(), c.P_y ? py : px, rl.in, rl.out, o).ptr();
        break;
      case K::ReduceScatter: layer = nn::DistributedLinearReduceScatter(px, py, rl.in, rl.out, o).ptr(); break;
      case K::ReduceScatterZero: layer = nn::DistributedLinearReduceScatterZero(px, py, rl.in, rl.out, o).ptr(); break;
    }
    DistributedModule m;
    m.name = c.primitive;
    m.run = [&](const Tensors& xs) { return Tensors{layer->forward(xs[0])}; };
    m.shards = [&] {
      std::vector<ParameterShard> out;
      add_linear_shards(out, "", *layer);
      for (auto& s : out) s.name = s.name.substr(1);  // ".weight" -> "weight"
      return out;
    };
    m.parameters = {{"weight", {rl.out, rl.in}}};
    if (c.bias) m.parameters["bias"] = {rl.out};
    m.input_shapes = [&](int r) { return std::vector<Shape>{c.input_shape(r)}; };
    m.twin = [&](const std::vector<Tensors>& inputs, const ParameterMap& w) {
      Tensors xs;
      for (const auto& in : inputs) xs.push_back(in[0]);
      const Tensors ys = reference::linear(rl, w.at("weight"), c.bias ? w.at("bias") : at::Tensor(), xs);
      std::vector<Tensors> out;
      for (const auto& y : ys) out.push_back({y});
      return out;
    };
    check_module_all(m, c.data_seed.value_or(0), v, ModuleCheckOptions().adjoint_inputs(true).adjoint_parameters(true));
  }));
  // The generator's share of checkable cases is large; a run that checked
  // none proved nothing.
  if (mpi::world_rank() == 0) std::printf("every Linear layer as a module: %d cases checked\n", checked);
  EXPECT_GT(checked, 0);
}

TEST(LayerProperty, ParallelSelfAttentionMatchesTheReference) {
  const int p = mpi::world_size();
  EXPECT_TRUE(check_lockstep<LayoutCase>("parallel self-attention", gen_layout(p, 1), [&](const LayoutCase& c,
                                                                                         Verdict& v) {
    const int64_t t = p / c.d, rows = c.batch / c.d;
    const int64_t heads = t * (1 + c.out % 2), head_dim = 1 + c.features % 3, H = heads * head_dim;
    const auto tokens = mpi::Partition::world().create_cartesian_topology_partition({c.d, t, 1});
    const auto features = mpi::Partition::world().create_cartesian_topology_partition({c.d, 1, t});
    nn::ParallelSelfAttention layer(tokens, features, H, heads, nn::LinearOptions().dtype(at::kDouble));
    const auto ref_tokens = reference::Partition::world(p).create_cartesian_topology_partition({c.d, t, 1});
    DistributedModule m;
    m.name = "ParallelSelfAttention";
    m.run = [&](const Tensors& xs) { return Tensors{layer->forward(xs[0])}; };
    m.shards = [&] {
      std::vector<ParameterShard> s;
      add_linear_shards(s, "qkv", *layer->qkv);
      add_linear_shards(s, "proj", *layer->proj);
      return s;
    };
    m.parameters = {{"qkv.weight", {3 * H, H}}, {"qkv.bias", {3 * H}}, {"proj.weight", {H, H}}, {"proj.bias", {H}}};
    m.input_shapes = [&](int r) { return std::vector<Shape>{{rows, length(c.tokens, t, r % t), H}}; };
    m.twin = [&](const std::vector<Tensors>& xs, const ParameterMap& w) {
      Tensors flat;
      for (const auto& x : xs) flat.push_back(x[0]);
      const Tensors ys = reference::parallel_self_attention(ref_tokens, heads, w.at("qkv.weight"), w.at("qkv.bias"),
                                                            w.at("proj.weight"), w.at("proj.bias"), flat);
      std::vector<Tensors> out;
      for (const auto& y : ys) out.push_back({y});
      return out;
    };
    check_module_all(m, c.seed, v, ModuleCheckOptions().finite_differences(c.seed % 10 == 0 && H <= 4));
  }));
}

TEST(LayerProperty, SeededDropoutIsOneProcesssMaskSliced) {
  const int p = mpi::world_size();
  EXPECT_TRUE(check_lockstep<LayoutCase>("seeded dropout", gen_layout(p, 1), [&](const LayoutCase& c, Verdict& v) {
    const int64_t t = p / c.d, rows = c.batch / c.d;
    const bool replicated = c.out % 3 == 0;  // a region replicated over t
    const double drop = 0.1 * static_cast<double>(1 + c.out % 7);
    const auto P = mpi::Partition::world().create_cartesian_topology_partition({c.d, t, 1});
    nn::SeededDropout layer(P, nn::DropoutOptions().p(drop).seed(c.seed).replicated_axes(replicated ? std::vector<int>{1}
                                                                                                      : std::vector<int>{}));
    const auto one = reference::Partition::world(1).create_cartesian_topology_partition({1, 1, 1});
    auto tokens_of = [&](int64_t s) { return replicated ? c.tokens : length(c.tokens, t, s); };
    DistributedModule m;
    m.name = replicated ? "SeededDropout (replicated over tp)" : "SeededDropout";
    m.run = [&](const Tensors& xs) {
      layer->reseed(c.seed);  // every run the layer's first mask
      return Tensors{layer->forward(xs[0])};
    };
    m.shards = [] { return std::vector<ParameterShard>{}; };
    m.input_shapes = [&](int r) { return std::vector<Shape>{{rows, tokens_of(r % t), c.features}}; };
    // One process: the whole tensor's first mask, cut as the pieces are (a
    // replicated region: every worker's tensor under the same mask).
    m.twin = [&](const std::vector<Tensors>& xs, const ParameterMap&) {
      std::vector<Tensors> ys(xs.size());
      if (replicated) {  // replicas along the batch, every token on every tp rank
        const at::Tensor M = reference::seeded_dropout(one, drop, c.seed, 0, {}, {at::ones({c.batch, c.tokens, c.features}, at::kDouble)})[0];
        for (size_t r = 0; r < xs.size(); ++r)
          ys[r] = {xs[r][0] * M.narrow(0, (static_cast<int64_t>(r) / t) * rows, rows)};
        return ys;
      }
      Tensors by_replica;
      for (int64_t q = 0; q < c.d; ++q) {
        Tensors pieces;
        for (int64_t s = 0; s < t; ++s) pieces.push_back(xs[rank_of(t, q, s)][0]);
        by_replica.push_back(at::cat(pieces, 1));
      }
      const at::Tensor Y = reference::seeded_dropout(one, drop, c.seed, 0, {}, {at::cat(by_replica, 0)})[0];
      for (int64_t q = 0; q < c.d; ++q)
        for (int64_t s = 0; s < t; ++s)
          ys[rank_of(t, q, s)] = {Y.narrow(0, q * rows, rows).narrow(1, first(c.tokens, t, s), length(c.tokens, t, s))};
      return ys;
    };
    // The adjoint where the mask keeps something (all of 64 elements are
    // dropped with probability below 0.7^64).
    const int64_t elements = c.batch * c.tokens * c.features * (replicated ? t : 1);
    const auto o = ModuleCheckOptions().adjoint_inputs(elements >= 64).finite_differences(c.seed % 10 == 0);
    check_module_all(m, c.seed, v, o);
    // The next call draws another mask; eval mode none.
    layer->reseed(c.seed);
    const at::Tensor x = at::ones({rows, tokens_of(mpi::world_rank() % t), c.features}, at::kDouble);
    const at::Tensor first_mask = layer->forward(x), second_mask = layer->forward(x);
    layer->eval();
    v.expect(layer->forward(x).equal(x), "eval mode changed the input");
    // (Two masks of 200 or more elements agree with probability below
    // 0.82^200 at these p.)
    const bool same_everywhere = all_ranks(first_mask.equal(second_mask));
    v.expect(!same_everywhere || sum_over_ranks(static_cast<double>(x.numel())) < 200,
             "two calls drew the same mask everywhere");
  }));
}

}  // namespace
}  // namespace partita::testing
