// 3-D parallel training with partita (docs/3d.md): pipeline stages that are
// tensor-parallel groups, over data-parallel replicas. The model is a stack
// of Megatron's sequence-parallel MLP blocks made of seed 002's layers;
// copy this file to start a program of your own.
//
//   mpiexec.mpich -n 8 build/examples/train_3d            # pp 2 x tp 2 x dp 2
//   # pp 2 x tp 4 x dp 1:
//   PARTITA_SMP_CONFIG='{"partitions": 2, "tensor_parallel_degree": 4}' mpiexec.mpich -n 8 build/examples/train_3d
//
// Prints the layout, then the whole batch's loss at every step; exits 0
// when the loss fell over the run ("train_3d: the loss fell ...").
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "partita/distribute.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/linear.hpp"
#include "partita/smp.hpp"
#include "partita/smp/pipeline.hpp"
#include "partita/smp/step.hpp"
#include "partita/smp/tensor_parallel.hpp"

namespace mpi = partita::mpi;
namespace nn = partita::nn;
namespace smp = partita::smp;

// The model's sizes: activations are [batch, tokens, hidden].
constexpr int64_t kBatch = 16, kTokens = 8, kHidden = 16, kFfn = 64;
constexpr int kBlocks = 4, kSteps = 10;
constexpr double kLearningRate = 0.2;

// Megatron's sequence-parallel MLP: tokens split over tp -> all-gather ->
// output features split -> GELU -> reduce-scatter -> tokens split again.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const smp::StagePartitions& P) {
    nn::LinearOptions o;
    o.dtype(at::kFloat);
    up = register_module("up", nn::DistributedLinearAllGather(P.tokens, P.features, kHidden, kFfn, o));
    down = register_module("down", nn::DistributedLinearReduceScatter(P.features, P.tokens, kFfn, kHidden, o));
  }
  at::Tensor forward(at::Tensor x) { return x + down(torch::gelu(up(x))); }  // a residual block
  nn::DistributedLinearAllGather up{nullptr};
  nn::DistributedLinearReduceScatter down{nullptr};
};
TORCH_MODULE(Block);

smp::Config configuration(int world) {
  if (std::getenv(smp::kConfigVariable)) return smp::Config::from_environment();
  smp::Config c;  // the default: two stages of two tp ranks where the world allows
  c.partitions(world % 2 == 0 ? 2 : 1);
  c.tensor_parallel_degree(world % (2 * c.partitions()) == 0 ? 2 : 1);
  c.microbatches(2);
  c.pipeline("interleaved");
  return c;
}

// A sum over a group, in group-rank order (the same on every member).
double group_sum(double v, smp::CommGroup group) {
  double s = 0;
  for (double x : smp::allgather(v, group)) s += x;
  return s;
}

std::string list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return "[" + s + "]";
}

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  at::set_num_threads(1);
  smp::init(configuration(mpi::world_size()));
  const int pp = smp::pp_size(), tp = smp::tp_size(), dp = smp::dp_size();
  const int microbatches = smp::config().microbatches();

  // The layout, one line per rank, printed by rank 0.
  char line[160];
  std::snprintf(line, sizeof line, "  rank %d: dp_rank %d, pp_rank %d, tp_rank %d; tp group %s, pp group %s",
                smp::rank(), smp::dp_rank(), smp::pp_rank(), smp::tp_rank(), list(smp::get_tp_group()).c_str(),
                list(smp::get_pp_group()).c_str());
  const auto lines = smp::allgather(std::string(line), smp::WORLD);
  if (smp::rank() == 0) {
    std::printf("train_3d: %d processes = dp %d x pp %d x tp %d, %d microbatches, pipeline %s\n", smp::size(), dp, pp,
                tp, microbatches, smp::config().pipeline().c_str());
    for (const auto& l : lines) std::printf("%s\n", l.c_str());
  }
  if (kBlocks % pp != 0 || kTokens % tp != 0 || kBatch % (dp * microbatches) != 0) {
    if (smp::rank() == 0) std::printf("train_3d: this layout does not divide the model's sizes\n");
    return 2;
  }

  // Every rank builds every block, on its stage's partitions, initialised
  // as one process would initialise the whole model (the same seed
  // everywhere, each layer cut out of a torch::nn::Linear).
  std::vector<smp::StagePartitions> parts;
  for (int s = 0; s < pp; ++s) parts.push_back(smp::stage_partitions(s));
  torch::manual_seed(2026);
  torch::nn::Sequential model_layers;
  std::vector<Block> blocks;
  for (int k = 0; k < kBlocks; ++k) {
    Block b(parts[k / (kBlocks / pp)]);
    b->up->scatter_parameters(torch::nn::Linear(kHidden, kFfn));
    b->down->scatter_parameters(torch::nn::Linear(kFfn, kHidden));
    model_layers->push_back(b);
    blocks.push_back(b);
  }
  std::vector<int> splits;
  for (int s = 1; s < pp; ++s) splits.push_back(s * kBlocks / pp);
  smp::DistributedModel model(model_layers, splits);

  // Synthetic data, the same on every rank: learn y = tanh(x A).
  const at::Tensor X = torch::randn({kBatch, kTokens, kHidden});
  const at::Tensor Y = torch::tanh(torch::matmul(X, torch::randn({kHidden, kHidden}) / 4.0));
  // This rank's piece: its replica's rows, its tp rank's tokens, as the
  // stage's `tokens` partition (dp x tp x 1) cuts the batch.
  const mpi::Partition& cut = parts[smp::pp_rank()].tokens;
  const at::Tensor x = partita::distribute(X, cut);
  const at::Tensor y = partita::distribute(Y, cut);

  // Each rank's loss is its share of its replica's microbatch's mean
  // squared error (the shares add up over tp); the step trains the mean over
  // the replicas (docs/3d.md, "One rule for every parameter").
  const double elements = static_cast<double>(kBatch / dp / microbatches * kTokens * kHidden);
  auto train = smp::step([&](at::Tensor xb, at::Tensor yb) {
    at::Tensor loss = (model(xb) - yb).pow(2).sum() / elements;
    model.backward(loss);
    return loss;
  });

  double first = 0, last = 0;
  for (int step = 0; step < kSteps; ++step) {
    smp::StepOutput losses = train(x, y);  // the last stage's, on every stage
    double mine = 0;
    for (const auto& l : losses.outputs()) mine += l.item<double>();
    const double loss = group_sum(group_sum(mine / microbatches, smp::TP_GROUP), smp::DP_GROUP) / dp;
    {
      torch::NoGradGuard no_grad;  // plain SGD on this rank's parameters
      for (auto& p : model.parameters())
        if (p.grad().defined()) {
          p.sub_(p.grad() * kLearningRate);
          p.mutable_grad().zero_();
        }
    }
    if (smp::rank() == 0) std::printf("step %d: loss %.6f\n", step, loss);
    if (step == 0) first = loss;
    last = loss;
  }
  if (smp::rank() == 0)
    std::printf("train_3d: the loss %s from %.6f to %.6f\n", last < first ? "fell" : "did not fall", first, last);
  return last < first ? 0 : 1;
}
