// Google Benchmark under mpiexec: each partita primitive beside the raw MPI
// collective that moves the same bytes on the same ranks.
//
//   broadcast       P_x = {0} -> P_y = world      vs MPI_Bcast from rank 0
//   sum_reduce      P_x = world -> P_y = {0}      vs MPI_Reduce to rank 0
//   all_sum_reduce  P_x = world, all dimensions   vs MPI_Allreduce
//
// "_fwd" times the forward call; "_fwdbwd" forward then backward, against
// the raw pair (bcast+reduce, reduce+bcast, allreduce twice). Every
// iteration starts after a barrier and its time is the slowest rank's, so
// all ranks report the same figure and run the same number of iterations.
// Only rank 0 prints or writes JSON.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "partita/mpi/runtime.hpp"
#include "partita/nn/all_sum_reduce.hpp"
#include "partita/nn/broadcast.hpp"
#include "partita/nn/sum_reduce.hpp"

namespace {

using partita::mpi::world_comm;
using partita::mpi::world_rank;
using partita::mpi::world_size;

void barrier() {
  MPI_Request req;
  MPI_Ibarrier(world_comm(), &req);
  partita::mpi::wait(req, "bench barrier");
}

// Runs `body` once per iteration and reports the slowest rank's time.
template <typename Body>
void timed(benchmark::State& state, int64_t bytes, Body&& body) {
  for (auto _ : state) {
    barrier();
    const auto t0 = std::chrono::steady_clock::now();
    body();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double slowest = 0;
    MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, world_comm());
    state.SetIterationTime(slowest);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["ranks"] = world_size();
}

struct Layers {
  partita::mpi::CartesianPartition root, all;
  partita::nn::Broadcast bcast{nullptr};
  partita::nn::SumReduce reduce{nullptr};
  partita::nn::AllSumReduce allreduce{nullptr};
};

Layers& layers() {
  static std::unique_ptr<Layers> l;
  if (!l) {
    l = std::make_unique<Layers>();
    const auto world = partita::mpi::Partition::world();
    l->root = world.create_partition_inclusive({0}).create_cartesian_topology_partition({1});
    l->all = world.create_cartesian_topology_partition({world_size()});
    l->bcast = partita::nn::Broadcast(l->root, l->all);
    l->reduce = partita::nn::SumReduce(l->all, l->root);
    l->allreduce = partita::nn::AllSumReduce(l->all, std::vector<int>{0});
  }
  return *l;
}

int64_t count(const benchmark::State& s) { return s.range(0) / 4; }  // float32
at::Tensor data(int64_t n, bool grad) { return torch::randn({n}).requires_grad_(grad); }
at::Tensor empty(bool grad) { return torch::zeros({0}).requires_grad_(grad); }

// ---- broadcast -------------------------------------------------------------
void partita_broadcast_fwd(benchmark::State& s) {
  auto& L = layers();
  const at::Tensor x = world_rank() == 0 ? data(count(s), false) : empty(false);
  timed(s, s.range(0), [&] { benchmark::DoNotOptimize(L.bcast(x)); });
}
void mpi_bcast(benchmark::State& s) {
  at::Tensor buf = data(count(s), false);
  timed(s, s.range(0), [&] {
    MPI_Bcast(buf.data_ptr(), static_cast<int>(buf.numel()), MPI_FLOAT, 0, world_comm());
  });
}
void partita_broadcast_fwdbwd(benchmark::State& s) {
  auto& L = layers();
  const at::Tensor x = world_rank() == 0 ? data(count(s), true) : empty(true);
  const at::Tensor dy = data(count(s), false);
  timed(s, s.range(0), [&] {
    at::Tensor y = L.bcast(x);
    torch::autograd::backward({y}, {dy});
    x.mutable_grad().reset();  // no accumulation across iterations
  });
}
void mpi_bcast_reduce(benchmark::State& s) {
  at::Tensor buf = data(count(s), false), out = data(count(s), false);
  timed(s, s.range(0), [&] {
    MPI_Bcast(buf.data_ptr(), static_cast<int>(buf.numel()), MPI_FLOAT, 0, world_comm());
    MPI_Reduce(buf.data_ptr(), out.data_ptr(), static_cast<int>(buf.numel()), MPI_FLOAT, MPI_SUM,
               0, world_comm());
  });
}

// ---- sum-reduce ------------------------------------------------------------
void partita_sum_reduce_fwd(benchmark::State& s) {
  auto& L = layers();
  const at::Tensor x = data(count(s), false);
  timed(s, s.range(0), [&] { benchmark::DoNotOptimize(L.reduce(x)); });
}
void mpi_reduce(benchmark::State& s) {
  at::Tensor buf = data(count(s), false), out = data(count(s), false);
  timed(s, s.range(0), [&] {
    MPI_Reduce(buf.data_ptr(), out.data_ptr(), static_cast<int>(buf.numel()), MPI_FLOAT, MPI_SUM,
               0, world_comm());
  });
}
void partita_sum_reduce_fwdbwd(benchmark::State& s) {
  auto& L = layers();
  const at::Tensor x = data(count(s), true);
  const at::Tensor dy = world_rank() == 0 ? data(count(s), false) : torch::zeros({0});
  timed(s, s.range(0), [&] {
    at::Tensor y = L.reduce(x);
    torch::autograd::backward({y}, {dy});
    x.mutable_grad().reset();
  });
}
void mpi_reduce_bcast(benchmark::State& s) {
  at::Tensor buf = data(count(s), false), out = data(count(s), false);
  timed(s, s.range(0), [&] {
    MPI_Reduce(buf.data_ptr(), out.data_ptr(), static_cast<int>(buf.numel()), MPI_FLOAT, MPI_SUM,
               0, world_comm());
    MPI_Bcast(out.data_ptr(), static_cast<int>(out.numel()), MPI_FLOAT, 0, world_comm());
  });
}

// ---- all-sum-reduce ----------------------------------------------------------
void partita_all_sum_reduce_fwd(benchmark::State& s) {
  auto& L = layers();
  const at::Tensor x = data(count(s), false);
  timed(s, s.range(0), [&] { benchmark::DoNotOptimize(L.allreduce(x)); });
}
void mpi_allreduce(benchmark::State& s) {
  at::Tensor buf = data(count(s), false), out = data(count(s), false);
  timed(s, s.range(0), [&] {
    MPI_Allreduce(buf.data_ptr(), out.data_ptr(), static_cast<int>(buf.numel()), MPI_FLOAT,
                  MPI_SUM, world_comm());
  });
}
void partita_all_sum_reduce_fwdbwd(benchmark::State& s) {
  auto& L = layers();
  const at::Tensor x = data(count(s), true);
  const at::Tensor dy = data(count(s), false);
  timed(s, s.range(0), [&] {
    at::Tensor y = L.allreduce(x);
    torch::autograd::backward({y}, {dy});
    x.mutable_grad().reset();
  });
}
void mpi_allreduce_twice(benchmark::State& s) {
  at::Tensor buf = data(count(s), false), out = data(count(s), false);
  timed(s, s.range(0), [&] {
    MPI_Allreduce(buf.data_ptr(), out.data_ptr(), static_cast<int>(buf.numel()), MPI_FLOAT,
                  MPI_SUM, world_comm());
    MPI_Allreduce(out.data_ptr(), buf.data_ptr(), static_cast<int>(buf.numel()), MPI_FLOAT,
                  MPI_SUM, world_comm());
  });
}

// 4 KiB to 16 MiB by factors of 4; fixed iteration counts so that every
// rank runs the same number (no adaptive stopping that could differ).
void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes = 4 << 10; bytes <= 16 << 20; bytes *= 4) b->Arg(bytes);
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

#define PARTITA_BENCH(fn) BENCHMARK(fn)->Apply(sizes)
PARTITA_BENCH(partita_broadcast_fwd);
PARTITA_BENCH(mpi_bcast);
PARTITA_BENCH(partita_broadcast_fwdbwd);
PARTITA_BENCH(mpi_bcast_reduce);
PARTITA_BENCH(partita_sum_reduce_fwd);
PARTITA_BENCH(mpi_reduce);
PARTITA_BENCH(partita_sum_reduce_fwdbwd);
PARTITA_BENCH(mpi_reduce_bcast);
PARTITA_BENCH(partita_all_sum_reduce_fwd);
PARTITA_BENCH(mpi_allreduce);
PARTITA_BENCH(partita_all_sum_reduce_fwdbwd);
PARTITA_BENCH(mpi_allreduce_twice);

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  partita::mpi::Environment env(&argc, &argv);
  torch::set_num_threads(1);
  // Only rank 0 writes files: the others drop --benchmark_out*.
  std::vector<char*> args(argv, argv + argc);
  if (world_rank() != 0)
    args.erase(std::remove_if(args.begin() + 1, args.end(),
                              [](char* a) { return std::strncmp(a, "--benchmark_out", 15) == 0; }),
               args.end());
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (world_rank() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    NullReporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  return 0;
}
