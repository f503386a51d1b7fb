// Issue 32 items 2 and 3 (docs/3d.md): pipeline stages that are
// tensor-parallel groups over data-parallel replicas, equal to one process.
//
// The model is a stack of Megatron's sequence-parallel MLP blocks built
// from seed 002's layers: DistributedLinearAllGather (tokens split over tp ->
// gathered -> output features split), an activation, then
// DistributedLinearReduceScatter (input features split -> reduce-scatter
// back to tokens split). Each stage's layers run on smp::stage_partitions:
// batch over dp (axis 0), tokens or features over tp. Every rank trains
// the 3-D model and, beside it, the same model on one process with the
// whole batch (torch::nn::Linear, global tensors), and compares after every
// step the loss and the gathered parameters of its own stages' layers,
// under every schedule (interleaved_virtual with two chunks per rank):
//  - integer-valued data (weights, inputs, targets), an L1 loss summed and
//    lr = microbatches x replicas, a clamped activation: every value the arithmetic
//    produces is an integer over a small power of two, below 2^40 (checked), so every
//    summation order gives the same bits and the comparison is exact;
//  - random data (float64, MSE mean, tanh): within 1e-12 relative.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "partita/mpi/communicator.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/dropout.hpp"
#include "partita/nn/layer_norm.hpp"
#include "partita/nn/linear.hpp"
#include "partita/smp.hpp"
#include "partita/smp/communicators.hpp"
#include "partita/smp/pipeline.hpp"
#include "partita/smp/step.hpp"
#include "partita/smp/tensor_parallel.hpp"

namespace partita::spec {
namespace {

namespace nn = partita::nn;

constexpr int64_t kBatch = 8, kTokens = 4, kHidden = 4, kFfn = 8;
constexpr int kBlocks = 4, kSteps = 10, kMicrobatches = 2;

// kNorm: random data through blocks that begin with a sequence-parallel
// LayerNorm (its weight and bias replicated over tp and dp).
enum class Data { kInteger, kRandom, kNorm };

// One sequence-parallel MLP block of the stage that owns it.
struct BlockImpl : torch::nn::Module {
  BlockImpl(const smp::StagePartitions& P, bool zero, Data data, at::ScalarType dtype = at::kDouble) : data(data) {
    nn::LinearOptions o;
    o.dtype(dtype);
    if (zero) {
      up_zero = register_module("up", nn::DistributedLinearAllGatherZero(P.tokens, P.features, kHidden, kFfn, o));
      down_zero = register_module("down", nn::DistributedLinearReduceScatterZero(P.features, P.tokens, kFfn, kHidden, o));
      up = up_zero.ptr().get();
      down = down_zero.ptr().get();
    } else {
      up_plain = register_module("up", nn::DistributedLinearAllGather(P.tokens, P.features, kHidden, kFfn, o));
      down_plain = register_module("down", nn::DistributedLinearReduceScatter(P.features, P.tokens, kFfn, kHidden, o));
      up = up_plain.ptr().get();
      down = down_plain.ptr().get();
    }
    if (data == Data::kNorm)
      norm = register_module("norm", nn::SequenceParallelLayerNorm(P.tokens, kHidden, nn::LayerNormOptions().dtype(dtype)));
  }
  at::Tensor forward(at::Tensor x) {
    at::Tensor h = up->forward(norm ? norm(x) : x);
    h = data == Data::kInteger ? at::clamp(h, -3, 3) : at::tanh(h);
    return down->forward(h);
  }
  Data data;
  nn::DistributedLinearAllGather up_plain{nullptr};
  nn::DistributedLinearReduceScatter down_plain{nullptr};
  nn::DistributedLinearAllGatherZero up_zero{nullptr};
  nn::DistributedLinearReduceScatterZero down_zero{nullptr};
  nn::DistributedLinearBase* up = nullptr;
  nn::DistributedLinearBase* down = nullptr;
  nn::SequenceParallelLayerNorm norm{nullptr};
};
TORCH_MODULE(Block);

// The same model on one process.
struct Reference {
  std::vector<torch::nn::Linear> up, down;
  Data data;
  std::vector<at::Tensor> norm_weight, norm_bias;  // kNorm
  at::Tensor forward(at::Tensor x) {
    for (int k = 0; k < kBlocks; ++k) {
      at::Tensor h = up[k](data == Data::kNorm ? at::layer_norm(x, {kHidden}, norm_weight[k], norm_bias[k], 1e-5) : x);
      h = data == Data::kInteger ? at::clamp(h, -3, 3) : at::tanh(h);
      x = down[k](h);
    }
    return x;
  }
  std::vector<at::Tensor> parameters() {
    std::vector<at::Tensor> out;
    for (int k = 0; k < kBlocks; ++k)
      for (auto* l : {&up[k], &down[k]})
        for (auto& p : (*l)->parameters()) out.push_back(p);
    for (size_t k = 0; k < norm_weight.size(); ++k) {
      out.push_back(norm_weight[k]);
      out.push_back(norm_bias[k]);
    }
    return out;
  }
};

torch::nn::Linear make_linear(int64_t in, int64_t out, Data data) {
  torch::nn::Linear l(torch::nn::LinearOptions(in, out));
  l->to(at::kDouble);
  torch::NoGradGuard g;
  if (data == Data::kInteger) {
    l->weight.copy_(at::randint(-1, 2, l->weight.sizes(), at::kDouble));
    l->bias.copy_(at::randint(-1, 2, l->bias.sizes(), at::kDouble));
  } else {
    l->weight.copy_(at::randn(l->weight.sizes(), at::kDouble) * 0.5);
    l->bias.copy_(at::randn(l->bias.sizes(), at::kDouble) * 0.1);
  }
  return l;
}

// The objective both sides minimise (docs/3d.md, "One rule for every
// parameter"): the mean over the dp replicas of each replica's loss, and a
// replica's loss is the sum of its tp ranks' pieces. One rank's piece of a
// microbatch: L1, the sum over the piece; MSE, the sum of squares over the
// element count of the replica's microbatch. The pipeline divides by the
// microbatch count and takes the mean over the replicas; the one-process
// loss is the same total divided the same way.
at::Tensor piece_loss(const at::Tensor& out, const at::Tensor& y, Data data, int dp) {
  if (data == Data::kInteger) return (out - y).abs().sum();
  return (out - y).pow(2).sum() / static_cast<double>(kBatch / dp / kMicrobatches * kTokens * kHidden);
}

at::Tensor whole_loss(const at::Tensor& out, const at::Tensor& y, Data data, int dp) {
  if (data == Data::kInteger) return (out - y).abs().sum() / static_cast<double>(kMicrobatches * dp);
  return (out - y).pow(2).mean();
}

// Integer data: the updates stay integers.
double learning_rate(Data data, int dp) { return data == Data::kInteger ? kMicrobatches * dp : 0.05; }

void sgd(const std::vector<at::Tensor>& params, double lr) {
  torch::NoGradGuard g;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    p.sub_(p.grad() * lr);
    p.mutable_grad().zero_();
  }
}

// Sum over a group, in group-rank order (the same bits on every member).
double group_sum(double v, smp::CommGroup g) {
  double s = 0;
  for (double x : smp::allgather(v, g)) s += x;
  return s;
}

struct Case {
  int pp, tp;
  std::string schedule;
  bool zero;
  Data data;
};

std::string name_of(const Case& c) {
  return "pp " + std::to_string(c.pp) + " x tp " + std::to_string(c.tp) + " x dp " +
         std::to_string(mpi::world_size() / (c.pp * c.tp)) + ", " + c.schedule + (c.zero ? ", ZeRO-3" : "") +
         (c.data == Data::kInteger ? ", integer data" : c.data == Data::kNorm ? ", LayerNorm blocks" : ", random data");
}

void expect_same(const at::Tensor& got, const at::Tensor& want, Data data, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  if (data == Data::kInteger) {
    EXPECT_TRUE(at::equal(got, want)) << what << ": differs by " << (got - want).abs().max().item<double>();
  } else {
    const double err = (got - want).abs().max().item<double>(), scale = want.abs().max().item<double>();
    EXPECT_LE(err, 1e-12 * std::max(1.0, scale)) << what;
  }
}

// Trains the 3-D model and the one-process model side by side.
void train_and_compare(const Case& c) {
  smp::Config config;
  config.partitions(c.pp);
  config.tensor_parallel_degree(c.tp);
  config.microbatches(kMicrobatches);
  config.pipeline(c.schedule);
  // Megatron's interleaved schedule: two model chunks (virtual stages) per
  // pipeline rank, stage g on pp rank g mod pp.
  const int v = c.schedule == "interleaved_virtual" && c.pp > 1 ? 2 : 1;
  config.virtual_pipeline_model_parallel_size(c.schedule == "interleaved_virtual" ? 2 : 1);
  smp::init(config);
  const std::string label = name_of(c);
  const int dp = smp::dp_size(), d = smp::dp_rank(), t = smp::tp_rank(), stage = smp::pp_rank();

  // Every rank draws the same model and data.
  torch::manual_seed(3200 + (c.data == Data::kInteger ? 1 : 2));
  Reference ref{{}, {}, c.data};
  for (int k = 0; k < kBlocks; ++k) {
    ref.up.push_back(make_linear(kHidden, kFfn, c.data));
    ref.down.push_back(make_linear(kFfn, kHidden, c.data));
    if (c.data == Data::kNorm) {
      ref.norm_weight.push_back((1 + 0.5 * at::randn({kHidden}, at::kDouble)).requires_grad_(true));
      ref.norm_bias.push_back((0.1 * at::randn({kHidden}, at::kDouble)).requires_grad_(true));
    }
  }
  const at::Tensor X = c.data == Data::kInteger ? at::randint(-2, 3, {kBatch, kTokens, kHidden}, at::kDouble)
                                                 : at::randn({kBatch, kTokens, kHidden}, at::kDouble);
  const at::Tensor Y = c.data == Data::kInteger ? at::randint(-4, 5, {kBatch, kTokens, kHidden}, at::kDouble)
                                                 : at::randn({kBatch, kTokens, kHidden}, at::kDouble);

  // The 3-D model: every rank builds every block (collective), on its stage's partitions.
  std::vector<smp::StagePartitions> parts;
  for (int s = 0; s < c.pp; ++s) parts.push_back(smp::stage_partitions(s));
  torch::nn::Sequential seq;
  std::vector<Block> blocks;
  const int stages = c.pp * v, per_stage = kBlocks / stages;
  for (int k = 0; k < kBlocks; ++k) {
    blocks.emplace_back(parts[(k / per_stage) % c.pp], c.zero, c.data);
    blocks.back()->up->scatter_parameters(ref.up[k]);
    blocks.back()->down->scatter_parameters(ref.down[k]);
    if (c.data == Data::kNorm) {
      torch::NoGradGuard no_grad;
      blocks.back()->norm->weight.copy_(ref.norm_weight[k]);
      blocks.back()->norm->bias.copy_(ref.norm_bias[k]);
    }
    seq->push_back(blocks.back());
  }
  std::vector<int> splits;
  for (int s = 1; s < stages; ++s) splits.push_back(s * per_stage);
  smp::DistributedModel model(seq, splits);
  ASSERT_EQ(model.stage(), stage) << label;

  // This rank's piece of the batch: its replica's rows, its tp rank's tokens.
  const int64_t rows = kBatch / dp, toks = kTokens / c.tp;
  const at::Tensor x = X.narrow(0, d * rows, rows).narrow(1, t * toks, toks).contiguous();
  const at::Tensor y = Y.narrow(0, d * rows, rows).narrow(1, t * toks, toks).contiguous();
  auto train = smp::step([&](at::Tensor xb, at::Tensor yb) {
    at::Tensor out = model(xb);
    at::Tensor loss = piece_loss(out, yb, c.data, dp);
    model.backward(loss);
    return loss;
  });

  double largest = 0;
  bool moved = false;
  for (int step = 0; step < kSteps; ++step) {
    const std::string at_step = label + ", step " + std::to_string(step);
    // One process, whole batch.
    const at::Tensor out_ref = ref.forward(X);
    const at::Tensor loss_ref = whole_loss(out_ref, Y, c.data, dp);
    loss_ref.backward();
    largest = std::max(largest, out_ref.abs().max().item<double>());
    for (const auto& p : ref.parameters()) largest = std::max(largest, p.grad().abs().max().item<double>());

    // 3-D: this pipeline's losses are its last stage's; the whole batch's
    // is their sum over the tp group, averaged over the replicas.
    smp::StepOutput losses = train(x, y);
    double mine = 0;
    for (const auto& l : losses.outputs()) mine += l.item<double>();
    const double total = group_sum(group_sum(mine / kMicrobatches, smp::TP_GROUP), smp::DP_GROUP) / dp;
    if (c.data == Data::kInteger)
      EXPECT_EQ(total, loss_ref.item<double>()) << at_step;
    else
      EXPECT_NEAR(total, loss_ref.item<double>(), 1e-12 * std::abs(loss_ref.item<double>())) << at_step;

    sgd(model.parameters(), learning_rate(c.data, dp));
    sgd(ref.parameters(), learning_rate(c.data, dp));

    // The gathered parameters of this rank's layers against the reference's.
    for (int k = 0; k < kBlocks; ++k) {
      if ((k / per_stage) % c.pp != stage) continue;
      const torch::nn::Linear up = blocks[k]->up->gather_parameters();
      const torch::nn::Linear down = blocks[k]->down->gather_parameters();
      ASSERT_TRUE(up && down) << at_step;
      expect_same(up->weight, ref.up[k]->weight, c.data, at_step + ", block " + std::to_string(k) + " up.weight");
      expect_same(up->bias, ref.up[k]->bias, c.data, at_step + ", block " + std::to_string(k) + " up.bias");
      expect_same(down->weight, ref.down[k]->weight, c.data, at_step + ", block " + std::to_string(k) + " down.weight");
      expect_same(down->bias, ref.down[k]->bias, c.data, at_step + ", block " + std::to_string(k) + " down.bias");
      if (c.data == Data::kNorm) {  // every rank of the stage holds the whole LayerNorm
        expect_same(blocks[k]->norm->weight, ref.norm_weight[k], c.data, at_step + ", block " + std::to_string(k) + " norm.weight");
        expect_same(blocks[k]->norm->bias, ref.norm_bias[k], c.data, at_step + ", block " + std::to_string(k) + " norm.bias");
      }
      if (step == kSteps - 1) {
        for (const auto& p : ref.parameters()) largest = std::max(largest, p.abs().max().item<double>());
      }
    }
  }
  // The run trained: the parameters moved away from their first values.
  torch::manual_seed(3200 + (c.data == Data::kInteger ? 1 : 2));
  for (int k = 0; k < kBlocks && !moved; ++k) {
    const auto first_up = make_linear(kHidden, kFfn, c.data);
    const auto first_down = make_linear(kFfn, kHidden, c.data);
    moved = !at::equal(first_up->weight, ref.up[k]->weight) || !at::equal(first_down->weight, ref.down[k]->weight);
  }
  EXPECT_TRUE(moved) << label << ": training did not change the parameters";
  // The exactness the integer comparison relies on.
  if (c.data == Data::kInteger) {
    EXPECT_LT(largest, std::ldexp(1.0, 40)) << label;
  }
}

// The layouts of this world size the issue asks for, each under every schedule.
std::vector<std::pair<int, int>> layouts() {
  switch (mpi::world_size()) {
    case 1: return {{1, 1}};
    case 2: return {{2, 1}, {1, 2}};
    case 4: return {{2, 2}, {1, 2}};
    case 8: return {{2, 2}};
    default: return {};
  }
}

const std::vector<std::string> kSchedules = {"simple", "interleaved", "zero_bubble", "interleaved_virtual"};

TEST(ThreeD, IntegerDataBitForBit) {
  const auto ls = layouts();
  if (ls.empty()) GTEST_SKIP() << "no 3-D layout for " << mpi::world_size() << " ranks";
  for (const auto& [pp, tp] : ls)
    for (const auto& s : kSchedules) train_and_compare({pp, tp, s, false, Data::kInteger});
}

TEST(ThreeD, RandomDataWithinTolerance) {
  const auto ls = layouts();
  if (ls.empty()) GTEST_SKIP() << "no 3-D layout for " << mpi::world_size() << " ranks";
  for (const auto& [pp, tp] : ls)
    for (const auto& s : kSchedules) train_and_compare({pp, tp, s, false, Data::kRandom});
}

// Sequence-parallel LayerNorms (replicated parameters, gradients summed
// over tp by the layer and averaged over dp by the pipeline) and the
// distributed layers (summed onto the stored copy, then averaged) held to
// the one rule: equal to one process, every parameter after every step.
TEST(ThreeD, LayerNormBlocksEveryParameterEqualsOneProcess) {
  const auto ls = layouts();
  if (ls.empty()) GTEST_SKIP() << "no 3-D layout for " << mpi::world_size() << " ranks";
  for (const auto& [pp, tp] : ls)
    for (const auto& s : kSchedules) {
      train_and_compare({pp, tp, s, false, Data::kNorm});
      if (mpi::world_size() / (pp * tp) > 1) train_and_compare({pp, tp, s, true, Data::kNorm});
    }
}

TEST(ThreeD, ZeroShardsOverTheReplicas) {
  const auto ls = layouts();
  if (ls.empty()) GTEST_SKIP() << "no 3-D layout for " << mpi::world_size() << " ranks";
  for (const auto& [pp, tp] : ls)
    for (const auto& s : kSchedules) train_and_compare({pp, tp, s, true, Data::kInteger});
}

// Without split points the stages are balanced by parameter count; a
// distributed layer's blocks live on some ranks only (none on the
// data-parallel copies of a non-ZeRO layer), so every rank must balance by
// the same counts, or the replicas would cut the model differently.
TEST(ThreeD, BalancedSplitIsTheSameOnEveryRank) {
  const int n = mpi::world_size();
  if (n % 4 != 0 && n != 2) GTEST_SKIP() << "needs 2 stages and replicas";
  smp::Config config;
  config.partitions(2);
  config.tensor_parallel_degree(n >= 8 ? 2 : 1);
  smp::init(config);
  std::vector<smp::StagePartitions> parts = {smp::stage_partitions(0), smp::stage_partitions(1)};
  torch::nn::Sequential seq;
  // Blocks 0-1 on stage 0's partitions, 2-3 on stage 1's: a rank holds the
  // parameters of its own stage's blocks only (none on a data-parallel
  // copy), so by local counts the ranks would cut the model differently.
  for (int k = 0; k < kBlocks; ++k) seq->push_back(Block(parts[k < 2 ? 0 : 1], false, Data::kRandom));
  smp::DistributedModel model(seq);
  EXPECT_EQ(model.bounds(), (std::vector<int>{0, 2, 4})) << "world rank " << mpi::world_rank();
}

// --- Communication as a checked quantity (issue 32 item 4) ----------------------
//
// The bytes each rank sends per step, by kind, as PipelineStats counts them,
// against the analytic volume of docs/3d.md ("Communication volume") for
// the block stack: kBlocks blocks over pp x tp x dp, m microbatches, a
// batch of B rows and T tokens, hidden kHidden, ffn kFfn, dtype of s bytes.

// The layers of a volume case: seed 002's layers, their ZeRO-3 forms, or
// torch::nn::Linear (replicated over dp: averaged by the pipeline; tp 1).
enum class Layers { kDistributed, kZero, kTorch };

struct VolumeCase {
  int pp, tp;
  std::string schedule;
  Layers layers;
  int64_t batch, tokens;
  int microbatches;
  at::ScalarType dtype;
};

struct Volume {
  int64_t pipeline = 0, tensor_parallel = 0, data_parallel = 0;
};

// docs/3d.md's formula, for the rank at (pp rank r, dp rank q), in the
// first step of an input shape or a later one.
Volume formula(const VolumeCase& c, int r, int q, bool first) {
  const int64_t p = c.pp, t = c.tp, d = mpi::world_size() / (c.pp * c.tp), m = c.microbatches;
  const int64_t s = c10::elementSize(c.dtype), H = kHidden, F = kFfn;
  const int64_t v = c.schedule == "interleaved_virtual" && p > 1 ? 2 : 1;
  const int64_t Kr = kBlocks / p, k = kBlocks / (p * v);  // blocks on the rank, per chunk
  const int64_t a = c.batch / (m * d) * (c.tokens / t) * H * s;  // one activation piece
  Volume out;
  if (p > 1) out.pipeline = m * a * ((v - (r == p - 1)) + (v - (r == 0)));
  const bool holds = c.layers == Layers::kZero || q == 0;  // a non-ZeRO layer's parameters live on replica 0
  int64_t backward = 0;
  if (c.schedule == "zero_bubble")
    backward = 2 * k + (holds ? 2 * k - 1 : 2 * k);  // I, then W (restricted to parameters, or all of it)
  else
    backward = 2 * Kr - (r == 0);  // stage 0's x takes no gradient
  // With virtual stages the ranks but the last find the stand-in's shape by
  // one forward of their copy of the model, without gradients, in the first
  // step of an input shape: their blocks' forward traffic once more.
  const int64_t probe = v > 1 && r < p - 1 && first ? 1 : 0;
  if (c.layers != Layers::kTorch) out.tensor_parallel = (t - 1) * a * (m * (2 * Kr + backward) + probe * 2 * Kr);
  const int64_t block = s * (2 * H * F + F + H);  // one block's parameters
  if (d > 1) {
    if (c.layers == Layers::kDistributed)
      out.data_parallel = q == 0 ? (m + probe) * Kr * (block / t) * (d - 1) : m * Kr * (block / t);
    if (c.layers == Layers::kZero) out.data_parallel = (2 * m + probe) * Kr * (block / t) * (d - 1) / d;
    if (c.layers == Layers::kTorch) out.data_parallel = (d - 1) * Kr * block;
  }
  return out;
}

struct TorchBlockImpl : torch::nn::Module {
  explicit TorchBlockImpl(at::ScalarType dtype) {
    up = register_module("up", torch::nn::Linear(kHidden, kFfn));
    down = register_module("down", torch::nn::Linear(kFfn, kHidden));
    to(dtype);
  }
  at::Tensor forward(at::Tensor x) { return down(at::tanh(up(x))); }
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(TorchBlock);

std::string name_of(const VolumeCase& c) {
  const char* layers[] = {"seed 002's layers", "ZeRO-3", "torch::nn::Linear"};
  return "pp " + std::to_string(c.pp) + " x tp " + std::to_string(c.tp) + " x dp " +
         std::to_string(mpi::world_size() / (c.pp * c.tp)) + ", " + c.schedule + ", " +
         layers[static_cast<int>(c.layers)] + ", batch " + std::to_string(c.batch) + " x " +
         std::to_string(c.tokens) + " tokens, " + std::to_string(c.microbatches) + " microbatches, " +
         c10::toString(c.dtype);
}

// One layout with v chunks per pipeline rank (one smp::init): for each kind
// of layers one model, trained two steps under each schedule of that v and
// each of two batch shapes (8 rows x 4 tokens in 2 microbatches, 16 x 6 in
// 4; rows scaled so that every replica's microbatch holds 1 or 2). After
// each step this rank's counts are compared with the formula.
void check_volumes(int pp, int tp, int v) {
  smp::Config config;
  config.partitions(pp);
  config.tensor_parallel_degree(tp);
  config.pipeline(v > 1 ? "interleaved_virtual" : "interleaved");
  config.virtual_pipeline_model_parallel_size(v);
  smp::init(config);
  const int dp = smp::dp_size();
  std::vector<smp::StagePartitions> parts;
  for (int s = 0; s < pp; ++s) parts.push_back(smp::stage_partitions(s));
  std::vector<Layers> kinds = {Layers::kDistributed};
  // ZeRO-3: nothing to shard at dp 1; beyond H / tp replicas the down
  // layer's bias block has fewer entries than shards (a PartitionError).
  if (dp > 1 && dp * tp <= kHidden) kinds.push_back(Layers::kZero);
  if (tp == 1) kinds.push_back(Layers::kTorch);
  const std::vector<std::string> schedules =
      v > 1 ? std::vector<std::string>{"interleaved_virtual"}
            : pp > 1 ? std::vector<std::string>{"simple", "interleaved", "zero_bubble"} : kSchedules;
  const int per_stage = kBlocks / (pp * v);
  std::vector<int> splits;
  for (int s = 1; s < pp * v; ++s) splits.push_back(s * per_stage);
  for (Layers layers : kinds) {
    const at::ScalarType dtype = layers == Layers::kDistributed ? at::kDouble : at::kFloat;
    torch::nn::Sequential seq;
    for (int k = 0; k < kBlocks; ++k) {
      if (layers == Layers::kTorch)
        seq->push_back(TorchBlock(dtype));
      else
        seq->push_back(Block(parts[(k / per_stage) % pp], layers == Layers::kZero, Data::kRandom, dtype));
    }
    smp::DistributedModel model(seq, splits);
    for (const auto& schedule : schedules)
      for (const auto& [batch, tokens, m] : {std::tuple<int64_t, int64_t, int>{8 * dp / std::min(dp, 2), 4, 2},
                                              std::tuple<int64_t, int64_t, int>{16 * dp / std::min(dp, 4), 6, 4}}) {
        const VolumeCase c{pp, tp, schedule, layers, batch, tokens, m, dtype};
        smp::set_schedule(smp::build_schedule(schedule, pp, m, model.virtual_stages()));
        smp::StepOptions o;
        o.microbatches(m);
        auto train = smp::step(
            [&](at::Tensor xb, at::Tensor yb) {
              at::Tensor loss = (model(xb) - yb).pow(2).sum();
              model.backward(loss);
              return loss;
            },
            o);
        const auto opts = at::TensorOptions().dtype(dtype);
        const at::Tensor x = at::randn({batch / dp, tokens / tp, kHidden}, opts);
        const at::Tensor y = at::randn({batch / dp, tokens / tp, kHidden}, opts);
        // The stand-in's shape probe (virtual stages) runs once per input
        // shape: in this model's first step of each shape. Two steps of the
        // first shape (the counts are the step's, not the model's), one of
        // the second.
        for (int step = 0; step < (m == 2 ? 2 : 1); ++step) {
          const Volume want = formula(c, smp::pp_rank(), smp::dp_rank(), step == 0);
          train(x, y);
          const smp::PipelineStats& got = model.stats();
          const std::string at_step = name_of(c) + ", step " + std::to_string(step) + ", world rank " +
                                      std::to_string(mpi::world_rank());
          EXPECT_EQ(got.pipeline_bytes, want.pipeline) << at_step << ": pipeline";
          EXPECT_EQ(got.tensor_parallel_bytes, want.tensor_parallel) << at_step << ": tensor-parallel";
          EXPECT_EQ(got.data_parallel_bytes, want.data_parallel) << at_step << ": data-parallel";
        }
      }
  }
  smp::set_schedule(std::nullopt);
}

// Every layout of pp, tp in {1, 2} at this world size (at 8 ranks not
// 1 x 1 x 8: dp-only layouts run at 4), every schedule.
TEST(ThreeD, BytesPerStepEqualTheFormula) {
  const int n = mpi::world_size();
  for (int pp : {1, 2})
    for (int tp : {1, 2}) {
      if (n % (pp * tp) != 0 || (n == 8 && pp * tp == 1)) continue;
      check_volumes(pp, tp, 1);
      if (pp > 1) check_volumes(pp, tp, 2);
    }
}

// Bad input (issue 32 item 6, in part): a stage that does not exist,
// activations of too few dimensions, and a feature count the tp degree
// cannot split raise on every rank, and smp works afterwards.
TEST(ThreeD, BadInputRaisesOnEveryRank) {
  const int n = mpi::world_size();
  smp::Config config;
  config.partitions(n % 2 == 0 ? 2 : 1);
  config.tensor_parallel_degree(n % 4 == 0 ? 2 : 1);
  smp::init(config);
  const int pp = smp::pp_size();
  try {
    smp::stage_partitions(pp);
    ADD_FAILURE() << "stage " << pp << " of " << pp << " was accepted";
  } catch (const smp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("stage " + std::to_string(pp) + " does not exist (pp_size " +
                                         std::to_string(pp) + ")"), std::string::npos) << e.what();
  }
  try {
    smp::stage_partitions(0, 2);
    ADD_FAILURE() << "2-dimensional activations were accepted";
  } catch (const smp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("at least 3 dimensions"), std::string::npos) << e.what();
  }
  if (smp::tp_size() > 1) {
    // 1 output feature over 2 tp ranks: the all-gather layer cannot split it.
    const smp::StagePartitions P = smp::stage_partitions(0);
    try {
      nn::DistributedLinearAllGather bad(P.tokens, P.features, kHidden, 1, nn::LinearOptions{});
      ADD_FAILURE() << "out_features 1 over tp 2 was accepted";
    } catch (const PartitionError& e) {
      EXPECT_NE(std::string(e.what()).find("out_features 1 must be at least M = 2"), std::string::npos) << e.what();
    }
  }
  if (smp::tp_size() > 1) {
    // 1 input feature over 2 tp ranks: the reduce-scatter layer cannot split it.
    const smp::StagePartitions P = smp::stage_partitions(0);
    try {
      nn::DistributedLinearReduceScatter bad(P.features, P.tokens, 1, kHidden, nn::LinearOptions{});
      ADD_FAILURE() << "in_features 1 over tp 2 was accepted";
    } catch (const PartitionError& e) {
      EXPECT_NE(std::string(e.what()).find("in_features 1 and out_features 4 must be at least M = 2"),
                std::string::npos) << e.what();
    }
  }
  // Still usable: a block builds and smp answers.
  const smp::StagePartitions P = smp::stage_partitions(0);
  Block ok(P, false, Data::kRandom);
  EXPECT_EQ(smp::allgather(1, smp::WORLD).size(), static_cast<size_t>(n));
}

// A module of the user's with a parameter of its own (which partita cannot
// train in a tensor-parallel stage).
struct Gain : torch::nn::Module {
  Gain() { gain = register_parameter("gain", at::ones({1}, at::kDouble)); }
  at::Tensor forward(const at::Tensor& x) { return x * gain; }
  at::Tensor gain;
};

// A module of the user's that uses a tensor another module owns (a tie).
struct Shares : torch::nn::Module {
  explicit Shares(const at::Tensor& t) { shared = register_parameter("shared", t); }
  at::Tensor forward(const at::Tensor& x) { return x * shared.sum(); }
  at::Tensor shared;
};

// A torch::nn::Linear inside a module of the user's.
struct Wrapped : torch::nn::Module {
  Wrapped() { head = register_module("head", torch::nn::Linear(kHidden, kHidden)); }
  at::Tensor forward(const at::Tensor& x) { return head(at::tanh(x)); }
  torch::nn::Linear head{nullptr};
};

// The raised error's text on this rank ("" when nothing was raised).
template <typename F>
std::string usage_error(F&& f) {
  try {
    f();
  } catch (const smp::UsageError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_RAISED(text, needle) \
  EXPECT_NE((text).find(needle), std::string::npos) << "world rank " << mpi::world_rank() << " saw: " << (text)

// Replicas start alike, as DistributedDataParallel makes them: a model
// whose plain parameters each rank drew from its own seed holds dp rank
// 0's values on every replica once the DistributedModel is built (the
// parameters it averages; partita's stored Linear layers live on replica
// 0 alone).
TEST(ThreeD, ReplicasStartFromTheFirstReplicasParameters) {
  const int n = mpi::world_size();
  if (n == 1) GTEST_SKIP() << "one rank: one replica";
  smp::Config config;
  config.partitions(n >= 4 ? 2 : 1);
  smp::init(config);
  torch::manual_seed(500 + mpi::world_rank());  // every rank its own values
  torch::nn::Sequential seq(torch::nn::Linear(kHidden, kHidden), torch::nn::Tanh(), torch::nn::Linear(kHidden, kHidden),
                            torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})));
  for (auto& p : seq->parameters()) {
    at::NoGradGuard g;
    p.uniform_(-1, 1);  // (the LayerNorm's too)
  }
  smp::DistributedModel model(seq);
  // Each parameter's values on every replica against dp rank 0's: gathered
  // over the dp group, every replica compares.
  const auto dp = mpi::Communicator::wrap(smp::communicator(smp::DP_GROUP));
  int64_t compared = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    const at::Tensor mine = p.detach().to(at::kDouble).reshape({1, -1});
    const at::Tensor all = dp.allgather(mine, 0);  // [dp, numel]
    for (int64_t r = 1; r < all.size(0); ++r)
      EXPECT_TRUE(at::equal(all[r], all[0])) << name << ": replica " << r << " differs from replica 0 (rank "
                                             << mpi::world_rank() << ")";
    ++compared;
  }
  EXPECT_GT(compared, 0);
  EXPECT_GT(smp::dp_size(), 1);
}

// A module used twice on its stage trains as two copies of it with equal
// values whose gradients add up (docs/3d.md: "one module used twice on one
// pp rank trains as in one process"), at every dp: a plain Linear and one
// of partita's distributed blocks, each reused, each replica on its own
// data. Each parameter's gradient is averaged over the replicas once.
TEST(ThreeD, AModuleUsedTwiceOnItsStageTrainsAsTwoCopies) {
  smp::Config config;
  config.partitions(1);  // pp 1, tp 1, dp = the world
  smp::init(config);
  const smp::StagePartitions parts = smp::stage_partitions(0);
  torch::manual_seed(41);
  torch::nn::Linear lin(kHidden, kHidden), lin_a(kHidden, kHidden), lin_b(kHidden, kHidden);
  Block block(parts, false, Data::kRandom), block_a(parts, false, Data::kRandom), block_b(parts, false, Data::kRandom);
  {
    at::NoGradGuard g;
    for (auto* l : {&lin, &lin_a, &lin_b}) (*l)->to(at::kDouble);
    for (auto* copy : {&lin_a, &lin_b})
      for (size_t i = 0; i < lin->parameters().size(); ++i) (*copy)->parameters()[i].copy_(lin->parameters()[i]);
    for (auto* copy : {&block_a, &block_b})
      for (size_t i = 0; i < block->parameters().size(); ++i) (*copy)->parameters()[i].copy_(block->parameters()[i]);
  }
  torch::nn::Sequential tied(lin, torch::nn::Tanh(), lin, block, block);
  torch::nn::Sequential apart(lin_a, torch::nn::Tanh(), lin_b, block_a, block_b);
  torch::manual_seed(300 + smp::dp_rank());  // each replica its own rows
  const at::Tensor x = at::randn({2 * kMicrobatches, kTokens, kHidden}, at::kDouble);
  for (auto* seq : {&tied, &apart}) {
    smp::DistributedModel model(*seq);
    smp::step([&](at::Tensor xb) {
      at::Tensor loss = model(xb).pow(2).sum();
      model.backward(loss);
      return loss;
    })(x);
  }
  const auto compare = [&](const std::vector<at::Tensor>& one, const std::vector<at::Tensor>& a,
                           const std::vector<at::Tensor>& b, const char* what) {
    ASSERT_EQ(one.size(), a.size());
    for (size_t i = 0; i < one.size(); ++i) {
      ASSERT_TRUE(one[i].grad().defined() && a[i].grad().defined() && b[i].grad().defined()) << what << " " << i;
      const at::Tensor sum = a[i].grad() + b[i].grad();
      EXPECT_TRUE(at::allclose(one[i].grad(), sum, 1e-12, 1e-12))
          << what << " parameter " << i << " on world rank " << mpi::world_rank() << ": used twice "
          << one[i].grad() << " against two copies " << sum;
    }
  };
  compare(lin->parameters(), lin_a->parameters(), lin_b->parameters(), "the Linear");
  compare(block->parameters(), block_a->parameters(), block_b->parameters(), "the distributed block");
}

// Bad input (issue 32 item 6): models that do not fit the 3-D layout raise
// smp::UsageError on every rank when the DistributedModel is built (before
// any step), and a good model trains afterwards.
TEST(ThreeD, ModelsThatDoNotFitTheLayoutRaiseOnEveryRank) {
  const int n = mpi::world_size();
  if (n == 1) GTEST_SKIP() << "one rank: every model fits";
  smp::Config config;
  config.partitions(n % 2 == 0 ? 2 : 1);
  config.tensor_parallel_degree(n % 4 == 0 ? 2 : 1);
  smp::init(config);
  const int pp = smp::pp_size(), tp = smp::tp_size();
  std::vector<smp::StagePartitions> parts;
  for (int s = 0; s < pp; ++s) parts.push_back(smp::stage_partitions(s));
  nn::LinearOptions o;
  o.dtype(at::kDouble);

  if (pp > 1) {
    // A stage boundary inside a block: the blocks' layers as separate
    // children, each block on its stage's partitions, split after block 0's
    // all-gather layer.
    torch::nn::Sequential seq;
    for (int s = 0; s < 2; ++s) {
      seq->push_back(nn::DistributedLinearAllGather(parts[s].tokens, parts[s].features, kHidden, kFfn, o));
      seq->push_back(torch::nn::Tanh());
      seq->push_back(nn::DistributedLinearReduceScatter(parts[s].features, parts[s].tokens, kFfn, kHidden, o));
    }
    const std::string e = usage_error([&] { smp::DistributedModel m(seq, {1}); });
    EXPECT_RAISED(e, "layer 2 ('2') runs on stage 1");
    EXPECT_RAISED(e, "was built on the ranks of pp rank 0 (smp::stage_partitions(0)): a stage boundary falls "
                     "inside a tensor-parallel block");
    // A LayerNorm, or a dropout, built on stage 0's ranks and run in stage
    // 1 (where it would return clones of its input).
    for (const bool norm : {true, false}) {
      torch::nn::Sequential misplaced;
      misplaced->push_back(Block(parts[0], false, Data::kRandom));
      if (norm)
        misplaced->push_back(nn::SequenceParallelLayerNorm(parts[0].tokens, kHidden, nn::LayerNormOptions().dtype(at::kDouble)));
      else
        misplaced->push_back(nn::SeededDropout(parts[0].tokens, nn::DropoutOptions().p(0.1)));
      misplaced->push_back(Block(parts[1], false, Data::kRandom));
      const std::string m_error = usage_error([&] { smp::DistributedModel m(misplaced, {1}); });
      EXPECT_RAISED(m_error, "layer 1 ('1') runs on stage 1");
      EXPECT_RAISED(m_error, std::string(norm ? "SequenceParallelLayerNormImpl" : "SeededDropoutImpl") +
                                 " was built on the ranks of pp rank 0");
    }
    // The same in a model without a distributed Linear layer.
    torch::nn::Sequential no_linear;
    no_linear->push_back(torch::nn::Tanh());
    no_linear->push_back(nn::SeededDropout(parts[0].tokens, nn::DropoutOptions().p(0.1)));
    const std::string d_error = usage_error([&] { smp::DistributedModel m(no_linear, {1}); });
    EXPECT_RAISED(d_error, "layer 1 ('1') runs on stage 1");
    EXPECT_RAISED(d_error, "SeededDropoutImpl was built on the ranks of pp rank 0");
  }
  const std::vector<int> ranks = smp::stage_workers(0);
  const int64_t n0 = static_cast<int64_t>(ranks.size());
  if (n0 > 1) {
    // A layer whose tp split disagrees with the tp degree: stage 0's ranks
    // as 1 x 1 x n0 (tp < n0) or n0 x 1 x 1 (tp = n0).
    const Shape shape = tp == n0 ? Shape{n0, 1, 1} : Shape{1, 1, n0};
    const auto P = mpi::Partition::world().create_partition_inclusive(ranks).create_cartesian_topology_partition(shape);
    torch::nn::Sequential seq;
    seq->push_back(nn::DistributedLinearAllGather(mpi::Partition(), P, kHidden, kFfn, o));
    for (int s = 1; s < pp; ++s) seq->push_back(Block(parts[s], false, Data::kRandom));
    const std::string e = usage_error([&] { smp::DistributedModel m(seq); });
    EXPECT_RAISED(e, "layer 0 ('0') runs on stage 0");
    EXPECT_RAISED(e, "splits its features over M = " + std::to_string(shape.back()) + " workers");
    EXPECT_RAISED(e, "tensor_parallel_degree is " + std::to_string(tp));
  }
  if (n0 > 1) {
    // A layer on some of the stage's ranks only: all but its last.
    const std::vector<int> some(ranks.begin(), ranks.end() - 1);
    const auto P =
        mpi::Partition::world().create_partition_inclusive(some).create_cartesian_topology_partition(
            {1, 1, static_cast<int64_t>(some.size())});
    torch::nn::Sequential seq;
    seq->push_back(nn::DistributedLinearAllGather(mpi::Partition(), P, kHidden, kFfn, o));
    for (int s = 1; s < pp; ++s) seq->push_back(Block(parts[s], false, Data::kRandom));
    const std::string e = usage_error([&] { smp::DistributedModel m(seq); });
    EXPECT_RAISED(e, "which are no stage's ranks; build it on smp::stage_partitions(0)");
  }
  {
    // Different models on different ranks: the last rank's has a GELU
    // where the others have a Tanh, then another layer; then different
    // split points.
    const bool last = mpi::world_rank() == n - 1;
    auto plain = [&](bool odd, int extra) {
      torch::nn::Sequential seq;
      for (int s = 0; s < pp; ++s) {
        seq->push_back(torch::nn::Linear(kHidden, kHidden));
        if (odd) seq->push_back(torch::nn::GELU());
        else seq->push_back(torch::nn::Tanh());
      }
      for (int i = 0; i < extra; ++i) seq->push_back(torch::nn::Tanh());
      return seq;
    };
    std::string e = usage_error([&] { smp::DistributedModel m(plain(last, 0)); });
    EXPECT_RAISED(e, "the ranks built different models");
    EXPECT_RAISED(e, "layer 1 is torch::nn::TanhImpl on world rank 0 and torch::nn::GELUImpl on world rank " +
                         std::to_string(n - 1));
    e = usage_error([&] { smp::DistributedModel m(plain(false, last ? 1 : 0)); });
    EXPECT_RAISED(e, "world rank 0 has " + std::to_string(2 * pp) + " layers, world rank " + std::to_string(n - 1) +
                         " has " + std::to_string(2 * pp + 1));
    if (pp > 1) {
      e = usage_error([&] { smp::DistributedModel m(plain(false, 1), {last ? 2 : 1}); });
      EXPECT_RAISED(e, "world rank 0 gives the split points [1], world rank " + std::to_string(n - 1) + " [2]");
    }
  }
  if (tp > 1) {
    // A layer with parameters partita does not know in a tensor-parallel
    // stage: each tp rank would get only its own tokens' share of its
    // gradient. Refused, naming it.
    torch::nn::Sequential seq;
    for (int s = 0; s < pp; ++s) seq->push_back(Block(parts[s], false, Data::kRandom));
    seq->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})));
    const std::string e = usage_error([&] { smp::DistributedModel m(seq); });
    EXPECT_RAISED(e, "layer " + std::to_string(pp) + " ('" + std::to_string(pp) +
                         "') holds torch::nn::LayerNormImpl with parameters 'weight', 'bias'");
    EXPECT_RAISED(e, "under tensor_parallel_degree " + std::to_string(tp));
    // The same for a torch::nn::Linear head nested in a container, and for
    // a module of the user's with a parameter of its own.
    torch::nn::Sequential nested;
    for (int s = 0; s < pp; ++s) nested->push_back(Block(parts[s], false, Data::kRandom));
    nested->push_back(std::make_shared<Wrapped>());
    std::vector<int> one_block_each;  // stage s starts at block s (the extra layer in the last)
    for (int s = 1; s < pp; ++s) one_block_each.push_back(s);
    const std::string in_nested = usage_error([&] { smp::DistributedModel m(nested, one_block_each); });
    EXPECT_RAISED(in_nested, "layer " + std::to_string(pp) + " ('" + std::to_string(pp) +
                                 "') holds torch::nn::LinearImpl with parameters 'weight', 'bias'");
    torch::nn::Sequential own;
    for (int s = 0; s < pp; ++s) own->push_back(Block(parts[s], false, Data::kRandom));
    own->push_back(std::make_shared<Gain>());
    const std::string in_own = usage_error([&] { smp::DistributedModel m(own, one_block_each); });
    EXPECT_RAISED(in_own, "Gain with parameters 'gain'");
  }
  if (tp == 1 && pp > 1) {
    // Tied parameters: a Gain's on stage 0 used again on stage 1, and a
    // distributed layer's weight used by a plain module of its stage.
    auto gain = std::make_shared<Gain>();
    torch::nn::Sequential apart;
    apart->push_back(gain);
    apart->push_back(std::make_shared<Shares>(gain->gain));
    const std::string across = usage_error([&] { smp::DistributedModel m(apart, {1}); });
    EXPECT_RAISED(across, "'0.gain' (layer 0) and '1.shared' (layer 1) are one tensor, on different pp ranks (0 and 1)");
    Block block(parts[0], false, Data::kRandom);
    const auto held = block->up->parameters();  // none on stage 1's ranks: a stand-in of its shape (tp 1)
    torch::nn::Sequential with_distributed;
    with_distributed->push_back(block);
    with_distributed->push_back(std::make_shared<Shares>(held.empty() ? at::zeros({kFfn, kHidden}, at::kDouble) : held[0]));
    with_distributed->push_back(Block(parts[1], false, Data::kRandom));
    const std::string mixed = usage_error([&] { smp::DistributedModel m(with_distributed, {2}); });
    EXPECT_RAISED(mixed, "(layer 0) and '1.shared' (layer 1) are one tensor, and one of them is a partita distributed "
                         "layer's");
    // A tie between plain modules on one pp rank is left to train.
    auto kept = std::make_shared<Gain>();
    torch::nn::Sequential together;
    together->push_back(kept);
    together->push_back(std::make_shared<Shares>(kept->gain));
    together->push_back(std::make_shared<Gain>());
    EXPECT_EQ(usage_error([&] { smp::DistributedModel m(together, {2}); }), "");
    // So is one distributed layer reused on its stage.
    Block twice(parts[0], false, Data::kRandom);
    torch::nn::Sequential reused;
    reused->push_back(twice);
    reused->push_back(twice);
    reused->push_back(Block(parts[1], false, Data::kRandom));
    EXPECT_EQ(usage_error([&] { smp::DistributedModel m(reused, {2}); }), "");
  }
  // A model that fits still builds and trains a step.
  torch::nn::Sequential seq;
  for (int s = 0; s < pp; ++s) seq->push_back(Block(parts[s], false, Data::kRandom));
  smp::DistributedModel model(seq);
  auto train = smp::step([&](at::Tensor xb) {
    at::Tensor loss = model(xb).pow(2).sum();
    model.backward(loss);
    return loss;
  });
  const at::Tensor x = at::randn({2 * kMicrobatches, kTokens / tp, kHidden}, at::kDouble);
  train(x);
  EXPECT_GT(model.stats().forwards, 0);
}

}  // namespace
}  // namespace partita::spec
