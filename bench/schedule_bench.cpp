// Issue 31 item 5: every built-in schedule's bubble, measured on layers of
// fixed cost, beside the simulator's figure (docs/pipeline.md, "Measured
// bubbles"). Each stage (chunk) is one layer that sleeps a set time in its
// forward (F), in its input-gradient backward (I) and in its weight-gradient
// backward (W), whichever the executor asks of it (a full backward B sleeps
// I + W): sleeping takes no core, so 4 stages fit 2 cores and the bubble
// measured is the schedule's and the messages', not the sharing of cores.
//
//   mpiexec -n 4 build/bench/bench_schedules [--unit-ms 20 --microbatches 8 --virtual 2
//                                             --steps 5 --warmup 1]
//
// One unit is F = I = W of a stage; with v virtual stages per rank the model
// has p * v layers of unit / v each (the same work per rank). Measured
// bubble: 1 - (sum over ranks of the time in their layers) / (ranks x step),
// the step being the slowest rank's from a common barrier; medians over the
// steps. Simulated: smp::verify of the same schedule at unit costs (F = I =
// W = 1), whose bubble is the same at any scale.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "key_values.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/smp.hpp"
#include "partita/smp/pipeline.hpp"
#include "partita/smp/schedule.hpp"
#include "partita/smp/step.hpp"

namespace smp = partita::smp;
namespace mpi = partita::mpi;

namespace {

struct Options {
  double unit_ms = 20;
  int microbatches = 8, v = 2, steps = 5, warmup = 1;
};

Options parse(int argc, char** argv) {
  Options o;
  partita::bench::parse_key_values(
      argc, argv, "bench_schedules",
      {{"--unit-ms", [&](double x) { o.unit_ms = x; }},
       {"--microbatches", [&](double x) { o.microbatches = static_cast<int>(x); }},
       {"--virtual", [&](double x) { o.v = static_cast<int>(x); }},
       {"--steps", [&](double x) { o.steps = static_cast<int>(x); }},
       {"--warmup", [&](double x) { o.warmup = static_cast<int>(x); }}});
  return o;
}

void sleep_us(int64_t us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

// y = x * w (w = 1): F sleeps in the forward; the backward sleeps I's time
// if the input's gradient is wanted and W's if the weight's is (autograd
// tells which: I restricts the pass to the stage's input, W to its
// parameters, B wants both).
struct FixedCostFn : torch::autograd::Function<FixedCostFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            int64_t us) {
    ctx->saved_data["us"] = us;
    ctx->save_for_backward({x, w});
    sleep_us(us);
    return x * w;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const int64_t us = ctx->saved_data["us"].toInt();
    const auto saved = ctx->get_saved_variables();
    at::Tensor gx, gw;
    if (ctx->needs_input_grad(0)) {
      sleep_us(us);
      gx = g[0] * saved[1];
    }
    if (ctx->needs_input_grad(1)) {
      sleep_us(us);
      gw = (g[0] * saved[0]).sum().reshape({1});
    }
    return {gx, gw, at::Tensor()};
  }
};

struct FixedCostImpl : torch::nn::Module {
  explicit FixedCostImpl(int64_t us) : us(us), w(register_parameter("w", torch::ones({1}))) {}
  at::Tensor forward(const at::Tensor& x) { return FixedCostFn::apply(x, w, us); }
  int64_t us;
  at::Tensor w;
};
TORCH_MODULE(FixedCost);

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

struct Result {
  std::string name;
  int v = 1;
  double step = 0, measured = 0, simulated = 0, simulated_step = 0;
};

Result run(const Options& o, const char* pipeline, int v) {
  const int p = mpi::world_size(), m = o.microbatches;
  smp::Config cfg;
  cfg.partitions(p);
  cfg.microbatches(m);
  cfg.pipeline(pipeline);
  cfg.virtual_pipeline_model_parallel_size(v);
  smp::init(cfg);
  const int64_t us = static_cast<int64_t>(o.unit_ms * 1000 / v);
  torch::nn::Sequential net;
  for (int i = 0; i < p * v; ++i) net->push_back(FixedCost(us));
  smp::DistributedModel model(net);  // p * v layers of one parameter each: one layer per stage
  torch::optim::SGD opt(model.parameters(), 1e-3);
  auto train = smp::step([&](at::Tensor x, at::Tensor y) {
    at::Tensor loss = torch::mse_loss(model(x), y);
    model.backward(loss);
    return loss;
  });
  // x takes a gradient so that stage 0's backward computes its input's
  // gradient too (every stage then costs F + I + W per microbatch).
  const at::Tensor x = torch::randn({2 * m, 4}).requires_grad_(true), y = torch::randn({2 * m, 4});
  std::vector<double> steps, bubbles;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    smp::barrier(smp::MP_GROUP);
    const double t0 = now();
    train(x, y);
    const double dt = now() - t0;
    opt.zero_grad();
    if (s < o.warmup) continue;
    const auto all = smp::allgather(dt, smp::MP_GROUP);
    const auto busy = smp::allgather(model.stats().busy_seconds, smp::MP_GROUP);
    const double step = *std::max_element(all.begin(), all.end());
    double sum = 0;
    for (double b : busy) sum += b;
    steps.push_back(step);
    bubbles.push_back(1 - sum / (p * step));
  }
  Result r;
  r.name = pipeline;
  r.v = v;
  r.step = median(steps);
  r.measured = median(bubbles);
  const smp::Simulation sim = smp::verify(smp::build_schedule(pipeline, p, m, v));
  r.simulated = sim.bubble();
  r.simulated_step = sim.makespan * o.unit_ms / v / 1000;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  torch::set_num_threads(1);
  const Options o = parse(argc, argv);
  const int p = mpi::world_size();
  std::vector<Result> results;
  for (const char* pipeline : {"simple", "interleaved", "zero_bubble"}) results.push_back(run(o, pipeline, 1));
  if (p > 1 && o.microbatches % p == 0) results.push_back(run(o, "interleaved_virtual", o.v));
  if (mpi::world_rank() != 0) return 0;
  std::printf("schedules on fixed-cost layers: %d ranks, %d microbatches, F = I = W = %.1f ms per stage "
              "(B = I + W), sleeping; medians of %d steps after %d warm-up; CPU: %s\n",
              p, o.microbatches, o.unit_ms, o.steps, o.warmup, cpu_model().c_str());
  std::printf("| schedule | v | step (ms) | simulated step (ms) | bubble measured | bubble simulated | difference |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  double zb = 0, one = 0;
  int worst_ok = 1;
  for (const auto& r : results) {
    std::printf("| %s | %d | %.1f | %.1f | %.1f %% | %.1f %% | %+.1f points |\n", r.name.c_str(), r.v, r.step * 1e3,
                r.simulated_step * 1e3, r.measured * 100, r.simulated * 100, (r.measured - r.simulated) * 100);
    if (r.name == "zero_bubble") zb = r.measured;
    if (r.name == "interleaved") one = r.measured;
    if (std::abs(r.measured - r.simulated) > 0.05) worst_ok = 0;
  }
  std::printf("every measured bubble within 5 points of the simulated one: %s; ZB-H1's below 1F1B's: %s\n",
              worst_ok ? "yes" : "no", zb < one ? "yes" : "no");
  return 0;
}
