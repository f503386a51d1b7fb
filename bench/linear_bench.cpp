// Seed 002's Linear layers beside their twins (issue 11): the same local
// GEMMs plus the raw MPI collectives that move the same bytes on the same
// ranks, timed in the same iterations (`paired`). The benchmark's argument
// is the global weight's size in bytes (float32, square: features =
// sqrt(bytes / 4)); the batch is 32768 / features, so 4 MiB is (batch 32,
// 1024 -> 1024) and 64 MiB (batch 8, 4096 -> 4096); 4 KiB (1024 x 32 -> 32)
// is the smoke test's size. Layouts on n ranks:
//
//   linear                    P_W fout x fin (1 x n, or 2 x 2 at 4 ranks):
//                             Bcast x down P_W's columns, GEMM, Reduce along
//                             its rows (backward: Bcast dy along the rows,
//                             two GEMMs, Reduce dx down the columns)
//   linear_all_gather         P 1 x n: Allgather x, GEMM (backward: two GEMMs,
//                             Reduce_scatter dx)
//   linear_reduce_scatter     P 1 x n: GEMM, Reduce_scatter y (backward:
//                             Allgather dy, two GEMMs)
//   linear_*_zero             P D x 1 x M (D = 2, M = n / 2): as above, plus
//                             Allgather of W's shards over D (backward:
//                             Reduce_scatter of dW over D)
//
// Bias is on in the layers (their default); the twins add it locally and do
// not communicate it. Counters besides paired's: gemm_us, the twin's GEMMs
// alone (median of 5), so the twin's communication is mpi_us - gemm_us.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "paired.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/nn/linear.hpp"
#include "partita/testing/primitive_table.hpp"

namespace partita::bench {
namespace {

int64_t features_of(const benchmark::State& s) {
  return static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(s.range(0)) / 4)));
}
int64_t batch_of(int64_t features) { return 32768 / features; }
int n_of(const at::Tensor& t) { return static_cast<int>(t.numel()); }
at::Tensor rnd(at::IntArrayRef shape) { return torch::randn(shape); }

mpi::CartesianPartition cart(const Ranks& ranks, const Shape& shape) {
  return mpi::Partition::world().create_partition_inclusive(ranks).create_cartesian_topology_partition(shape);
}
Ranks all_ranks() {
  Ranks r;
  for (int i = 0; i < world_size(); ++i) r.push_back(i);
  return r;
}

// A communicator of the world ranks with the same `color`, ordered by rank.
struct Comm {
  MPI_Comm c = MPI_COMM_NULL;
  explicit Comm(int color) { MPI_Comm_split(world_comm(), color, world_rank(), &c); }
  ~Comm() {  // (the cache of setups outlives MPI_Finalize)
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&c);
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
};

// GEMMs of a Linear step: forward y = x W^T (+ b), backward dx = dy W and
// dW = dy^T x, on flattened 2-D views.
struct Gemms {
  at::Tensor x, W, b, y, dy, dx, dW;
  void forward() { at::addmm_out(y, b, x, W.t()); }
  void backward() {
    at::mm_out(dx, dy, W);
    at::mm_out(dW, dy.t(), x);
  }
};

// One benchmark's layer, its input and cotangent, and its twin's buffers
// and communicators; built once per (layer, size) and kept.
struct Setup {
  std::shared_ptr<nn::DistributedLinearBase> layer;
  at::Tensor x, dy;
  std::function<void()> twin_fwd, twin_bwd;
  std::shared_ptr<Gemms> gemms;  // the twin's local GEMMs
  std::vector<std::unique_ptr<Comm>> comms;
  std::vector<at::Tensor> keep;  // the twin's buffers
};

std::unique_ptr<Setup> make(const std::string& kind, int64_t f) {
  auto s = std::make_unique<Setup>();
  const int n = world_size(), me = world_rank();
  const int64_t B = batch_of(f);
  const auto o = nn::LinearOptions().bias(true).dtype(at::kFloat);
  auto g = std::make_shared<Gemms>();
  auto gemm_shapes = [&](int64_t rows, int64_t in, int64_t out) {
    g->x = rnd({rows, in});
    g->W = rnd({out, in});
    g->b = rnd({out});
    g->y = rnd({rows, out});
    g->dy = rnd({rows, out});
    g->dx = rnd({rows, in});
    g->dW = rnd({out, in});
  };
  auto comm = [&](int color) {
    s->comms.push_back(std::make_unique<Comm>(color));
    return s->comms.back()->c;
  };
  if (kind == "linear") {
    const int64_t fin = n == 4 ? 2 : n, fout = n / fin;
    const int i = me / static_cast<int>(fin), j = me % static_cast<int>(fin);
    Ranks xr, yr;
    for (int k = 0; k < fin; ++k) xr.push_back(k);
    for (int k = 0; k < fout; ++k) yr.push_back(k * static_cast<int>(fin));
    const auto P_x = cart(xr, {1, fin}), P_y = cart(yr, {1, fout});
    s->layer = nn::DistributedLinear(P_x, P_y, cart(all_ranks(), {fout, fin}), f, f, o).ptr();
    s->x = P_x.active() ? rnd({B, f / fin}) : torch::zeros({0});
    s->dy = P_y.active() ? rnd({B, f / fout}) : torch::zeros({B, 0});
    gemm_shapes(B, f / fin, f / fout);
    MPI_Comm column = comm(j), row = comm(static_cast<int>(fin) + i);
    auto red = std::make_shared<at::Tensor>(rnd({B, f / fout}));
    s->keep.push_back(*red);
    s->twin_fwd = [g, red, column, row] {
      MPI_Bcast(g->x.data_ptr(), n_of(g->x), MPI_FLOAT, 0, column);
      g->forward();
      MPI_Reduce(g->y.data_ptr(), red->data_ptr(), n_of(g->y), MPI_FLOAT, MPI_SUM, 0, row);
    };
    s->twin_bwd = [g, red, column, row] {
      MPI_Bcast(g->dy.data_ptr(), n_of(g->dy), MPI_FLOAT, 0, row);
      g->backward();
      MPI_Reduce(g->dx.data_ptr(), red->data_ptr(), n_of(g->dx), MPI_FLOAT, MPI_SUM, 0, column);
    };
  } else if (kind == "linear_all_gather" || kind == "linear_reduce_scatter") {
    const auto P = cart(all_ranks(), {1, n});
    const bool gather = kind == "linear_all_gather";
    if (gather) s->layer = nn::DistributedLinearAllGather(mpi::Partition(), P, f, f, o).ptr();
    else s->layer = nn::DistributedLinearReduceScatter(P, mpi::Partition(), f, f, o).ptr();
    s->x = rnd({B, f / n});
    s->dy = rnd({B, f / n});
    // all-gather: the GEMM on the gathered x (B x f) and W_m (f/n x f);
    // reduce-scatter: x (B x f/n) and W_m (f x f/n), y reduced and scattered.
    if (gather) gemm_shapes(B, f, f / n);
    else gemm_shapes(B, f / n, f);
    auto piece = std::make_shared<at::Tensor>(rnd({B, f / n}));
    s->keep.push_back(*piece);
    const MPI_Comm world = world_comm();
    if (gather) {
      s->twin_fwd = [g, piece, world] {
        MPI_Allgather(piece->data_ptr(), n_of(*piece), MPI_FLOAT, g->x.data_ptr(), n_of(*piece),
                      MPI_FLOAT, world);
        g->forward();
      };
      s->twin_bwd = [g, piece, world] {
        g->backward();
        MPI_Reduce_scatter_block(g->dx.data_ptr(), piece->data_ptr(), n_of(*piece), MPI_FLOAT,
                                 MPI_SUM, world);
      };
    } else {
      s->twin_fwd = [g, piece, world] {
        g->forward();
        MPI_Reduce_scatter_block(g->y.data_ptr(), piece->data_ptr(), n_of(*piece), MPI_FLOAT,
                                 MPI_SUM, world);
      };
      s->twin_bwd = [g, piece, world] {
        MPI_Allgather(piece->data_ptr(), n_of(*piece), MPI_FLOAT, g->dy.data_ptr(), n_of(*piece),
                      MPI_FLOAT, world);
        g->backward();
      };
    }
  } else {  // the ZeRO-3 layers on D x 1 x M
    const int64_t D = n % 2 == 0 ? 2 : 1, M = n / D;
    const int d = me / static_cast<int>(M), m = me % static_cast<int>(M);
    const auto P = cart(all_ranks(), {D, 1, M});
    const bool gather = kind == "linear_all_gather_zero";
    if (gather) s->layer = nn::DistributedLinearAllGatherZero(mpi::Partition(), P, f, f, o).ptr();
    else s->layer = nn::DistributedLinearReduceScatterZero(P, mpi::Partition(), f, f, o).ptr();
    s->x = rnd({B / D, 1, f / M});
    s->dy = rnd({B / D, 1, f / M});
    if (gather) gemm_shapes(B / D, f, f / M);
    else gemm_shapes(B / D, f / M, f);
    MPI_Comm dp = comm(m), mp = comm(static_cast<int>(M) + d);
    auto shard = std::make_shared<at::Tensor>(rnd({g->W.numel() / D}));
    auto piece = std::make_shared<at::Tensor>(rnd({B / D, f / M}));
    s->keep.push_back(*shard);
    s->keep.push_back(*piece);
    auto gather_w = [g, shard, dp] {
      MPI_Allgather(shard->data_ptr(), n_of(*shard), MPI_FLOAT, g->W.data_ptr(), n_of(*shard),
                    MPI_FLOAT, dp);
    };
    auto scatter_dw = [g, shard, dp] {
      MPI_Reduce_scatter_block(g->dW.data_ptr(), shard->data_ptr(), n_of(*shard), MPI_FLOAT, MPI_SUM,
                               dp);
    };
    if (gather) {
      s->twin_fwd = [g, piece, mp, gather_w] {
        gather_w();
        MPI_Allgather(piece->data_ptr(), n_of(*piece), MPI_FLOAT, g->x.data_ptr(), n_of(*piece),
                      MPI_FLOAT, mp);
        g->forward();
      };
      s->twin_bwd = [g, piece, mp, scatter_dw] {
        g->backward();
        scatter_dw();
        MPI_Reduce_scatter_block(g->dx.data_ptr(), piece->data_ptr(), n_of(*piece), MPI_FLOAT,
                                 MPI_SUM, mp);
      };
    } else {
      s->twin_fwd = [g, piece, mp, gather_w] {
        gather_w();
        g->forward();
        MPI_Reduce_scatter_block(g->y.data_ptr(), piece->data_ptr(), n_of(*piece), MPI_FLOAT,
                                 MPI_SUM, mp);
      };
      s->twin_bwd = [g, piece, mp, scatter_dw] {
        MPI_Allgather(piece->data_ptr(), n_of(*piece), MPI_FLOAT, g->dy.data_ptr(), n_of(*piece),
                      MPI_FLOAT, mp);
        g->backward();
        scatter_dw();
      };
    }
  }
  s->gemms = g;
  return s;
}

Setup& setup(const std::string& kind, int64_t f) {
  static std::map<std::pair<std::string, int64_t>, std::unique_ptr<Setup>> cache;
  auto& slot = cache[{kind, f}];
  if (!slot) slot = make(kind, f);
  return *slot;
}

void run(benchmark::State& state, const std::string& kind, bool backward) {
  const int64_t f = features_of(state);
  Setup& s = setup(kind, f);
  const at::Tensor x = s.x.detach().requires_grad_(backward);
  auto ours = [&] {
    at::Tensor y = s.layer->forward(x);
    if (!backward) {
      benchmark::DoNotOptimize(y);
      return;
    }
    torch::autograd::backward({y}, {s.dy.sizes() == y.sizes() ? s.dy : torch::zeros_like(y)});
    x.mutable_grad().reset();
    for (auto& p : s.layer->parameters()) p.mutable_grad().reset();
  };
  auto twin = [&] {
    s.twin_fwd();
    if (backward) s.twin_bwd();
  };
  // The twin's GEMMs alone (forward, or forward and backward).
  std::vector<double> gemm;
  for (int i = 0; i < 5; ++i)
    gemm.push_back(once([&] {
      s.gemms->forward();
      if (backward) s.gemms->backward();
    }));
  paired(state, state.range(0), ours, twin);
  state.counters["gemm_us"] = median(gemm) * 1e6;
}

#define PARTITA_LINEAR_BENCH(kind)                                                        \
  void kind##_fwd(benchmark::State& s) { run(s, #kind, false); }                         \
  void kind##_fwdbwd(benchmark::State& s) { run(s, #kind, true); }                       \
  BENCHMARK(kind##_fwd)->Apply(weight_sizes);                                            \
  BENCHMARK(kind##_fwdbwd)->Apply(weight_sizes);

void weight_sizes(benchmark::internal::Benchmark* b) {
  b->Arg(4 << 10)->Arg(4 << 20)->Arg(64 << 20)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

PARTITA_LINEAR_BENCH(linear)
PARTITA_LINEAR_BENCH(linear_all_gather)
PARTITA_LINEAR_BENCH(linear_reduce_scatter)
PARTITA_LINEAR_BENCH(linear_all_gather_zero)
PARTITA_LINEAR_BENCH(linear_reduce_scatter_zero)

}  // namespace

const std::map<std::string, std::string>& linear_twins() {
  // The layers' twins are the case runner's table's (primitive_table.hpp).
  static const std::map<std::string, std::string> twins = [] {
    std::map<std::string, std::string> t;
    for (const auto& e : partita::testing::primitive_table()) {
      if (!e.linear) continue;
      t[e.name + "_fwd"] = e.twin_fwd;
      t[e.name + "_fwdbwd"] = e.twin_fwdbwd;
    }
    return t;
  }();
  return twins;
}

}  // namespace partita::bench
