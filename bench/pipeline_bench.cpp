// One training step through the pipeline (issue 14, docs/pipeline.md):
// an MLP of `layers` Linear layers of `width` features (GELU between them),
// batch `batch` in `microbatches` microbatches, one stage per rank, for each
// schedule; beside the same step of the whole model on one process (rank 0
// alone, the others waiting). Prints medians over `steps` timed steps and
// the bubble: per stage, the share of the pipeline's step (the slowest
// stage's time, all starting at a barrier) it spent not computing in its
// layers, against the theory's (p - 1) / (m + p - 1).
//
//   mpiexec -n 4 build/bench/bench_pipeline [--width 1024 --layers 8 --batch 64
//                                            --microbatches 8 --steps 20 --warmup 3]
//
// A small timed main rather than Google Benchmark: a step is a collective of
// every stage and the figures wanted are per stage.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "key_values.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/smp.hpp"
#include "partita/smp/pipeline.hpp"
#include "partita/smp/step.hpp"

namespace smp = partita::smp;
namespace mpi = partita::mpi;

namespace {

struct Options {
  int64_t width = 1024, batch = 64;
  int layers = 8, microbatches = 8, steps = 20, warmup = 3;
  long sleep_us = 0;  // > 0: layers that sleep instead of computing (below)
};

// With more stages than cores the stages' computations compete for the
// cores and the measured bubble mixes the schedule with the sharing. A layer
// that sleeps `us` per microbatch in its forward and twice that in its
// backward (after multiplying by a weight of 1, so that its backward runs on
// stage 0 too) takes no core: the pipeline then runs as on one core per stage, and
// the bubble measured is the schedule's and the messages'.
struct SleepFn : torch::autograd::Function<SleepFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t us) {
    ctx->saved_data["us"] = us;
    std::this_thread::sleep_for(std::chrono::microseconds(us));
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    std::this_thread::sleep_for(std::chrono::microseconds(2 * ctx->saved_data["us"].toInt()));
    return {g[0], at::Tensor()};
  }
};
struct SleepLayerImpl : torch::nn::Module {
  explicit SleepLayerImpl(int64_t us) : us(us), w(register_parameter("w", torch::ones({1}))) {}
  at::Tensor forward(const at::Tensor& x) { return SleepFn::apply(x * w, us); }
  int64_t us;
  at::Tensor w;
};
TORCH_MODULE(SleepLayer);

Options parse(int argc, char** argv) {
  Options o;
  partita::bench::parse_key_values(
      argc, argv, "bench_pipeline",
      {{"--width", [&](double x) { o.width = static_cast<int64_t>(x); }},
       {"--layers", [&](double x) { o.layers = static_cast<int>(x); }},
       {"--batch", [&](double x) { o.batch = static_cast<int64_t>(x); }},
       {"--microbatches", [&](double x) { o.microbatches = static_cast<int>(x); }},
       {"--steps", [&](double x) { o.steps = static_cast<int>(x); }},
       {"--warmup", [&](double x) { o.warmup = static_cast<int>(x); }},
       {"--sleep-us", [&](double x) { o.sleep_us = static_cast<int64_t>(x); }}});
  return o;
}

torch::nn::Sequential mlp(const Options& o) {
  torch::manual_seed(3);
  torch::nn::Sequential seq;
  if (o.sleep_us > 0) {
    for (int i = 0; i < o.layers; ++i) seq->push_back(SleepLayer(o.sleep_us));
    return seq;
  }
  for (int i = 0; i < o.layers; ++i) {
    seq->push_back(torch::nn::Linear(o.width, o.width));
    if (i + 1 < o.layers) seq->push_back(torch::nn::GELU());
  }
  return seq;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The whole step on this process: forward, mean-squared loss, backward.
double one_process_step(const Options& o) {
  torch::nn::Sequential net = mlp(o);
  torch::optim::SGD opt(net->parameters(), 1e-3);
  const at::Tensor x = torch::randn({o.batch, o.width}), y = torch::randn({o.batch, o.width});
  std::vector<double> t;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    const double t0 = now();
    if (o.sleep_us > 0)  // a sleeping layer's time is per microbatch: run them one after the other
      for (int mb = 0; mb < o.microbatches; ++mb) {
        const int64_t n = o.batch / o.microbatches;
        torch::mse_loss(net->forward(x.narrow(0, mb * n, n)), y.narrow(0, mb * n, n)).backward();
      }
    else
      torch::mse_loss(net->forward(x), y).backward();
    const double dt = now() - t0;
    opt.step();
    opt.zero_grad();
    if (s >= o.warmup) t.push_back(dt);
  }
  return median(t);
}

// CPU time of this process (every thread), seconds.
double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

struct StageFigures {
  double step = 0, busy = 0, wait = 0, bubble = 0;
  double cpu = 0;  // CPU time the stage's process used in the step
  int peak_live = 0;
  double peak_mib = 0;
};

// One schedule: the median step time (the slowest stage's) and each stage's
// medians.
std::pair<double, std::vector<StageFigures>> pipeline_steps(const Options& o, const char* pipeline) {
  smp::Config cfg;
  cfg.partitions(mpi::world_size());
  cfg.microbatches(o.microbatches);
  cfg.pipeline(pipeline);
  smp::init(cfg);
  torch::nn::Sequential net = mlp(o);
  smp::DistributedModel model(net);
  torch::optim::SGD opt(model.parameters(), 1e-3);
  auto train = smp::step([&](at::Tensor x, at::Tensor y) {
    at::Tensor loss = torch::mse_loss(model(x), y);
    model.backward(loss);
    return loss;
  });
  torch::manual_seed(4);
  const at::Tensor x = torch::randn({o.batch, o.width}), y = torch::randn({o.batch, o.width});
  std::vector<double> steps, stage_steps, busy, wait, bubble, peak_mib, cpu;
  int peak_live = 0;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    smp::barrier(smp::MP_GROUP);
    const double t0 = now(), c0 = cpu_now();
    train(x, y);
    double dt = now() - t0;
    const double dc = cpu_now() - c0;
    opt.step();
    opt.zero_grad();
    if (s < o.warmup) continue;
    const auto all = smp::allgather(dt, smp::MP_GROUP);
    steps.push_back(*std::max_element(all.begin(), all.end()));
    const smp::PipelineStats& st = model.stats();
    stage_steps.push_back(st.step_seconds);
    busy.push_back(st.busy_seconds);
    wait.push_back(st.wait_seconds);
    // Idle share of the whole pipeline's step (the slowest stage's time,
    // the stages started together at the barrier): the fill and drain a
    // stage sits out count, as in the theory.
    bubble.push_back(1 - st.busy_seconds / steps.back());
    peak_live = std::max(peak_live, st.peak_live);
    peak_mib.push_back(st.peak_bytes / 1048576.0);
    cpu.push_back(dc);
  }
  StageFigures mine{median(stage_steps), median(busy), median(wait), median(bubble),
                    median(cpu), peak_live, median(peak_mib)};
  const auto all = smp::allgather(mine, smp::MP_GROUP);
  return {median(steps), all};
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  torch::set_num_threads(1);
  const Options o = parse(argc, argv);
  const int p = mpi::world_size();
  smp::init(smp::Config{});
  double single = 0;
  if (mpi::world_rank() == 0) single = one_process_step(o);
  smp::barrier();
  const double theory = double(p - 1) / (o.microbatches + p - 1);
  if (mpi::world_rank() == 0)
    std::printf("pipeline step: %s %d x %ld wide, batch %ld, %d microbatches, %d stages, float32; "
                "medians of %d steps after %d warm-up\none process, whole model: %.2f ms\n",
                o.sleep_us > 0 ? ("layers sleeping " + std::to_string(o.sleep_us) + " us forward, twice backward, per microbatch:").c_str()
                               : "MLP (GELU between)",
                o.layers, static_cast<long>(o.width), static_cast<long>(o.batch), o.microbatches, p, o.steps,
                o.warmup, single * 1e3);
  for (const char* pipeline : {"simple", "interleaved"}) {
    const auto [step, stages] = pipeline_steps(o, pipeline);
    if (mpi::world_rank() != 0) continue;
    double mean_bubble = 0, busiest = 0, cpu = 0;
    for (const auto& s : stages) {
      mean_bubble += s.bubble / stages.size();
      busiest = std::max(busiest, s.busy);
      cpu += s.cpu;
    }
    // The theory assumes equal stages; stage 0 computes no input gradient
    // and is lighter, so the busiest stage's idle share is printed too.
    std::printf("\n%s: step %.2f ms (%.2fx one process); bubble measured %.1f %% (mean over stages), %.1f %% "
                "(busiest stage), theory %.1f %%\n",
                pipeline, step * 1e3, single / step, mean_bubble * 100, (1 - busiest / step) * 100, theory * 100);
    // How many cores the stages kept busy on average: on a machine with
    // fewer cores than stages, the step cannot be shorter than the CPU
    // work over the cores.
    std::printf("CPU time of all stages: %.2f ms per step, %.2f cores busy on average over the step\n",
                cpu * 1e3, cpu / step);
    std::printf("| stage | step (ms) | busy (ms) | waiting (ms) | CPU (ms) | bubble | peak activations | peak activation MiB |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (size_t s = 0; s < stages.size(); ++s)
      std::printf("| %zu | %.2f | %.2f | %.2f | %.2f | %.1f %% | %d | %.2f |\n", s, stages[s].step * 1e3,
                  stages[s].busy * 1e3, stages[s].wait * 1e3, stages[s].cpu * 1e3, stages[s].bubble * 100,
                  stages[s].peak_live, stages[s].peak_mib);
  }
  return 0;
}
