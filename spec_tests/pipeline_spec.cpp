// Pipeline-parallel execution (issue 14, docs/pipeline.md): the schedules
// written out by hand, the balanced split, the central check (an MLP and a
// stack of transformer-style blocks trained through smp::DistributedModel at
// every partition count this world allows, 1, 2, 4 and 8 microbatches, both
// schedules, equal to one process on the whole batch within 1e-10 for 5 SGD
// steps), the live-activation counter of each schedule, and the errors that
// must be raised on every rank.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>
#include <typeinfo>

#include "expect_raises.hpp"
#include "partita/testing/pipeline_checks.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/smp.hpp"
#include "partita/smp/pipeline.hpp"
#include "partita/smp/step.hpp"

namespace partita::spec {
namespace {

using A = smp::PipelineAction;

std::string timeline(const std::vector<A>& actions) {
  std::string s;
  for (const auto& a : actions) s += (s.empty() ? "" : " ") + std::string(a.kind == A::kForward ? "F" : "B") + std::to_string(a.microbatch);
  return s;
}

TEST(Pipeline, SchedulesByHandFourStagesEightMicrobatches) {
  using smp::Pipeline;
  EXPECT_EQ(timeline(smp::schedule(Pipeline::kSimple, 2, 4, 8)),
            "F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7");
  EXPECT_EQ(timeline(smp::schedule(Pipeline::kInterleaved, 0, 4, 8)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(timeline(smp::schedule(Pipeline::kInterleaved, 1, 4, 8)),
            "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(timeline(smp::schedule(Pipeline::kInterleaved, 3, 4, 8)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // Fewer microbatches than stages: the warm-up is cut short.
  EXPECT_EQ(timeline(smp::schedule(Pipeline::kInterleaved, 0, 4, 2)), "F0 F1 B0 B1");
  // Peak activations held: GPipe every microbatch, 1F1B at most stages - s.
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(smp::peak_live(smp::schedule(Pipeline::kSimple, s, 4, 8)), 8);
    EXPECT_EQ(smp::peak_live(smp::schedule(Pipeline::kInterleaved, s, 4, 8)), 4 - s);
  }
  EXPECT_CONTAINS(raised<smp::ConfigError>([] { smp::pipeline_from_name("zigzag"); }), "zigzag");
}

TEST(Pipeline, BalancedSplitByHand) {
  EXPECT_EQ(smp::balance_by_parameters({1, 100, 1, 1}, 2), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(smp::balance_by_parameters({10, 0, 10, 10}, 2), (std::vector<int>{0, 1, 4}));  // ties: earliest
  EXPECT_EQ(smp::balance_by_parameters({5, 5, 5, 5}, 4), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(smp::balance_by_parameters({8, 0, 8, 0, 8, 0, 8}, 2), (std::vector<int>{0, 3, 7}));
  EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::balance_by_parameters({1, 2}, 3); }),
                  "2 layers, fewer than the 3 pipeline stages");
}

// Partition counts of this world among 1, 2, 4, 8.
std::vector<int> partition_counts() {
  std::vector<int> out;
  for (int p : {1, 2, 4, 8})
    if (mpi::world_size() % p == 0) out.push_back(p);
  return out;
}

void init(int partitions, const std::string& pipeline) {
  smp::Config cfg;
  cfg.partitions(partitions);
  cfg.pipeline(pipeline);
  smp::init(cfg);
}

testing::ModelSpec mlp() { return {false, {6, 12, 10, 12, 9, 12, 4}, 11}; }          // 11 layers
testing::ModelSpec blocks() { return {true, {6, 8, 16, 12, 16, 5}, 12}; }            // 6 layers
testing::ModelSpec blocks8() { return {true, {6, 8, 16, 12, 16, 12, 16, 5}, 12}; }    // 8 layers, for 8 stages

// The central check of issue 14.
TEST(Pipeline, EqualsOneProcessOnTheWholeBatch) {
  torch::set_num_threads(1);
  int runs = 0;
  for (int p : partition_counts())
    for (const char* pipeline : {"simple", "interleaved"}) {
      init(p, pipeline);
      for (const auto& spec : {mlp(), p == 8 ? blocks8() : blocks()})
        for (int m : {1, 2, 4, 8}) {
          testing::PipelineRun run;
          run.model = spec;
          run.microbatches = m;
          std::ostringstream repro;
          repro << run;
          EXPECT_EQ(testing::check_against_serial(run), "") << repro.str();
          ++runs;
        }
    }
  EXPECT_EQ(runs, 16 * static_cast<int>(partition_counts().size()));
}

// Explicit split points, uneven stages (one stage of one layer).
TEST(Pipeline, ExplicitSplitPoints) {
  torch::set_num_threads(1);
  for (int p : partition_counts()) {
    if (p == 1) continue;
    init(p, "interleaved");
    testing::PipelineRun run;
    run.model = p == 8 ? mlp() : blocks();
    run.microbatches = 4;
    run.split_points = p == 2   ? std::vector<int>{1}
                       : p == 4 ? std::vector<int>{1, 2, 5}
                                : std::vector<int>{1, 2, 5, 6, 7, 9, 10};
    smp::PipelineStats stats;
    EXPECT_EQ(testing::check_against_serial(run, 1e-10, &stats), "") << run;
    EXPECT_EQ(stats.forwards, 4);
    EXPECT_EQ(stats.backwards, 4);
  }
}

// Item 4: the counter of live activations. 1F1B holds at most mp_size
// microbatches on the first stage (stages - s on stage s), GPipe all of them;
// ZB-H1 (issue 31) mp_size on every stage.
TEST(Pipeline, LiveActivationsPerSchedule) {
  torch::set_num_threads(1);
  for (int p : partition_counts())
    for (const char* pipeline : {"simple", "interleaved", "zero_bubble"}) {
      init(p, pipeline);
      testing::PipelineRun run;
      run.model = mlp();
      run.microbatches = 8;
      run.steps = 1;
      smp::PipelineStats stats;
      ASSERT_EQ(testing::check_against_serial(run, 1e-10, &stats), "");
      const int s = smp::mp_rank();
      // ZB-H1 keeps a graph alive until its W: min(p, m) on every stage.
      const std::string name = pipeline;
      const int expected = name == "simple" ? 8 : name == "zero_bubble" ? std::min(p, 8) : std::min(p - s, 8);
      EXPECT_EQ(stats.peak_live, expected) << pipeline << " stage " << s << " of " << p;
      if (std::string(pipeline) == "interleaved" && s == 0) EXPECT_LE(stats.peak_live, p);
      EXPECT_EQ(stats.live, 0);
      EXPECT_EQ(stats.live_bytes, 0);
      EXPECT_GT(stats.peak_bytes, 0);
    }
}

// The losses every stage gets back are the last stage's, per microbatch.
TEST(Pipeline, EveryStageReturnsTheLastStagesOutputs) {
  torch::set_num_threads(1);
  for (int p : partition_counts()) {
    init(p, "simple");
    torch::nn::Sequential net = testing::build_model(mlp());
    torch::nn::Sequential ref = testing::build_model(mlp());
    smp::DistributedModel model(net);
    smp::StepOptions o;
    o.microbatches(4);
    auto eval = smp::step([&](at::Tensor x) { return model(x); }, o);  // forward only
    torch::manual_seed(5);
    const at::Tensor x = torch::randn({8, 6}, torch::kDouble);
    const smp::StepOutput out = eval(x);
    ASSERT_EQ(out.outputs().size(), 4u);
    const at::Tensor expected = ref->forward(x).detach();
    EXPECT_LE((out.concat() - expected).abs().max().item<double>(), 1e-12);
    EXPECT_GT(expected.abs().max().item<double>(), 0);
    EXPECT_EQ(model.stats().backwards, 0);
  }
}

// --- issue 31: schedules as data, run by the executor ------------------------------

// ZB-H1 (each backward split into I and W) trains as one process, and its
// weight gradients are the full backward's (1F1B's), bit for bit.
TEST(Pipeline, ZeroBubbleEqualsOneProcessAndTheFullBackward) {
  torch::set_num_threads(1);
  for (int p : partition_counts()) {
    init(p, "zero_bubble");
    for (const auto& spec : {mlp(), p == 8 ? blocks8() : blocks()})
      for (int m : {1, 4}) {
        testing::PipelineRun run;
        run.model = spec;
        run.microbatches = m;
        run.steps = 2;
        smp::PipelineStats stats;
        EXPECT_EQ(testing::check_against_serial(run, 1e-10, &stats), "") << run;
        EXPECT_EQ(stats.backwards, m);
        // A real W: the Linear layers' weight and bias gradients come from
        // what I left, without autograd; only a stage with blocks (LayerNorm
        // and Linear inside a registered type) runs autograd in W, once per
        // microbatch. The layers: an MLP's Linear at even indices; the
        // blocks' stack is Linear, blocks, Linear.
        torch::nn::Sequential net = testing::build_model(spec);
        std::vector<int64_t> params;
        for (const auto& layer : *net) {
          int64_t c = 0;
          for (const auto& t : layer.ptr()->parameters()) c += t.numel();
          params.push_back(c);
        }
        const auto bounds = smp::balance_by_parameters(params, p);
        const int r = smp::mp_rank(), n = static_cast<int>(params.size());
        int linear = 0, other = 0;
        for (int i = bounds[r]; i < bounds[r + 1]; ++i) {
          const bool is_linear = spec.blocks ? (i == 0 || i == n - 1) : i % 2 == 0;
          (is_linear ? linear : other) += 1;
        }
        EXPECT_EQ(stats.weight_gradients_split, 2 * linear * m) << run << " stage " << r;
        EXPECT_EQ(stats.weight_autograd_passes, spec.blocks && other > 0 ? m : 0) << run << " stage " << r;
      }
    // Bit for bit: ZB-H1's weight gradients (I, then W from saved tensors or
    // autograd restricted to the parameters) are 1F1B's (the full backward).
    for (const auto& spec : {mlp(), p == 8 ? blocks8() : blocks()}) {
      std::vector<at::Tensor> grads[2];
      int i = 0;
      for (const char* pipeline : {"interleaved", "zero_bubble"}) {
        init(p, pipeline);
        torch::nn::Sequential net = testing::build_model(spec);
        smp::DistributedModel model(net);
        auto train = testing::mse_step(model, 4);
        torch::manual_seed(11);
        const int64_t out = spec.widths.back();
        const at::Tensor x = torch::randn({8, 6}, torch::kDouble), y = torch::randn({8, out}, torch::kDouble);
        train(x, y);
        for (const auto& param : model.parameters()) grads[i].push_back(param.grad().clone());
        ++i;
      }
      ASSERT_EQ(grads[0].size(), grads[1].size());
      double norm = 0;
      for (size_t k = 0; k < grads[0].size(); ++k) {
        EXPECT_TRUE(torch::equal(grads[0][k], grads[1][k]))
            << "parameter " << k << " at " << p << " stages, " << (spec.blocks ? "blocks" : "mlp");
        norm += grads[0][k].abs().sum().item<double>();
      }
      if (!grads[0].empty()) EXPECT_GT(norm, 0);
    }
  }
}

// A Linear layer whose weight is tied to another module's on its stage (an
// output head sharing an embedding's table) takes the same gradients under
// ZB-H1 as under 1F1B: W takes the tied weight by autograd for the
// embedding's use as well as from what I left for the head's.
TEST(Pipeline, ZeroBubbleTiedWeightTakesEveryUsesGradient) {
  torch::set_num_threads(1);
  std::vector<at::Tensor> grads[2];
  int64_t split = 0;
  int i = 0;
  for (const char* pipeline : {"interleaved", "zero_bubble"}) {
    init(1, pipeline);
    torch::manual_seed(5);
    torch::nn::Linear head(4, 10);
    head->to(at::kDouble);
    torch::nn::Embedding emb(torch::nn::EmbeddingOptions(10, 4)._weight(head->weight));  // the same tensor
    ASSERT_TRUE(emb->weight.is_same(head->weight));
    smp::DistributedModel model(torch::nn::Sequential(emb, head));
    smp::StepOptions o;
    o.microbatches(2);
    const at::Tensor x = at::randint(10, {8}, at::kLong), y = at::randint(10, {8}, at::kLong);
    smp::step(
        [&](at::Tensor xb, at::Tensor yb) {
          at::Tensor loss = torch::nn::functional::cross_entropy(model(xb), yb);
          model.backward(loss);
          return loss;
        },
        o)(x, y);
    for (const auto& p : model.parameters()) grads[i].push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    if (i == 1) split = model.stats().weight_gradients_split;
    ++i;
  }
  EXPECT_GT(split, 0) << "the head's W was not split";
  ASSERT_EQ(grads[0].size(), grads[1].size());
  EXPECT_EQ(grads[0].size(), 3u);  // the tied table under both names, the head's bias
  for (size_t k = 0; k < grads[0].size(); ++k) {
    ASSERT_TRUE(grads[0][k].defined()) << "parameter " << k << " under 1F1B";
    EXPECT_TRUE(grads[1][k].defined()) << "parameter " << k << " has no gradient under ZB-H1";
    if (grads[1][k].defined())
      EXPECT_TRUE(at::allclose(grads[1][k], grads[0][k], 1e-12, 1e-12))
          << "parameter " << k << ": " << grads[1][k] << " under ZB-H1 against " << grads[0][k];
  }
}

// An evaluation step under torch::NoGradGuard (docs/pipeline.md, "Forward
// only"): every stage returns the losses a forward-only step with grad mode
// on returns, under every schedule (zero_bubble's split Linear layers
// record nothing there either), and no gradient appears.
TEST(Pipeline, EvaluationUnderNoGradGuard) {
  torch::set_num_threads(1);
  const int n = mpi::world_size();
  for (const char* pipeline : {"simple", "interleaved", "zero_bubble"}) {
    init(n, pipeline);
    smp::DistributedModel model(testing::build_model(mlp()));
    smp::StepOptions o;
    o.microbatches(4);
    torch::manual_seed(21);
    const at::Tensor x = torch::randn({8, 6}, torch::kDouble), y = torch::randn({8, 4}, torch::kDouble);
    const auto evaluate = [&](bool grad) {
      return smp::step(
          [&](at::Tensor xb, at::Tensor yb) {
            std::optional<torch::NoGradGuard> off;
            if (!grad) off.emplace();
            return torch::mse_loss(model(xb), yb);
          },
          o)(x, y);
    };
    const at::Tensor with_grad = at::stack(evaluate(true).outputs()).detach();
    std::string error;
    at::Tensor without;
    try {
      without = at::stack(evaluate(false).outputs());
    } catch (const std::exception& e) {
      error = e.what();
    }
    EXPECT_EQ(error, "") << pipeline << " on world rank " << mpi::world_rank();
    if (error.empty()) {
      EXPECT_TRUE(torch::equal(without, with_grad)) << pipeline << ": " << without << " against " << with_grad;
      EXPECT_FALSE(without.requires_grad()) << pipeline;
    }
    for (const auto& p : model.parameters()) EXPECT_FALSE(p.grad().defined()) << pipeline;
  }
}

// A schedule of the user's own, read from torch.distributed.pipelining's
// CSV format, runs; a bad one raises the same ScheduleError on every rank,
// from the verifier, before the first message: the next step trains.
TEST(Pipeline, UserSchedulesAreVerifiedBeforeTheFirstMessage) {
  torch::set_num_threads(1);
  struct Reset {
    ~Reset() { smp::set_schedule(std::nullopt); }
  } reset;
  for (int p : partition_counts()) {
    if (p == 1) continue;
    init(p, "interleaved");
    testing::PipelineRun run;
    run.model = mlp();
    run.microbatches = 4;
    run.steps = 2;
    smp::set_schedule(smp::schedule_from_csv(smp::to_csv(smp::zb_h1(p, 4)), 4));
    EXPECT_EQ(testing::check_against_serial(run), "") << run;
    // A cycle: stage 0 waits for microbatch 0's gradient before sending
    // microbatch 1, which the last stage needs before its backward of 0.
    smp::Schedule cycle = smp::gpipe(p, 2);
    cycle.actions[0] = {{smp::ActionKind::kForward, 0, 0}, {smp::ActionKind::kFullBackward, 0, 0},
                        {smp::ActionKind::kForward, 0, 1}, {smp::ActionKind::kFullBackward, 0, 1}};
    smp::set_schedule(cycle);
    torch::nn::Sequential net = testing::build_model(mlp());
    smp::DistributedModel model(net);
    auto train = testing::mse_step(model, 2);
    const at::Tensor x = torch::randn({4, 6}, torch::kDouble), y = torch::randn({4, 4}, torch::kDouble);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_CONTAINS(raised<smp::ScheduleError>([&] { train(x, y); }),
                    "rank 0, 0RECV_B0 (the message before action 1, 0B0): the schedule deadlocks");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
    // Written for 2 microbatches, given 4.
    auto train4 = testing::mse_step(model, 4);
    EXPECT_CONTAINS(raised<smp::ScheduleError>([&] { train4(torch::randn({4, 6}, torch::kDouble), torch::randn({4, 4}, torch::kDouble)); }),
                    "is for 2 microbatches, the step has 4");
    // A W before its I, on the last stage only: every rank raises.
    smp::Schedule early = smp::zb_h1(p, 2);
    early.actions[p - 1] = {{smp::ActionKind::kForward, p - 1, 0}, {smp::ActionKind::kBackwardWeight, p - 1, 0},
                            {smp::ActionKind::kBackwardInput, p - 1, 0}, {smp::ActionKind::kForward, p - 1, 1},
                            {smp::ActionKind::kBackwardInput, p - 1, 1}, {smp::ActionKind::kBackwardWeight, p - 1, 1}};
    smp::set_schedule(early);
    EXPECT_CONTAINS(raised<smp::ScheduleError>([&] { train(x, y); }),
                    "rank " + std::to_string(p - 1) + ", action 1 (" + std::to_string(p - 1) + "W0): a W before its I");
    smp::set_schedule(std::nullopt);
    EXPECT_EQ(testing::check_against_serial(run), "") << run;
  }
}

// --- issue 31: virtual stages (Megatron's interleaved 1F1B) -------------------------

void init_virtual(int partitions, int v) {
  smp::Config cfg;
  cfg.partitions(partitions);
  cfg.pipeline("interleaved_virtual");
  cfg.virtual_pipeline_model_parallel_size(v);
  smp::init(cfg);
}

// 9 Linear and 8 ReLU: 17 layers, enough for 8 ranks x 2 chunks; output
// width 4 (a power of two: the mean's division is exact).
testing::ModelSpec integer_mlp() { return {false, {4, 6, 4, 6, 4, 6, 4, 6, 4, 4}, 5, true}; }

// The model split into p * v chunks, rank r holding chunks r, r + p, ...,
// run in Megatron's interleaved order: equal to one process on the whole
// batch, bit for bit with integer-valued data (tolerance 0, one SGD step)
// and within 1e-10 with the float blocks (2 steps), at every partition count with its replicas
// (at 4 ranks: 4 stages alone and 2 stages x 2 replicas; at 8: also 8 x 1
// and 2 x 4); each rank runs v forwards and backwards per microbatch and
// holds at most Megatron's warm-up + 1 activations.
TEST(Pipeline, VirtualStagesEqualOneProcess) {
  torch::set_num_threads(1);
  int runs = 0;
  for (int p : partition_counts()) {
    if (p == 1) continue;
    for (int v : {2, 3}) {
      if (p * v > 17) continue;  // 8 ranks x 3 chunks needs 24 layers
      init_virtual(p, v);
      for (int m : {p, 2 * p}) {
        testing::PipelineRun run;
        run.model = integer_mlp();
        run.microbatches = m;
        run.batch = 16;
        // One step: its gradients, and the parameters after the SGD update
        // (lr a power of two), are exact; a second step's products of those
        // parameters need more than float64's 53 bits.
        run.steps = 1;
        run.lr = 1.0 / 64;
        smp::PipelineStats stats;
        EXPECT_EQ(testing::check_against_serial(run, 0.0, &stats), "") << run;
        const int r = smp::mp_rank();
        EXPECT_EQ(stats.forwards, v * m) << run;
        EXPECT_EQ(stats.backwards, v * m) << run;
        EXPECT_EQ(stats.peak_live, std::min((p - r - 1) * 2 + (v - 1) * p + 1, v * m)) << run << " rank " << r;
        EXPECT_EQ(stats.live, 0);
        ++runs;
      }
      if (p * v <= 8) {  // float blocks (8 layers), 1e-10, explicit split points too
        testing::PipelineRun run;
        run.model = blocks8();
        run.microbatches = p;
        run.steps = 2;
        EXPECT_EQ(testing::check_against_serial(run), "") << run;
        if (p * v == 4) run.split_points = {1, 2, 6};
        EXPECT_EQ(testing::check_against_serial(run), "") << run;
        runs += 2;
      }
    }
  }
  int expected = 0;
  for (int p : partition_counts())
    for (int v : {2, 3})
      if (p > 1 && p * v <= 17) expected += 2 + (p * v <= 8 ? 2 : 0);
  EXPECT_EQ(runs, expected);
  if (mpi::world_size() > 1) EXPECT_GT(runs, 0);
}

// What a rank holds: its chunks' stages and their parameters, named as in
// the whole model.
TEST(Pipeline, VirtualStagesHoldEveryPthChunk) {
  const int n = mpi::world_size();
  if (n == 1) GTEST_SKIP() << "needs 2+ ranks (one rank runs the whole model as one stage)";
  init_virtual(2, 2);
  smp::DistributedModel model(testing::build_model(integer_mlp()), {4, 8, 12});
  const int r = smp::mp_rank();
  EXPECT_EQ(model.virtual_stages(), 2);
  EXPECT_EQ(model.local_stages(), (std::vector<int>{r, r + 2}));
  EXPECT_EQ(model.bounds(), (std::vector<int>{0, 4, 8, 12, 17}));
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) names.push_back(name);
  // Linear layers sit at even indices: rank 0 holds layers 0-3 and 8-11,
  // rank 1 layers 4-7 and 12-16.
  const std::vector<std::string> expected =
      r == 0 ? std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "8.weight", "8.bias", "10.weight", "10.bias"}
             : std::vector<std::string>{"4.weight", "4.bias", "6.weight", "6.bias", "12.weight", "12.bias", "14.weight",
                                        "14.bias", "16.weight", "16.bias"};
  EXPECT_EQ(names, expected);
}

// After an error: the integer MLP trains at p ranks with v = 2, equal to one
// process bit for bit.
void expect_virtual_stages_train(int p) {
  testing::PipelineRun run;
  run.model = integer_mlp();
  run.microbatches = p;
  run.batch = 16;
  run.steps = 1;
  EXPECT_EQ(testing::check_against_serial(run, 0.0), "") << run;
}

// Issue 31 item 6: v that the model's layers cannot hold (fewer layers than
// p * v stages), v without the interleaved_virtual pipeline, and a
// microbatch count Megatron's order cannot take raise a clear error on every
// rank, at once.
TEST(PipelineErrors, VirtualStagesTheModelOrScheduleCannotTake) {
  const int n = mpi::world_size();
  if (n == 1) GTEST_SKIP() << "needs 2+ ranks";
  torch::set_num_threads(1);
  for (int p : partition_counts()) {
    if (p == 1) continue;
    init_virtual(p, 2);
    const auto t0 = std::chrono::steady_clock::now();
    // Linear, GELU, Linear: 3 layers for 2p stages.
    torch::nn::Sequential net = testing::build_model({false, {6, 5, 4}, 3});
    EXPECT_CONTAINS(raised<smp::UsageError>([&] { smp::DistributedModel m(net); }),
                    "virtual_pipeline_model_parallel_size 2 on " + std::to_string(p) + " pipeline ranks needs " +
                        std::to_string(2 * p) + " stages of at least one layer, and the model has 3 layers");
    std::vector<int> points(2 * p - 1, 1);
    EXPECT_CONTAINS(raised<smp::UsageError>([&] { smp::DistributedModel m(net, points); }), "the model has 3 layers");
    // Microbatches not a multiple of the ranks.
    smp::DistributedModel model(testing::build_model(integer_mlp()));
    auto train = testing::mse_step(model, p + 1);
    const int64_t rows = 2 * (p + 1);
    EXPECT_CONTAINS(raised<smp::ScheduleError>([&] {
                      train(torch::randn({rows, 4}, torch::kDouble), torch::randn({rows, 4}, torch::kDouble));
                    }),
                    "interleaved_1f1b cannot take " + std::to_string(p + 1) + " microbatches on " +
                        std::to_string(p) + " ranks");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    // The next step trains.
    expect_virtual_stages_train(p);
  }
  // v > 1 with a schedule that has no virtual stages.
  smp::Config cfg;
  cfg.partitions(2);
  cfg.virtual_pipeline_model_parallel_size(2);
  EXPECT_CONTAINS(raised<smp::ConfigError>([&] { smp::init(cfg); }),
                  "virtual_pipeline_model_parallel_size 2 needs the pipeline \"interleaved_virtual\"");
}

// --- a model that is not a Sequential: its children, in order --------------------

struct ResidualImpl : torch::nn::Module {
  explicit ResidualImpl(int64_t w) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({w})));
    up = register_module("up", torch::nn::Linear(w, 2 * w));
    down = register_module("down", torch::nn::Linear(2 * w, w));
  }
  at::Tensor forward(at::Tensor x) { return x + down(torch::gelu(up(norm(x)))); }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(Residual);

// A user module whose forward is the chain of its eight children, in the
// order it registers them: built-in layers, a registered user type, a
// nested Sequential.
struct ChainNetImpl : torch::nn::Module {
  ChainNetImpl() {
    input = register_module("input", torch::nn::Linear(6, 8));
    act = register_module("act", torch::nn::GELU());
    block1 = register_module("block1", Residual(8));
    block2 = register_module("block2", Residual(8));
    block3 = register_module("block3", Residual(8));
    head = register_module("head", torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::Tanh()));
    drop = register_module("drop", torch::nn::Dropout(0.0));
    output = register_module("output", torch::nn::Linear(8, 4));
  }
  at::Tensor forward(at::Tensor x) {
    return output(drop(head->forward(block3(block2(block1(act(input(x))))))));
  }
  torch::nn::Linear input{nullptr}, output{nullptr};
  torch::nn::GELU act{nullptr};
  Residual block1{nullptr}, block2{nullptr}, block3{nullptr};
  torch::nn::Sequential head{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(ChainNet);

ChainNet chain_net() {
  torch::manual_seed(21);
  ChainNet net;
  net->to(torch::kDouble);
  return net;
}

void register_residual_once() {
  static bool done = [] {
    smp::register_layer<ResidualImpl>();
    return true;
  }();
  (void)done;
}

// The central check for a module exposing an ordered list of children:
// loss, every gradient of every stage (by the module's own parameter names)
// and, after 3 SGD steps, every parameter equal to the module run on one
// process, in float64. Every replica gets the same batch (the dp average of
// equal gradients is the gradient).
TEST(Pipeline, ModuleWithOrderedChildren) {
  torch::set_num_threads(1);
  register_residual_once();
  for (int p : partition_counts())
    for (const char* pipeline : {"simple", "interleaved"}) {
      init(p, pipeline);
      for (int m : {1, 4}) {
        const std::string context = std::string(pipeline) + ", " + std::to_string(p) + " stages, " +
                                    std::to_string(m) + " microbatches";
        ChainNet net = chain_net(), ref = chain_net();
        smp::DistributedModel model(net);
        const auto mine = model.named_parameters();
        // The stages' parameters are the module's, each on one stage.
        int64_t count = 0;
        for (int64_t c : smp::allgather(static_cast<int64_t>(mine.size()), smp::MP_GROUP)) count += c;
        EXPECT_EQ(count, static_cast<int64_t>(ref->named_parameters().size())) << context;
        torch::optim::SGD opt(model.parameters(), 0.05), ref_opt(ref->parameters(), 0.05);
        auto train = testing::mse_step(model, m);
        for (int step = 0; step < 3; ++step) {
          torch::manual_seed(100 + step);
          const at::Tensor x = torch::randn({8, 6}, torch::kDouble), y = torch::randn({8, 4}, torch::kDouble);
          const double loss = train(x, y).reduce_mean().item<double>();
          at::Tensor ref_loss = torch::mse_loss(ref->forward(x), y);
          ref_loss.backward();
          EXPECT_NEAR(loss, ref_loss.item<double>(), 1e-10) << context << ", step " << step;
          const auto ref_params = ref->named_parameters();
          for (const auto& [name, param] : mine) {
            const at::Tensor* r = ref_params.find(name);
            ASSERT_NE(r, nullptr) << name;
            ASSERT_TRUE(param.grad().defined()) << context << ": " << name;
            EXPECT_LE((param.grad() - r->grad()).abs().max().item<double>(), 1e-10) << context << ": " << name;
            EXPECT_GT(r->grad().abs().max().item<double>(), 0) << name;
          }
          opt.step();
          opt.zero_grad();
          ref_opt.step();
          ref_opt.zero_grad();
        }
        const auto ref_params = ref->named_parameters();
        for (const auto& [name, param] : mine)
          EXPECT_LE((param - *ref_params.find(name)).abs().max().item<double>(), 1e-10) << context << ": " << name;
      }
    }
}

// A layer with a parameter its forward never uses: one process leaves its
// gradient undefined, and LibTorch's optimizers skip it.
struct WithSpareImpl : torch::nn::Module {
  explicit WithSpareImpl(int64_t w) {
    scale = register_parameter("scale", torch::linspace(0.5, 1.5, w));
    spare = register_parameter("spare", torch::ones({w}));
  }
  at::Tensor forward(at::Tensor x) { return x * scale; }
  at::Tensor scale, spare;
};
TORCH_MODULE(WithSpare);

// Two Adam steps of a `First` layer followed by Linear layers (at least one
// layer per stage) under every partition count, against one process on the
// same 16 rows per step (2 microbatches on each of up to 8 replicas), each
// replica training its own rows (smp's data parallelism): every gradient's
// definedness and value after each step, and every parameter after the
// last, equal one process's. `x` gives a step's rows; `before` checks the
// one-process model after its backward.
template <typename First>
void expect_adam_equals_one_process(uint64_t seed, const std::function<at::Tensor(int)>& x,
                                    const std::function<void(torch::nn::Sequential&)>& before = {}) {
  torch::set_num_threads(1);
  for (int p : partition_counts()) {
    init(p, "simple");
    const std::string context = std::to_string(p) + " stages, " + std::to_string(smp::dp_size()) + " replicas";
    auto make = [p, seed] {
      torch::manual_seed(seed);
      torch::nn::Sequential net(First(6), torch::nn::Linear(6, 6));
      for (int i = 3; i < p; ++i) net->push_back(torch::nn::Linear(6, 6));
      net->push_back(torch::nn::Linear(6, 4));
      net->to(torch::kDouble);
      return net;
    };
    torch::nn::Sequential net = make(), ref = make();
    smp::DistributedModel model(net);
    torch::optim::Adam opt(model.parameters(), 0.01), ref_opt(ref->parameters(), 0.01);
    auto train = testing::mse_step(model, 2);
    for (int step = 0; step < 2; ++step) {
      torch::manual_seed(seed * 100 + step);
      const at::Tensor xs = x(step), y = torch::randn({16, 4}, torch::kDouble);
      const int64_t rows = 16 / smp::dp_size(), first = smp::dp_rank() * rows;
      train(xs.narrow(0, first, rows), y.narrow(0, first, rows));
      torch::mse_loss(ref->forward(xs), y).backward();
      if (before) before(ref);
      const auto ref_params = ref->named_parameters();
      for (const auto& [name, param] : model.named_parameters()) {
        const at::Tensor* r = ref_params.find(name);
        ASSERT_NE(r, nullptr) << name;
        // (EXPECT, not ASSERT: every rank goes on to the same collectives.)
        EXPECT_EQ(param.grad().defined(), r->grad().defined())
            << context << ", step " << step << ", rank " << smp::rank() << ": " << name;
        if (param.grad().defined() && r->grad().defined())
          EXPECT_LE((param.grad() - r->grad()).abs().max().template item<double>(), 1e-10)
              << context << ", step " << step << ", rank " << smp::rank() << ": " << name;
      }
      opt.step();
      opt.zero_grad();
      ref_opt.step();
      ref_opt.zero_grad();
    }
    const auto ref_params = ref->named_parameters();
    for (const auto& [name, param] : model.named_parameters())
      EXPECT_LE((param - *ref_params.find(name)).abs().max().template item<double>(), 1e-10) << context << ": " << name;
  }
}

// The dp average leaves a gradient undefined where every replica's is (a
// parameter the step did not use), as one process does.
TEST(Pipeline, UnusedParameterKeepsNoGradientOnEveryReplica) {
  static const bool registered = [] {
    smp::register_layer<WithSpareImpl>();
    return true;
  }();
  (void)registered;
  expect_adam_equals_one_process<WithSpare>(5, [](int) { return torch::randn({16, 6}, torch::kDouble); });
}

// A parameter only the rows with a first feature above 2 use: a replica
// whose rows have none leaves its gradient undefined.
struct RowSpareImpl : torch::nn::Module {
  explicit RowSpareImpl(int64_t w) {
    scale = register_parameter("scale", torch::linspace(0.5, 1.5, w));
    spare = register_parameter("spare", torch::linspace(-1.0, 1.0, w));
  }
  at::Tensor forward(at::Tensor x) {
    const at::Tensor rows = x.select(1, 0).gt(2.0);
    at::Tensor y = x * scale;
    if (rows.any().item<bool>()) y = y + rows.unsqueeze(1).to(x.scalar_type()) * spare;
    return y;
  }
  at::Tensor scale, spare;
};
TORCH_MODULE(RowSpare);

// Where only some replicas used a parameter, the others count as zero in
// the average (docs/3d.md): only the last replica's rows reach `spare`.
TEST(Pipeline, ParameterUsedOnOneReplicaAveragesWithZeros) {
  static const bool registered = [] {
    smp::register_layer<RowSpareImpl>();
    return true;
  }();
  (void)registered;
  expect_adam_equals_one_process<RowSpare>(
      6,
      [](int) {
        at::Tensor x = torch::randn({16, 6}, torch::kDouble).clamp(-1.0, 1.0);
        x[15][0] = 3.0;  // the last row only, on the last replica
        return x;
      },
      [](torch::nn::Sequential& ref) {
        const auto params = ref->named_parameters();
        const at::Tensor* spare = params.find("0.spare");
        ASSERT_TRUE(spare && spare->grad().defined()) << "one process uses 0.spare";
      });
}

// A child the pipeline cannot call (a type nobody registered), or
// parameters of the module's own: UsageError on every rank.
struct UnknownLayerImpl : torch::nn::Module {
  at::Tensor forward(at::Tensor x) { return x * 2; }
};
TORCH_MODULE(UnknownLayer);

struct WithUnknownImpl : torch::nn::Module {
  WithUnknownImpl() {
    register_module("first", torch::nn::Linear(3, 3));
    register_module("odd", UnknownLayer());
    register_module("last", torch::nn::Linear(3, 3));
  }
};
TORCH_MODULE(WithUnknown);

struct WithOwnParameterImpl : torch::nn::Module {
  WithOwnParameterImpl() {
    register_module("first", torch::nn::Linear(3, 3));
    register_parameter("scale", torch::ones({3}));
    register_module("last", torch::nn::Linear(3, 3));
  }
};
TORCH_MODULE(WithOwnParameter);

TEST(PipelineErrors, ModuleTheStagesCannotRun) {
  init(mpi::world_size() % 2 == 0 ? 2 : 1, "interleaved");
  const std::string unknown = raised<smp::UsageError>([] { smp::DistributedModel m(WithUnknown{}); });
  EXPECT_CONTAINS(unknown, "child 1 ('odd', a ");
  EXPECT_CONTAINS(unknown, "UnknownLayerImpl) is not a layer the pipeline can call");
  EXPECT_CONTAINS(unknown, "smp::register_layer<T>()");
  EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::DistributedModel m(WithOwnParameter{}); }),
                  "has parameters of its own ('scale'), outside its children");
}

// --- errors: on every rank, never a hang -------------------------------------------

TEST(PipelineErrors, FewerLayersThanStages) {
  const int n = mpi::world_size();
  if (n == 1) GTEST_SKIP() << "needs 2+ ranks (one stage always has a layer)";
  init(n, "interleaved");
  torch::nn::Sequential net(torch::nn::Linear(3, 3));
  EXPECT_CONTAINS(raised<smp::UsageError>([&] { smp::DistributedModel m(net); }),
                  "has 1 layers, fewer than the " + std::to_string(n) + " pipeline stages");
  // Explicit split points cannot get round it either.
  std::vector<int> points(n - 1, 1);
  EXPECT_CONTAINS(raised<smp::UsageError>([&] { smp::DistributedModel m(net, points); }), "fewer than the");
}

TEST(PipelineErrors, BadSplitPoints) {
  const int n = mpi::world_size();
  if (n == 1) GTEST_SKIP() << "needs 2+ ranks";
  init(2, "simple");
  EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::DistributedModel m(testing::build_model(mlp()), {0}); }),
                  "split points must increase");
  EXPECT_CONTAINS(raised<smp::UsageError>([] { smp::DistributedModel m(testing::build_model(mlp()), {3, 5}); }),
                  "2 split points for 2 stages");
}

TEST(PipelineErrors, ReturnValueMustDependOnTheModelOutput) {
  for (int p : partition_counts()) {
    init(p, "interleaved");
    smp::DistributedModel model(testing::build_model(mlp()));
    smp::StepOptions o;
    o.microbatches(2);
    auto bad = smp::step(
        [&](at::Tensor x, at::Tensor y) {
          at::Tensor loss = torch::mse_loss(model(x), y);
          model.backward(loss);
          return (x * 2).sum();  // not the loss
        },
        o);
    const at::Tensor x = torch::randn({4, 6}, torch::kDouble), y = torch::randn({4, 4}, torch::kDouble);
    EXPECT_CONTAINS(raised<smp::UsageError>([&] { bad(x, y); }),
                    "return value does not depend on the output of the smp::DistributedModel");
    // A loss that does not depend on the output cannot be backpropagated.
    auto bad_loss = smp::step(
        [&](at::Tensor x, at::Tensor y) {
          at::Tensor out = model(x);
          model.backward((x * 3).sum());
          return out;
        },
        o);
    EXPECT_CONTAINS(raised<smp::UsageError>([&] { bad_loss(x, y); }), "the loss does not depend on the model's output");
    // The model outside a step.
    EXPECT_CONTAINS(raised<smp::UsageError>([&] { model(x); }), "inside an smp::step");
    // The same model still trains afterwards (nothing left behind).
    auto good = testing::mse_step(model, 2);
    EXPECT_GT(good(x, y).reduce_mean().item<double>(), 0);
  }
}

TEST(PipelineErrors, MismatchedMicrobatchShapes) {
  const int n = mpi::world_size();
  if (n == 1) GTEST_SKIP() << "needs 2+ ranks (one stage sees one batch)";
  init(n, "simple");
  smp::DistributedModel model(testing::build_model(mlp()));
  auto train = testing::mse_step(model, 2);
  // The last stage's data loader gives it a batch of 6, the others 4.
  const int64_t b = smp::mp_rank() == n - 1 ? 6 : 4;
  const at::Tensor x = torch::randn({b, 6}, torch::kDouble), y = torch::randn({b, 4}, torch::kDouble);
  const std::string text = raised<smp::UsageError>([&] { train(x, y); });
  EXPECT_CONTAINS(text, "mismatched microbatch shapes");
  EXPECT_CONTAINS(text, "stage 0: microbatches 2, split arguments 0:[4, 6] Double 1:[4, 4] Double");
  EXPECT_CONTAINS(text, "stage " + std::to_string(n - 1) + ": microbatches 2, split arguments 0:[6, 6] Double");
  // Different microbatch counts on the stages are caught the same way.
  auto train2 = testing::mse_step(model, smp::mp_rank() == 0 ? 4 : 2);
  const at::Tensor x4 = torch::randn({4, 6}, torch::kDouble), y4 = torch::randn({4, 4}, torch::kDouble);
  EXPECT_CONTAINS(raised<smp::UsageError>([&] { train2(x4, y4); }), "mismatched microbatch shapes");
}

TEST(PipelineErrors, MisuseInsideTheStep) {
  for (int p : partition_counts()) {
    init(p, "interleaved");
    smp::DistributedModel model(testing::build_model(mlp()));
    smp::StepOptions o;
    o.microbatches(2);
    const at::Tensor x = torch::randn({4, 6}, torch::kDouble), y = torch::randn({4, 4}, torch::kDouble);
    auto twice = smp::step(
        [&](at::Tensor x, at::Tensor y) {
          at::Tensor loss = torch::mse_loss(model(x), y);
          model.backward(loss);
          model.backward(loss);
          return loss;
        },
        o);
    EXPECT_CONTAINS(raised<smp::UsageError>([&] { twice(x, y); }), "called twice in one microbatch");
    auto only_first = smp::step(
        [&](at::Tensor x, at::Tensor y) {
          at::Tensor loss = torch::mse_loss(model(x), y);
          if (smp::microbatch() == 0) model.backward(loss);
          return loss;
        },
        o);
    EXPECT_CONTAINS(raised<smp::UsageError>([&] { only_first(x, y); }),
                    "did not call model.backward in this microbatch");
  }
}

}  // namespace
}  // namespace partita::spec

namespace partita::spec {
namespace {

// --- a stage that fails: every rank raises, promptly ---------------------------

// How long a failure may take to reach every rank: a quarter of the
// deadline (10 s at 4 ranks on 2 cores), where a rank left waiting would
// take the whole deadline.
double prompt_seconds() {
  const double d = mpi::deadline();
  return d > 0 ? d / 4 : 2.5;
}

using Clock = std::chrono::steady_clock;

// Runs f (a step that fails on some rank) and returns the exception's
// class and message; every rank ends it within prompt_seconds() of its
// start, or fails the test.
struct Outcome {
  std::string kind;  // "planted", "usage", "pipeline", "other: <type>", "none"
  std::string text;
};
struct PlantedFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
template <typename F>
Outcome outcome_of(F&& f) {
  Outcome o{"none", ""};
  const auto t0 = Clock::now();
  try {
    f();
  } catch (const PlantedFailure& e) {
    o = {"planted", e.what()};
  } catch (const smp::UsageError& e) {
    o = {"usage", e.what()};
  } catch (const smp::PipelineError& e) {
    o = {"pipeline", e.what()};
  } catch (const std::exception& e) {
    o = {std::string("other: ") + typeid(e).name(), e.what()};
  }
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(took, prompt_seconds()) << "the failure took " << took << " s to reach world rank " << smp::rank();
  return o;
}

std::string stage_name(int stage, int world_rank) {
  return "stage " + std::to_string(stage) + " of " + std::to_string(smp::mp_size()) + ", world rank " +
         std::to_string(world_rank);
}

// A layer that passes its input on and, armed on this rank, throws in the
// forward or the backward of one microbatch.
struct Trip {
  bool armed = false;
  bool in_backward = false;
  int microbatch = 1;
};
Trip g_trip;

struct TripFunction : torch::autograd::Function<TripFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext*, at::Tensor x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    if (g_trip.armed && g_trip.in_backward && smp::microbatch() == g_trip.microbatch)
      throw PlantedFailure("planted failure in a layer's backward");
    return g;
  }
};

struct TripLayerImpl : torch::nn::Module {
  at::Tensor forward(at::Tensor x) {
    if (g_trip.armed && !g_trip.in_backward && smp::microbatch() == g_trip.microbatch)
      throw PlantedFailure("planted failure in a layer's forward");
    return TripFunction::apply(x);
  }
};
TORCH_MODULE(TripLayer);

// The MLP with the tripping layer inserted before layer `at` (at == 11:
// after the last).
torch::nn::Sequential mlp_with_trip(int at) {
  torch::nn::Sequential base = testing::build_model(mlp());
  torch::nn::Sequential out;
  int i = 0;
  for (const auto& layer : *base) {
    if (i++ == at) out->push_back(TripLayer());
    out->push_back(layer);
  }
  if (at >= static_cast<int>(base->size())) out->push_back(TripLayer());
  return out;
}

// A layer throws on one stage (of the first replica), in the forward or the
// backward of microbatch 1: that rank raises the layer's error, every other
// rank an smp::PipelineError naming the stage, the phase and the error,
// well before the deadline; afterwards the pipeline trains as before.
TEST(PipelineErrors, LayerFailsOnOneStage) {
  torch::set_num_threads(1);
  int cases = 0;
  for (int p : partition_counts()) {
    if (p == 1 || mpi::world_size() == 1) continue;
    for (const char* pipeline : {"simple", "interleaved"}) {
      init(p, pipeline);
      for (bool in_backward : {false, true})
        for (int at : {1, 5, 11}) {  // (before layer 0 its backward would not run: x needs no gradient)
          smp::DistributedModel model(mlp_with_trip(at));
          int failing = 0;  // the stage holding layer `at`
          while (!(model.bounds()[failing] <= at && at < model.bounds()[failing + 1])) ++failing;
          const bool armed = smp::mp_rank() == failing && smp::dp_rank() == 0;  // of replica 0
          int failing_rank = -1;
          for (int r : smp::allgather(armed ? smp::rank() : -1, smp::WORLD)) failing_rank = std::max(failing_rank, r);
          g_trip = Trip{armed, in_backward, 1};
          auto train = testing::mse_step(model, 4);
          const at::Tensor x = torch::randn({8, 6}, torch::kDouble), y = torch::randn({8, 4}, torch::kDouble);
          const Outcome o = outcome_of([&] { train(x, y); });
          g_trip = Trip{};
          const std::string phase = std::string(in_backward ? "backward" : "forward");
          const std::string context = std::string(pipeline) + ", " + std::to_string(p) + " stages, layer " +
                                      std::to_string(at) + " fails in its " + phase;
          if (smp::rank() == failing_rank) {
            EXPECT_EQ(o.kind, "planted") << context << ": " << o.text;
            EXPECT_CONTAINS(o.text, "planted failure in a layer's " + phase);
          } else {
            EXPECT_EQ(o.kind, "pipeline") << context << ": " << o.text;
            EXPECT_CONTAINS(o.text, "smp::step: " + stage_name(failing, failing_rank) + " failed in the " + phase +
                                        " of microbatch 1: planted failure in a layer's " + phase);
            EXPECT_CONTAINS(o.text, "; this rank (" + stage_name(smp::mp_rank(), smp::rank()) + ") stops too");
          }
          ++cases;
        }
      // Nothing of the failed steps is left to match a later step's messages.
      testing::PipelineRun run;
      run.model = mlp();
      run.microbatches = 4;
      run.steps = 2;
      EXPECT_EQ(testing::check_against_serial(run), "") << pipeline << ", " << p << " stages, after the failures";
    }
  }
  if (mpi::world_size() > 1) EXPECT_GT(cases, 0);
}

// The step function itself fails on one stage: before the model in
// microbatch 0 (the others wait in the step's first exchange), or in the
// loss of microbatch 2 on the last stage (the others wait for a gradient or
// at the step's end).
TEST(PipelineErrors, StepFunctionFailsOnOneStage) {
  torch::set_num_threads(1);
  const int n = mpi::world_size();
  if (n == 1) GTEST_SKIP() << "needs 2+ ranks";
  for (const char* pipeline : {"simple", "interleaved"}) {
    init(n, pipeline);
    smp::DistributedModel model(testing::build_model(mlp()));
    for (int where : {0, 1, 2}) {
      // A step that succeeds first: every stage caches the output's shape
      // (the last stage sends it once per input shape). A failed step must
      // make every stage forget it alike, also the last stage failing
      // before it called the model (where 2), or the next step waits for a
      // shape that is never sent.
      EXPECT_GT(testing::mse_step(model, 4)(torch::randn({8, 6}, torch::kDouble), torch::randn({8, 4}, torch::kDouble))
                    .reduce_mean()
                    .item<double>(),
                0);
      const int failing = where == 0 ? (n > 2 ? 1 : 0) : n - 1;
      const int mb = where == 1 ? 2 : 0;
      smp::StepOptions o;
      o.microbatches(4);
      auto train = smp::step(
          [&](at::Tensor x, at::Tensor y) {
            const bool trip = smp::mp_rank() == failing && smp::microbatch() == mb;
            if (trip && where != 1) throw PlantedFailure("planted failure before the model");
            at::Tensor out = model(x);
            if (trip) throw PlantedFailure("planted failure in the loss");
            at::Tensor loss = torch::mse_loss(out, y);
            model.backward(loss);
            return loss;
          },
          o);
      const at::Tensor x = torch::randn({8, 6}, torch::kDouble), y = torch::randn({8, 4}, torch::kDouble);
      const Outcome got = outcome_of([&] { train(x, y); });
      const std::string what = where != 1 ? "planted failure before the model" : "planted failure in the loss";
      if (smp::mp_rank() == failing) {
        EXPECT_EQ(got.kind, "planted") << got.text;
      } else {
        EXPECT_EQ(got.kind, "pipeline") << pipeline << " " << what << ": " << got.text;
        EXPECT_CONTAINS(got.text, stage_name(failing, failing) + " failed in the forward of microbatch " +
                                      std::to_string(mb) + ": " + what);
      }
    }
    // The same model still trains.
    auto good = testing::mse_step(model, 4);
    const at::Tensor x = torch::randn({8, 6}, torch::kDouble), y = torch::randn({8, 4}, torch::kDouble);
    EXPECT_GT(good(x, y).reduce_mean().item<double>(), 0);
  }
}

// A step function that never calls the model on one rank: the stages that
// call it would wait for that rank's activations or gradients. Every rank
// raises smp::UsageError at once, naming that rank; a step without a model
// on every rank runs as before, and the model trains after both.
TEST(PipelineErrors, StepFunctionWithoutTheModel) {
  torch::set_num_threads(1);
  const int n = mpi::world_size();
  for (const char* pipeline : {"simple", "interleaved"}) {
    init(n, pipeline);
    smp::DistributedModel model(testing::build_model(mlp()));
    smp::StepOptions o;
    o.microbatches(4);
    const at::Tensor x = torch::randn({8, 6}, torch::kDouble), y = torch::randn({8, 4}, torch::kDouble);
    auto none = smp::step([&](at::Tensor x, at::Tensor) { return x.sum(); }, o);
    EXPECT_NEAR(none(x, y).reduce_sum().item<double>(), x.sum().item<double>(), 1e-12);
    if (n == 1) continue;
    for (int skipping : {0, n - 1}) {
      auto train = smp::step(
          [&](at::Tensor x, at::Tensor y) {
            if (smp::mp_rank() == skipping) return x.sum();
            at::Tensor loss = torch::mse_loss(model(x), y);
            model.backward(loss);
            return loss;
          },
          o);
      const Outcome got = outcome_of([&] { train(x, y); });
      EXPECT_EQ(got.kind, "usage") << pipeline << " skipping " << skipping << ": " << got.text;
      EXPECT_CONTAINS(got.text, "did not call an smp::DistributedModel on " + stage_name(skipping, skipping));
      EXPECT_CONTAINS(got.text, "every rank's step function must call the model, or none");
      // And a step without a model on every rank, right after.
      EXPECT_NEAR(none(x, y).reduce_sum().item<double>(), x.sum().item<double>(), 1e-12);
    }
    // The same model still trains.
    auto good = testing::mse_step(model, 4);
    EXPECT_GT(good(x, y).reduce_mean().item<double>(), 0);
  }
}

// A schedule refused on one rank only (its microbatch count differs): that
// rank raises the ScheduleError, every other rank hears it at once instead
// of waiting for its messages, and the step numbers stay aligned (the
// steps after it train).
TEST(PipelineErrors, AScheduleRefusedOnOneRank) {
  const int n = mpi::world_size();
  if (n == 1) GTEST_SKIP() << "needs 2+ ranks";
  torch::set_num_threads(1);
  for (int p : partition_counts()) {
    if (p == 1) continue;
    init_virtual(p, 2);
    smp::DistributedModel model(testing::build_model(integer_mlp()));
    for (int round = 0; round < 2; ++round) {
      const int last = n - 1;
      auto uneven = testing::mse_step(model, mpi::world_rank() == last ? p + 1 : p);
      const int64_t all_rows = 2 * p * (p + 1);
      const Outcome got = outcome_of(
          [&] { uneven(torch::randn({all_rows, 4}, torch::kDouble), torch::randn({all_rows, 4}, torch::kDouble)); });
      EXPECT_CONTAINS(got.text, "interleaved_1f1b cannot take " + std::to_string(p + 1) + " microbatches");
      if (mpi::world_rank() != last)
        EXPECT_CONTAINS(got.text, "world rank " + std::to_string(last) + " failed in the start of the step (its schedule)");
      EXPECT_EQ(got.kind, "usage") << got.text;
    }
    expect_virtual_stages_train(p);
  }
}

// The second line of defence: the stages agree on the step's arguments, but
// a stage runs the model on an input of another shape. Stage 1 finds it in
// the header and raises; every other rank hears of it and raises the same
// class (smp::UsageError) naming stage 1 and the shapes, well before the
// deadline.
TEST(PipelineErrors, ModelInputOfAnotherShapeOnOneStage) {
  torch::set_num_threads(1);
  const int n = mpi::world_size();
  if (n == 1) GTEST_SKIP() << "needs 2+ ranks";
  for (const char* pipeline : {"simple", "interleaved"}) {
    init(n, pipeline);
    smp::DistributedModel model(testing::build_model(mlp()));
    smp::StepOptions o;
    o.microbatches(2);
    auto train = smp::step(
        [&](at::Tensor x, at::Tensor y) {
          const at::Tensor in = smp::mp_rank() == 1 ? x.narrow(0, 0, 1) : x;  // stage 1 drops a row
          at::Tensor loss = torch::mse_loss(model(in), y);
          model.backward(loss);
          return loss;
        },
        o);
    const at::Tensor x = torch::randn({4, 6}, torch::kDouble), y = torch::randn({4, 4}, torch::kDouble);
    const Outcome got = outcome_of([&] { train(x, y); });
    EXPECT_EQ(got.kind, "usage") << got.text;
    EXPECT_CONTAINS(got.text,
                    "mismatched microbatch shapes: stage 0 ran the model on an input of shape [2, 6], this "
                    "stage was given [1, 6]");
    if (smp::mp_rank() != 1) {
      EXPECT_CONTAINS(got.text, "smp::step: " + stage_name(1, 1) + " failed in the forward of microbatch 0: ");
      EXPECT_CONTAINS(got.text, "; this rank (" + stage_name(smp::mp_rank(), smp::rank()) + ") stops too");
    }
    testing::PipelineRun run;
    run.model = mlp();
    run.microbatches = 2;
    run.steps = 2;
    EXPECT_EQ(testing::check_against_serial(run), "") << pipeline << ", after the failure";
  }
}

}  // namespace
}  // namespace partita::spec
