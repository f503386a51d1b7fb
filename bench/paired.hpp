// What every benchmark binary shares: timing a call after a barrier (the
// slowest rank's time), and `paired`, which times partita's call and its
// raw-MPI twin back to back in the same iterations. Header-only, included by
// the benchmark sources of bench_primitives.
#pragma once

#include <benchmark/benchmark.h>
#include <mpi.h>
#include <torch/torch.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "partita/mpi/runtime.hpp"

namespace partita::bench {

using partita::mpi::world_comm;
using partita::mpi::world_rank;
using partita::mpi::world_size;

inline void barrier() {
  MPI_Request req;
  MPI_Ibarrier(world_comm(), &req);
  partita::mpi::wait(req, "bench barrier");
}

// One timed call: after a barrier, the slowest rank's time (every rank gets
// the same figure, so every rank takes the same decisions).
template <typename Body>
double once(Body&& body) {
  barrier();
  const auto t0 = std::chrono::steady_clock::now();
  body();
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double slowest = 0;
  MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, world_comm());
  return slowest;
}

// Peak resident memory of this process since the last reset, in MiB
// (VmHWM). Resetting writes 5 to /proc/self/clear_refs (Linux >= 4.0); where
// that is refused the peak is the process's lifetime peak.
inline double vm_status_mib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::atof(line.c_str() + std::strlen(key)) / 1024.0;
  return 0;
}
inline void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

inline long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

inline double planted_slowdown() {
  static const double f = [] {
    const char* v = std::getenv("PARTITA_BENCH_PLANT_SLOWDOWN");
    return v ? std::atof(v) : 0.0;
  }();
  return f;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Instruction counts (issue 34 item 1): under
//   PARTITA_BENCH_COUNT=ours|raw valgrind --tool=callgrind --collect-atstart=no ...
// callgrind collects only inside partita's calls (ours) or only inside the
// twin's (raw), so the collected total over the calls counted (each
// process prints "counted calls: N" at exit) is instructions per call.
// tools/instructions.sh runs it per benchmark. Without the variable the
// scope costs one branch on a cached flag.
enum class CountedSide { none, ours, raw };
inline CountedSide counted_side() {
  static const CountedSide side = [] {
    const char* v = std::getenv("PARTITA_BENCH_COUNT");
    if (!v) return CountedSide::none;
    return std::string(v) == "ours" ? CountedSide::ours : std::string(v) == "raw" ? CountedSide::raw : CountedSide::none;
  }();
  return side;
}
long& counted_calls();
struct CountedScope {
  bool on;
  explicit CountedScope(CountedSide side) : on(side == counted_side()) {
    if (on) {
      ++counted_calls();
      toggle_collect();
    }
  }
  ~CountedScope() {
    if (on) toggle_collect();
  }
  static void toggle_collect();  // CALLGRIND_TOGGLE_COLLECT, in bench/counting.cpp
};

// Each iteration times partita's call and its raw-MPI twin back to back (in
// alternating order), so both see the same machine: on a shared 2-core
// machine, runs minutes apart differ by more than the overhead measured.
// The benchmark's time is partita's; counters: mpi_us and partita_us
// (medians over the iterations) and ratio = partita_us / mpi_us.
// `prepare`, when given, runs before each of partita's calls, untimed (e.g.
// to make the input an in-place call consumes). `peer`, when given, is a
// third library's call on the same bytes (LibTorch's c10d Gloo collectives,
// bench/gloo_peer.hpp), timed in the same loop with the three in rotating
// order, on at most 100 of its iterations; its median is the counter peer_us.
struct NoPrepare {
  void operator()() const {}
};
template <typename Ours, typename Raw, typename Prepare = NoPrepare>
void paired(benchmark::State& state, int64_t bytes, Ours&& ours_call, Raw&& raw,
            Prepare&& prepare = {}, const std::function<void()>& peer = {}) {
  std::vector<double> t_ours, t_raw, t_peer;
  long iteration = 0;
  long faults = 0, calls = 0;  // minor page faults in partita's calls
  auto ours = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const CountedScope counted(CountedSide::ours);
    ours_call();
    if (planted_slowdown() > 0) {
      const auto until = t0 + (std::chrono::steady_clock::now() - t0) * (1 + planted_slowdown());
      while (std::chrono::steady_clock::now() < until) {
      }
    }
  };
  // The faults are counted around the timed call, not inside it: a
  // getrusage costs about a microsecond, which counted inside made every
  // 4 KiB partita figure look that much slower (seen in a profile).
  auto timed_ours = [&] {
    prepare();
    const long f0 = minor_faults();
    const double t = once(ours);
    faults += minor_faults() - f0;
    ++calls;
    return t;
  };
  reset_peak_rss();
  const double rss_before = vm_status_mib("VmRSS:");
  // The peer is timed on at most kPeerSamples iterations spread evenly over
  // the loop: the iteration count follows partita's time, and LibTorch's
  // Gloo collectives take up to hundreds of times as long at small sizes.
  constexpr long kPeerSamples = 100;
  const long stride = std::max<long>(1, static_cast<long>(state.max_iterations) / kPeerSamples);
  for (auto _ : state) {
    double a = 0, b = 0, c = 0;
    const bool peer_now = peer && iteration % stride == 0;
    const int turns = peer_now ? 3 : 2;
    const long turn = peer_now ? iteration / stride : iteration;
    // raw, ours[, peer] in turn: each goes first once every `turns` times.
    for (int k = 0; k < turns; ++k) {
      switch ((turn + k) % turns) {
        case 0: a = once([&] { const CountedScope counted(CountedSide::raw); raw(); }); break;
        case 1: b = timed_ours(); break;
        default: c = once(peer); break;
      }
    }
    ++iteration;
    state.SetIterationTime(b);
    t_ours.push_back(b);
    t_raw.push_back(a);
    if (peer_now) t_peer.push_back(c);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  const double m_ours = median(t_ours) * 1e6, m_raw = median(t_raw) * 1e6;
  state.counters["partita_us"] = m_ours;
  state.counters["mpi_us"] = m_raw;
  state.counters["ratio"] = m_raw > 0 ? m_ours / m_raw : 0;
  if (peer) state.counters["peer_us"] = median(t_peer) * 1e6;
  state.counters["ranks"] = world_size();
  // Page faults per call (the most of any rank): fresh output storage shows
  // here, whatever the machine's load (docs/mpi-runtime.md, buffer cache).
  double per_call = calls ? static_cast<double>(faults) / calls : 0, most = 0;
  MPI_Allreduce(&per_call, &most, 1, MPI_DOUBLE, MPI_MAX, world_comm());
  state.counters["faults_per_call"] = most;
  // Peak resident memory over the benchmark, the largest and smallest over
  // the ranks, and the largest growth over the memory held before it.
  double mine[3] = {vm_status_mib("VmHWM:"), -vm_status_mib("VmHWM:"), 0}, all[3];
  mine[2] = mine[0] - rss_before;
  MPI_Allreduce(mine, all, 3, MPI_DOUBLE, MPI_MAX, world_comm());
  state.counters["peak_rss_mib"] = all[0];
  state.counters["peak_rss_mib_min_rank"] = -all[1];
  state.counters["rss_growth_mib"] = all[2];
}

// The adjoint alone: the autograd node of `forward()`'s output applied to
// a copy of `dy` that only it holds (as LibTorch's engine hands a gradient
// over), beside `raw`, the hand-written adjoint. The forward and the copy
// are made untimed before each call, on every rank alike. This is partita's
// backward without the engine, which a "_fwdbwd" row adds.
template <typename Forward, typename Raw>
void adjoint_alone(benchmark::State& state, int64_t bytes, const at::Tensor& dy,
                   Forward&& forward, Raw&& raw) {
  std::shared_ptr<torch::autograd::Node> node;
  torch::autograd::variable_list grads;
  paired(
      state, bytes, [&] { benchmark::DoNotOptimize((*node)(std::move(grads))); }, raw,
      [&] {
        node = forward().grad_fn();
        grads.clear();
        grads.push_back(dy.clone());
      });
}

// The communicator's benchmarks' twins (communicator_bench.cpp), for the
// JSON context.
const std::map<std::string, std::string>& communicator_twins();
// ... and the Linear layers' (linear_bench.cpp).
const std::map<std::string, std::string>& linear_twins();

}  // namespace partita::bench
