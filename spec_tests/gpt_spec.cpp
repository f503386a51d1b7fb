// A small GPT (examples/gpt/gpt.hpp: vocabulary-parallel embeddings,
// sequence-parallel LayerNorms, attention with heads over tp, a 4x MLP, a
// vocabulary-parallel head and cross-entropy) trained under every layout of
// the world size and every built-in schedule, in float64, against the same
// model on one process from the same global parameters: the loss and every
// parameter after every optimizer step, for SGD with momentum and Adam, and
// with dropout on (docs/transformer.md, "The GPT, equal to one process").
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../examples/gpt/gpt.hpp"
#include "partita/distribute.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/reference/dropout.hpp"
#include "partita/reference/partition.hpp"
#include "partita/smp.hpp"
#include "partita/smp/checkpoint.hpp"
#include "partita/smp/pipeline.hpp"
#include "partita/smp/step.hpp"
#include "partita/smp/tensor_parallel.hpp"
#include "partita/testing/checks.hpp"
#include "temp_dir.hpp"

namespace partita::spec {
namespace {

constexpr int kSteps = 10, kMicrobatches = 2;
constexpr int64_t kBatch = 4;  // rows over all replicas, or 2 per replica where there are more
constexpr double kTolerance = 1e-9;

gpt::Sizes sizes() {
  gpt::Sizes s;
  s.vocab = 11;  // uneven over 2 tp ranks
  s.context = 6;
  s.hidden = 8;
  s.heads = 2;
  s.layers = 2;
  s.dtype = at::kDouble;
  return s;
}

enum class Optimizer { kSgdMomentum, kAdam };

struct Case {
  int pp, tp;
  std::string schedule;
  Optimizer optimizer;
  bool replicated = true;  // the Linear layers' data parallelism (gpt::Sizes)
  double dropout = 0;      // gpt::Sizes::dropout
};

int dp_of(const Case& c) { return mpi::world_size() / (c.pp * c.tp); }

// The global batch's rows: every replica's microbatches hold a row.
int64_t batch_of(const Case& c) { return std::max<int64_t>(kBatch, int64_t{dp_of(c)} * kMicrobatches); }

std::string name_of(const Case& c) {
  return "pp " + std::to_string(c.pp) + " x tp " + std::to_string(c.tp) + " x dp " + std::to_string(dp_of(c)) +
         ", " + c.schedule + (c.optimizer == Optimizer::kAdam ? ", Adam" : ", SGD with momentum") +
         (dp_of(c) == 1 ? "" : c.replicated ? ", Linear layers replicated" : ", Linear layers stored on replica 0") +
         (c.dropout > 0 ? ", dropout " + std::to_string(c.dropout) : "");
}

gpt::Sizes sizes(const Case& c) {
  gpt::Sizes s = sizes();
  s.replicated = c.replicated;
  s.dropout = c.dropout;
  return s;
}

// The distributed run's dropout, on one process (docs/transformer.md,
// "Seeded dropout"): in step `step`, microbatch j's call of site k is the
// layer's call step * m + j, and its global tensor is the replicas'
// microbatches j put together in dp order; each element's mask is drawn
// from its place there. Global row r of the batch belongs to replica
// r / (B / dp), its microbatch j, row i of it: row (replica * rows + i) of
// microbatch j's tensor.
gpt::Dropout one_process_dropout(const gpt::Sizes& s, int dp, int step) {
  if (s.dropout == 0) return {};
  return [s, dp, step](int site, const at::Tensor& x) {
    const int64_t per_replica = x.size(0) / dp, rows = per_replica / kMicrobatches;
    const auto one = reference::Partition::world(1).create_cartesian_topology_partition({1, 1, 1});
    std::vector<at::Tensor> microbatch;  // each microbatch's scaled mask
    for (int j = 0; j < kMicrobatches; ++j)
      microbatch.push_back(reference::seeded_dropout(one, s.dropout, s.dropout_seed + site,
                                                     static_cast<uint64_t>(step) * kMicrobatches + j, {},
                                                     {at::ones({dp * rows, x.size(1), x.size(2)}, x.options())})[0]);
    std::vector<at::Tensor> by_row;
    for (int64_t replica = 0; replica < dp; ++replica)
      for (int j = 0; j < kMicrobatches; ++j) by_row.push_back(microbatch[j].narrow(0, replica * rows, rows));
    return x * at::cat(by_row, 0);
  };
}

double group_sum(double v, smp::CommGroup g) {
  double s = 0;
  for (double x : smp::allgather(v, g)) s += x;
  return s;
}

std::unique_ptr<torch::optim::Optimizer> optimizer(Optimizer o, std::vector<at::Tensor> params) {
  if (o == Optimizer::kAdam) return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

// smp::init at the case's layout and schedule; the chunks per pipeline rank.
int init_layout(const Case& c) {
  smp::Config config;
  config.partitions(c.pp);
  config.tensor_parallel_degree(c.tp);
  config.microbatches(kMicrobatches);
  config.pipeline(c.schedule);
  config.virtual_pipeline_model_parallel_size(c.schedule == "interleaved_virtual" ? 2 : 1);
  smp::init(config);
  return c.schedule == "interleaved_virtual" && c.pp > 1 ? 2 : 1;
}

// The same model on one process: the global parameters as leaves, its
// optimizer, and the global batch every step trains on.
struct OneProcess {
  gpt::Parameters params;
  std::unique_ptr<torch::optim::Optimizer> opt;
  at::Tensor ids, targets;
};

OneProcess one_process(const gpt::Sizes& s, Optimizer o, const gpt::Parameters& init, int64_t batch) {
  OneProcess r;
  std::vector<at::Tensor> leaves;
  for (const auto& [name, t] : init) {
    r.params[name] = t.clone().requires_grad_(true);
    leaves.push_back(r.params[name]);
  }
  r.opt = optimizer(o, leaves);
  // Random ids and targets, the same on every rank.
  auto gen = at::detail::createCPUGenerator(11);
  r.ids = at::randint(0, s.vocab, {batch, s.context}, gen, at::TensorOptions(at::kLong));
  r.targets = at::randint(0, s.vocab, {batch, s.context}, gen, at::TensorOptions(at::kLong));
  return r;
}

// Where a run's parameters come from and where they go.
struct Checkpoints {
  std::string load_from;  // empty: gpt::init_parameters(s, 7)
  std::string save_to;    // empty: no checkpoint at the end
};

// Steps [first, end) at c's layout beside `ref` (which takes the same
// steps); returns this rank's first difference, "" when every step matched.
std::string train_and_compare(const Case& c, OneProcess& ref, int first, int end, const Checkpoints& io = {}) {
  const int v = init_layout(c);
  const gpt::Sizes s = sizes(c);
  const int dp = smp::dp_size(), stage = smp::pp_rank();
  const std::string label = name_of(c) + (io.load_from.empty() ? "" : ", resumed from a checkpoint");

  std::vector<smp::StagePartitions> parts;
  for (int k = 0; k < c.pp; ++k) parts.push_back(smp::stage_partitions(k));
  gpt::Model m = gpt::build(parts, s, v);
  // Resumed: other initial values, which the checkpoint must replace.
  gpt::load(m, gpt::init_parameters(s, io.load_from.empty() ? 7 : 99));
  smp::DistributedModel model(m.layers, gpt::split_points(s, c.pp * v));
  auto opt = optimizer(c.optimizer, model.parameters());
  if (!io.load_from.empty()) smp::load_checkpoint(io.load_from, model, opt.get());

  // Each rank takes its replica's rows and its tp rank's tokens.
  const int64_t batch = ref.ids.size(0);
  const at::Tensor positions = at::arange(s.context, at::TensorOptions(at::kLong)).unsqueeze(0).expand({batch, s.context});
  const mpi::Partition& cut = parts[stage].tokens;
  const at::Tensor x = partita::distribute(at::stack({ref.ids, positions}, 2).contiguous(), cut);
  const at::Tensor y = partita::distribute(ref.targets.unsqueeze(2).contiguous(), cut).squeeze(2).contiguous();

  // The loss on the last stage: each rank's tokens' cross-entropy over the
  // replica's microbatch's token count (docs/3d.md's rule); the other
  // stages' value is ignored by the pipeline.
  nn::VocabParallelCrossEntropy ce(parts[c.pp - 1].tokens, s.vocab);
  const double tokens_per_microbatch = static_cast<double>(batch / dp / kMicrobatches * s.context);
  auto train = smp::step([&](at::Tensor xb, at::Tensor yb) {
    const at::Tensor out = model(xb);
    at::Tensor loss = stage == c.pp - 1 ? ce(out, yb).sum() / tokens_per_microbatch : out.sum() * 0;
    model.backward(loss);
    return loss;
  });

  std::string problem;
  auto compare = [&](const std::string& when) {
    for (const auto& [name, got, want] : gpt::pieces(m, ref.params, stage)) {
      const double err = (got - want).abs().max().item<double>(), scale = std::max(1.0, want.abs().max().item<double>());
      if (problem.empty() && !(err <= kTolerance * scale))
        problem = label + ", " + when + ": " + name + " differs from one process by " + std::to_string(err);
      // The replicas hold the same bits: each averaged the same gradients
      // in the same order (two sums of the elements, one weighted, agree).
      // Seed 002's stored form holds its blocks on replica 0 only.
      if (dp > 1 && (c.replicated || name.find("this rank's block") == std::string::npos)) {
        const at::Tensor w = at::arange(1, got.numel() + 1, got.options()).reshape(got.sizes());
        const auto sums = smp::allgather(got.sum().item<double>(), smp::DP_GROUP);
        const auto weighted = smp::allgather((got * w).sum().item<double>(), smp::DP_GROUP);
        for (size_t r = 1; r < sums.size(); ++r)
          if (problem.empty() && (sums[r] != sums[0] || weighted[r] != weighted[0]))
            problem = label + ", " + when + ": " + name + " on replica " + std::to_string(r) +
                      " is not replica 0's to the last bit";
      }
    }
  };
  if (!io.load_from.empty()) compare("after the load");
  // Every rank stops at the first step after which any rank found a
  // difference (the steps are collective).
  for (int step = first; step < end && mpi::all_true(problem.empty(), mpi::world_comm()); ++step) {
    const at::Tensor ref_loss = at::cross_entropy_loss(
        gpt::forward(ref.params, s, ref.ids, one_process_dropout(s, dp, step)).reshape({-1, s.vocab}), ref.targets.reshape({-1}));
    ref.opt->zero_grad();
    ref_loss.backward();
    ref.opt->step();

    opt->zero_grad();
    smp::StepOutput losses = train(x, y);
    double mine = 0;
    for (const auto& l : losses.outputs()) mine += l.item<double>();
    const double total = group_sum(group_sum(mine / kMicrobatches, smp::TP_GROUP), smp::DP_GROUP) / dp;
    opt->step();
    if (!(std::abs(total - ref_loss.item<double>()) <= kTolerance * std::max(1.0, std::abs(ref_loss.item<double>()))))
      problem = label + ", step " + std::to_string(step) + ": loss " + std::to_string(total) + ", one process " +
                std::to_string(ref_loss.item<double>());
    compare("step " + std::to_string(step));
  }
  if (!io.save_to.empty()) smp::save_checkpoint(io.save_to, model, opt.get(), {{{"step", end}}, ""});
  return problem;
}

std::string train_and_compare(const Case& c) {
  const gpt::Parameters init = gpt::init_parameters(sizes(c), 7);
  OneProcess ref = one_process(sizes(c), c.optimizer, init, batch_of(c));
  std::string problem = train_and_compare(c, ref, 0, kSteps);
  // The run trained: the parameters moved.
  if (problem.empty() && at::equal(ref.params.at("head.out.weight"), init.at("head.out.weight")))
    problem = name_of(c) + ": the head did not move";
  return problem;
}

std::vector<std::pair<int, int>> layouts() {
  switch (mpi::world_size()) {
    case 1: return {{1, 1}};
    case 2: return {{2, 1}, {1, 2}, {1, 1}};
    case 4: return {{2, 2}, {1, 2}};
    case 8: return {{2, 2}};
    default: return {};
  }
}

const std::vector<std::string> kSchedules = {"simple", "interleaved", "zero_bubble", "interleaved_virtual"};

// The layouts of the every-schedule and bytes tests: layouts(), and at 4
// ranks 4 replicas of one stage (the dp average over more than two), under
// one schedule (with one stage they all run the same steps).
std::vector<std::pair<int, int>> every_layout() {
  auto ls = layouts();
  if (mpi::world_size() == 4) ls.push_back({1, 1});
  return ls;
}
bool worth_running(int pp, int tp, const std::string& schedule) {
  return !(pp == 1 && tp == 1 && mpi::world_size() > 2 && schedule != "simple");
}

TEST(Gpt, EveryParameterEqualsOneProcessUnderEverySchedule) {
  const auto ls = every_layout();
  if (ls.empty()) GTEST_SKIP() << "no layout for " << mpi::world_size() << " ranks";
  for (const auto& [pp, tp] : ls)
    for (const auto& schedule : kSchedules)
      for (const Optimizer o : {Optimizer::kSgdMomentum, Optimizer::kAdam})
        for (const bool replicated : {true, false}) {
          if (!worth_running(pp, tp, schedule)) continue;
          if (schedule == "interleaved_virtual" && pp == 1 && o == Optimizer::kAdam) continue;  // the same run as 1F1B
          if (!replicated && dp_of({pp, tp, schedule, o}) == 1) continue;  // no copies: the same run
          // Adam trains with dropout on, SGD without.
          PARTITA_EXPECT_AGREED(train_and_compare({pp, tp, schedule, o, replicated, o == Optimizer::kAdam ? 0.25 : 0.0}));
        }
}

// Three steps at one layout, a checkpoint of the parameters, the
// optimizer's state and the dropout layers' counts, three more at another
// layout (another schedule, and the Linear layers' other data parallelism
// where there are replicas: saved replicated and loaded stored on replica
// 0, or the other way, alternately) from the checkpoint, dropout on: every
// step equals one process's six (docs/checkpoints.md).
TEST(Gpt, ResumesFromACheckpointAtAnotherLayout) {
  const auto ls = layouts();
  if (ls.empty()) GTEST_SKIP() << "no layout for " << mpi::world_size() << " ranks";
  TempDir tmp;
  int n = 0, pair = 0;
  for (const auto& [pp, tp] : ls)
    for (const auto& [pp2, tp2] : ls) {
      ++pair;
      for (const Optimizer o : {Optimizer::kSgdMomentum, Optimizer::kAdam}) {
        const bool saved_replicated = (pair % 2 == 0) == (o == Optimizer::kAdam);
        const Case a{pp, tp, "interleaved", o, saved_replicated, 0.25},
            b{pp2, tp2, "interleaved_virtual", o, !saved_replicated, 0.25};
        const std::string dir = tmp / ("step-3-" + std::to_string(n++));
        OneProcess ref = one_process(sizes(a), o, gpt::init_parameters(sizes(a), 7), std::max(batch_of(a), batch_of(b)));
        std::string problem = train_and_compare(a, ref, 0, 3, {"", dir});
        // Every rank goes on to the second half only where no rank found a difference.
        if (mpi::all_true(problem.empty(), mpi::world_comm())) problem = train_and_compare(b, ref, 3, 6, {dir, ""});
        PARTITA_EXPECT_AGREED(problem);
      }
    }
}

// ---- Bytes per step --------------------------------------------------------

struct Volume {
  int64_t pipeline = 0, tensor_parallel = 0, data_parallel = 0;
};

// docs/3d.md's formula for the GPT ("The transformer's bytes"), for this
// rank (pp rank r, dp rank q, tp rank u) holding the layers whose pp rank
// `stage_of` names, in the first step of an input shape or a later one.
// Rows of a table or of the head split over t as partita splits: the first
// V mod t ranks hold one more.
Volume gpt_formula(const Case& c, const std::vector<int>& stage_of, const gpt::Sizes& s, bool first) {
  const int64_t p = c.pp, t = c.tp, d = dp_of(c), m = kMicrobatches;
  const int64_t r = smp::pp_rank(), q = smp::dp_rank(), u = smp::tp_rank();
  const int64_t v = c.schedule == "interleaved_virtual" && p > 1 ? 2 : 1;
  const int64_t e = v > 1 && r < p - 1 && first ? 1 : 0;  // the stand-in's shape probe
  const int64_t f = c10::elementSize(s.dtype), l = 8;      // float and id bytes
  const int64_t H = s.hidden, V = s.vocab, T = s.context, b = batch_of(c) / (m * d), Tt = T / t;
  auto rows = [&](int64_t n) { return n / t + (u < n % t ? 1 : 0); };
  const int64_t L = s.layers;
  int64_t E = 0, K = 0, Hd = 0;
  for (int64_t i = 0; i < L + 2; ++i) {
    if (stage_of[i] != r) continue;
    (i == 0 ? E : i == L + 1 ? Hd : K) += 1;
  }
  const bool last = r == p - 1;
  const int64_t a = b * Tt * H * f;  // one activation piece
  Volume out;
  if (p > 1) out.pipeline = m * a * ((v - (r == p - 1)) + (v - (r == 0)));
  // Forward: each embedding gathers its ids and reduce-scatters its rows'
  // sums; a block gathers twice and reduce-scatters twice; the head gathers.
  const int64_t forward = (t - 1) * (E * 2 * (b * Tt * l + a) + K * 4 * a + Hd * a);
  // The cross-entropy: the targets gathered, the maximum and the sums of
  // exponentials and target logits all-reduced over every token of the team.
  const int64_t ce_forward = last ? (t - 1) * (l * b * Tt + 3 * f * b * T) : 0;
  // Backward: each collective's adjoint moves what its forward moved (the
  // ids none), the loss gradient of this rank's tokens is gathered, and
  // each LayerNorm all-reduces its weight's and bias's gradients.
  const int64_t activations = (t - 1) * (E * 2 * a + K * 4 * a + Hd * a) + (last ? (t - 1) * f * b * Tt : 0);
  const int64_t norms = (t - 1) * 2 * H * f * (2 * K + Hd);
  // ZB-H1: I runs every activation adjoint from the loss to the stage's
  // input (none on stage 0, whose ids take no gradient), W all of them again
  // (each lies on a path to a parameter) and the LayerNorms' sums.
  const int64_t passes = c.schedule == "zero_bubble" && r > 0 ? 2 : 1;
  out.tensor_parallel = m * (forward + ce_forward + passes * activations + norms) + e * forward;
  if (d > 1) {
    const int64_t linear = f * (K * (12 * H * H + 9 * H) / t + Hd * rows(V) * (H + 1));
    // The LayerNorms' and the tables' gradients averaged over the replicas
    // once per step, and the Linear layers' too where each replica holds
    // them; else seed 002's: W and b broadcast from replica 0 in every
    // microbatch's forward, their gradients sum-reduced back.
    const int64_t plain = f * (2 * H * (2 * K + Hd) + E * (rows(V) + rows(T)) * H);
    if (c.replicated) out.data_parallel = (d - 1) * (plain + linear);
    else out.data_parallel = (q == 0 ? (m + e) * linear * (d - 1) : m * linear) + (d - 1) * plain;
  }
  return out;
}

// Two steps of the GPT under each layout and schedule; after each, this
// rank's counts against the formula.
std::string check_volumes(const Case& c) {
  const int v = init_layout(c);
  const gpt::Sizes s = sizes(c);
  const int dp = smp::dp_size(), stage = smp::pp_rank();
  std::vector<smp::StagePartitions> parts;
  for (int k = 0; k < c.pp; ++k) parts.push_back(smp::stage_partitions(k));
  gpt::Model m = gpt::build(parts, s, v);
  gpt::load(m, gpt::init_parameters(s, 7));
  smp::DistributedModel model(m.layers, gpt::split_points(s, c.pp * v));
  nn::VocabParallelCrossEntropy ce(parts[c.pp - 1].tokens, s.vocab);
  const int64_t batch = batch_of(c);
  const double tokens_per_microbatch = static_cast<double>(batch / dp / kMicrobatches * s.context);
  auto train = smp::step([&](at::Tensor xb, at::Tensor yb) {
    const at::Tensor out = model(xb);
    at::Tensor loss = stage == c.pp - 1 ? ce(out, yb).sum() / tokens_per_microbatch : out.sum() * 0;
    model.backward(loss);
    return loss;
  });
  auto gen = at::detail::createCPUGenerator(11);
  const at::Tensor ids = at::randint(0, s.vocab, {batch, s.context}, gen, at::TensorOptions(at::kLong));
  const at::Tensor positions = at::arange(s.context, at::TensorOptions(at::kLong)).unsqueeze(0).expand({batch, s.context});
  const mpi::Partition& cut = parts[stage].tokens;
  const at::Tensor x = partita::distribute(at::stack({ids, positions}, 2).contiguous(), cut);
  const at::Tensor y = partita::distribute(ids.unsqueeze(2).contiguous(), cut).squeeze(2).contiguous();
  std::string problem;
  for (int step = 0; step < 2; ++step) {
    const Volume want = gpt_formula(c, m.stage_of, s, step == 0);
    train(x, y);
    const smp::PipelineStats& got = model.stats();
    const std::string at = name_of(c) + ", step " + std::to_string(step) + ", world rank " +
                           std::to_string(mpi::world_rank()) + ": ";
    auto expect = [&](const char* kind, int64_t g, int64_t w) {
      if (g != w) problem += at + kind + " bytes " + std::to_string(g) + ", the formula " + std::to_string(w) + "; ";
    };
    expect("pipeline", got.pipeline_bytes, want.pipeline);
    expect("tensor-parallel", got.tensor_parallel_bytes, want.tensor_parallel);
    expect("data-parallel", got.data_parallel_bytes, want.data_parallel);
  }
  return problem;
}

TEST(Gpt, BytesPerStepEqualTheFormula) {
  const auto ls = every_layout();
  if (ls.empty()) GTEST_SKIP() << "no layout for " << mpi::world_size() << " ranks";
  for (const auto& [pp, tp] : ls)
    for (const auto& schedule : kSchedules)
      for (const bool replicated : {true, false}) {
        if (!worth_running(pp, tp, schedule)) continue;
        const Case c{pp, tp, schedule, Optimizer::kSgdMomentum, replicated};
        if (replicated || dp_of(c) > 1) PARTITA_EXPECT_AGREED(check_volumes(c));
      }
}

}  // namespace
}  // namespace partita::spec
