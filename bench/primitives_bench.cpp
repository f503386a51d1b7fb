// Google Benchmark under mpiexec: each partita primitive beside the raw MPI
// collective that moves the same bytes on the same ranks, measured in the
// same iterations (see `paired`).
//
//   broadcast       P_x = {0} -> P_y = world      vs MPI_Bcast from rank 0
//   sum_reduce      P_x = world -> P_y = {0}      vs MPI_Reduce to rank 0
//   all_sum_reduce  P_x = world, all dimensions   vs MPI_Allreduce
//   all_gather      along the world, tensor dim 0 vs MPI_Allgather
//   reduce_scatter  along the world, tensor dim 0 vs MPI_Reduce_scatter
//   repartition     row blocks -> column blocks   vs MPI_Alltoallv
//                   (and _p2p_vs_alltoallw: partita's two exchanges paired)
//   halo_exchange   row slabs, one ghost row      vs MPI_Sendrecv up and down
//
// "<primitive>_static_fwd" (the five team primitives) is the forward of the
// same layer made with Shapes::kStatic (docs/static-shapes.md), same twin.
// "<primitive>_fair_fwdbwd" (the five team primitives) times forward then
// backward against the fair twin: the raw calls of both directions wrapped
// in their own autograd Function (raw_autograd.hpp), so both sides pay
// LibTorch's graph and engine.
// "_fwd" times the forward call; "_fwdbwd" forward then backward, against
// the raw pair (bcast+reduce, reduce+bcast, allreduce twice);
// halo_exchange_inplace_adj the adjoint alone (its node applied, no
// autograd engine) against the hand-written adjoint. Only rank 0
// prints or writes JSON. The context records each benchmark's twin
// ("twin:<name>"), the MPI library and LibTorch versions; counters record
// the peak resident memory of the ranks (perf/README in docs/performance.md).
//
// PARTITA_BENCH_PLANT_SLOWDOWN=0.3 makes partita's side of every pair 30%
// slower (a busy wait after each call): the planted regression the
// regression gate's test must catch. Never set it otherwise.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/version.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gloo_peer.hpp"
#include "paired.hpp"
#include "raw_autograd.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/all_gather.hpp"
#include "partita/nn/all_sum_reduce.hpp"
#include "partita/nn/broadcast.hpp"
#include "partita/nn/halo_exchange.hpp"
#include "partita/nn/repartition.hpp"
#include "partita/nn/sum_reduce.hpp"
#include "partita/testing/primitive_table.hpp"

namespace {

using partita::mpi::world_comm;
using partita::mpi::world_rank;
using partita::mpi::world_size;
using partita::bench::once;
using partita::bench::NoPrepare;
using partita::bench::paired;
using partita::bench::adjoint_alone;

struct Layers {
  partita::mpi::CartesianPartition root, all;
  partita::nn::Broadcast bcast{nullptr};
  partita::nn::SumReduce reduce{nullptr};
  partita::nn::AllSumReduce allreduce{nullptr};
  partita::nn::AllGather allgather{nullptr};
  partita::nn::ReduceScatter reducescatter{nullptr};
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
    l->allgather = partita::nn::AllGather(l->all, 0, 0);
    l->reducescatter = partita::nn::ReduceScatter(l->all, 0, 0);
  }
  return *l;
}

int64_t count(const benchmark::State& s) { return s.range(0) / 4; }  // float32

// The layers again with static shapes (issue 34 item 2, docs/static-shapes.md),
// made anew for each benchmark: a layer's shapes are those of its first call.
constexpr auto kStatic = partita::Shapes::kStatic;
partita::Options static_options() {
  partita::Options o;
  o.shapes(kStatic);
  return o;
}
int mpi_n(const at::Tensor& t) { return static_cast<int>(t.numel()); }
at::Tensor data(int64_t n, bool grad) { return torch::randn({n}).requires_grad_(grad); }
at::Tensor empty(bool grad) { return torch::zeros({0}).requires_grad_(grad); }

// LibTorch's c10d Gloo collective as the third line where Gloo was found.
template <typename Call>
std::function<void()> gloo_peer(Call&& call) {
  if (!partita::bench::gloo_available()) return {};
  return std::forward<Call>(call);
}
// The peers' descriptions for the JSON context ("peer:<benchmark>").
const std::map<std::string, std::string> kGlooPeers = {
    {"broadcast_fwd", "broadcast from rank 0"},
    {"sum_reduce_fwd", "reduce (sum) to rank 0"},
    {"all_sum_reduce_fwd", "allreduce (sum)"},
    {"all_gather_fwd", "allgather"},
};

// Forward then backward of `layer` on x with cotangent dy; the gradient is
// dropped each time so it is not accumulated across iterations.
template <typename Layer>
void fwdbwd(Layer& layer, const at::Tensor& x, const at::Tensor& dy) {
  at::Tensor y = layer(x);
  torch::autograd::backward({y}, {dy});
  x.mutable_grad().reset();
}

// Forward then backward of `layer` on x, beside the same of the fair twin
// (raw_autograd.hpp: the raw MPI calls of both directions as one autograd
// Function) on a copy of x; each side's cotangent has its own output's
// shape. `n`: the broadcast's element count.
template <typename Layer>
void fair_fwdbwd(benchmark::State& s, Layer& layer, const at::Tensor& x,
                 partita::bench::RawKind kind, int64_t n = 0) {
  using partita::bench::RawExchange;
  auto twin = [kind, n](const at::Tensor& v) { return RawExchange::apply_to(v, kind, n); };
  const at::Tensor xr = x.detach().clone().requires_grad_(true);
  const at::Tensor dy = torch::randn(layer(x.detach()).sizes());
  const at::Tensor dyr = torch::randn(twin(xr.detach()).sizes());
  paired(s, s.range(0), [&] { fwdbwd(layer, x, dy); }, [&] { fwdbwd(twin, xr, dyr); });
}

// ---- broadcast: P_x = {0} -> world, beside MPI_Bcast from rank 0 ------------
// (`fixed`: the layer with static shapes, and no Gloo peer: the
// `<primitive>_static_fwd` rows.)
void broadcast_fwd_of(benchmark::State& s, bool fixed) {
  auto& L = layers();
  auto layer = fixed ? partita::nn::Broadcast(L.root, L.all, static_options()) : L.bcast;
  const at::Tensor x = world_rank() == 0 ? data(count(s), false) : empty(false);
  at::Tensor buf = data(count(s), false), peer = data(count(s), false);
  paired(s, s.range(0), [&] { benchmark::DoNotOptimize(layer(x)); },
         [&] { MPI_Bcast(buf.data_ptr(), mpi_n(buf), MPI_FLOAT, 0, world_comm()); }, NoPrepare{},
         fixed ? std::function<void()>() : gloo_peer([&] { partita::bench::gloo_broadcast(peer, 0); }));
}
void broadcast_fwd(benchmark::State& s) { broadcast_fwd_of(s, false); }
void broadcast_static_fwd(benchmark::State& s) { broadcast_fwd_of(s, true); }
void broadcast_fwdbwd(benchmark::State& s) {
  auto& L = layers();
  const at::Tensor x = world_rank() == 0 ? data(count(s), true) : empty(true);
  const at::Tensor dy = data(count(s), false);
  at::Tensor buf = data(count(s), false), out = data(count(s), false);
  paired(s, s.range(0), [&] { fwdbwd(L.bcast, x, dy); }, [&] {
    MPI_Bcast(buf.data_ptr(), mpi_n(buf), MPI_FLOAT, 0, world_comm());
    MPI_Reduce(buf.data_ptr(), out.data_ptr(), mpi_n(buf), MPI_FLOAT, MPI_SUM, 0, world_comm());
  });
}

// ---- sum-reduce: world -> P_y = {0}, beside MPI_Reduce to rank 0 -------------
void sum_reduce_fwd_of(benchmark::State& s, bool fixed) {
  auto& L = layers();
  auto layer = fixed ? partita::nn::SumReduce(L.all, L.root, static_options()) : L.reduce;
  const at::Tensor x = data(count(s), false);
  at::Tensor buf = data(count(s), false), out = data(count(s), false), peer = data(count(s), false);
  paired(
      s, s.range(0), [&] { benchmark::DoNotOptimize(layer(x)); },
      [&] { MPI_Reduce(buf.data_ptr(), out.data_ptr(), mpi_n(buf), MPI_FLOAT, MPI_SUM, 0, world_comm()); },
      NoPrepare{}, fixed ? std::function<void()>() : gloo_peer([&] { partita::bench::gloo_reduce(peer, 0); }));
}
void sum_reduce_fwd(benchmark::State& s) { sum_reduce_fwd_of(s, false); }
void sum_reduce_static_fwd(benchmark::State& s) { sum_reduce_fwd_of(s, true); }
void sum_reduce_fwdbwd(benchmark::State& s) {
  auto& L = layers();
  const at::Tensor x = data(count(s), true);
  // The cotangent has the output's shape: data on rank 0, zero-volume
  // ({n, 0} with preserve_batch) elsewhere.
  const at::Tensor dy = torch::randn(L.reduce(x.detach()).sizes());
  at::Tensor buf = data(count(s), false), out = data(count(s), false);
  paired(s, s.range(0), [&] { fwdbwd(L.reduce, x, dy); }, [&] {
    MPI_Reduce(buf.data_ptr(), out.data_ptr(), mpi_n(buf), MPI_FLOAT, MPI_SUM, 0, world_comm());
    MPI_Bcast(out.data_ptr(), mpi_n(out), MPI_FLOAT, 0, world_comm());
  });
}

// ---- all-sum-reduce over the whole world, beside MPI_Allreduce ---------------
void all_sum_reduce_fwd_of(benchmark::State& s, bool fixed) {
  auto& L = layers();
  auto layer = fixed ? partita::nn::AllSumReduce(L.all, std::vector<int>{0}, kStatic) : L.allreduce;
  const at::Tensor x = data(count(s), false);
  at::Tensor buf = data(count(s), false), out = data(count(s), false), peer = data(count(s), false);
  paired(
      s, s.range(0), [&] { benchmark::DoNotOptimize(layer(x)); },
      [&] { MPI_Allreduce(buf.data_ptr(), out.data_ptr(), mpi_n(buf), MPI_FLOAT, MPI_SUM, world_comm()); },
      NoPrepare{}, fixed ? std::function<void()>() : gloo_peer([&] { partita::bench::gloo_allreduce(peer); }));
}
void all_sum_reduce_fwd(benchmark::State& s) { all_sum_reduce_fwd_of(s, false); }
void all_sum_reduce_static_fwd(benchmark::State& s) { all_sum_reduce_fwd_of(s, true); }
void all_sum_reduce_fwdbwd(benchmark::State& s) {
  auto& L = layers();
  const at::Tensor x = data(count(s), true);
  const at::Tensor dy = data(count(s), false);
  at::Tensor buf = data(count(s), false), out = data(count(s), false);
  paired(s, s.range(0), [&] { fwdbwd(L.allreduce, x, dy); }, [&] {
    MPI_Allreduce(buf.data_ptr(), out.data_ptr(), mpi_n(buf), MPI_FLOAT, MPI_SUM, world_comm());
    MPI_Allreduce(out.data_ptr(), buf.data_ptr(), mpi_n(buf), MPI_FLOAT, MPI_SUM, world_comm());
  });
}

// ---- all-gather / reduce-scatter over the whole world ---------------------------
// The gathered (or reduced) tensor has the benchmark's size; each rank
// contributes (or keeps) 1/ranks of it.
void all_gather_fwd_of(benchmark::State& s, bool fixed) {
  auto& L = layers();
  auto layer = fixed ? partita::nn::AllGather(L.all, 0, 0, kStatic) : L.allgather;
  const int64_t piece = count(s) / world_size();
  const at::Tensor x = data(piece, false);
  at::Tensor out = data(piece * world_size(), false), in = x.clone();
  std::vector<at::Tensor> pieces;
  for (int r = 0; r < world_size(); ++r) pieces.push_back(data(piece, false));
  paired(
      s, s.range(0), [&] { benchmark::DoNotOptimize(layer(x)); },
      [&] {
        MPI_Allgather(x.data_ptr(), mpi_n(x), MPI_FLOAT, out.data_ptr(), mpi_n(x), MPI_FLOAT, world_comm());
      },
      NoPrepare{}, fixed ? std::function<void()>() : gloo_peer([&] { partita::bench::gloo_allgather(pieces, in); }));
}
void all_gather_fwd(benchmark::State& s) { all_gather_fwd_of(s, false); }
void all_gather_static_fwd(benchmark::State& s) { all_gather_fwd_of(s, true); }
void reduce_scatter_fwd_of(benchmark::State& s, bool fixed) {
  auto& L = layers();
  auto layer = fixed ? partita::nn::ReduceScatter(L.all, 0, 0, kStatic) : L.reducescatter;
  const int64_t piece = count(s) / world_size();
  const at::Tensor x = data(piece * world_size(), false);
  at::Tensor out = data(piece, false);
  std::vector<int> counts(world_size(), static_cast<int>(piece));
  paired(s, s.range(0), [&] { benchmark::DoNotOptimize(layer(x)); }, [&] {
    MPI_Reduce_scatter(x.data_ptr(), out.data_ptr(), counts.data(), MPI_FLOAT, MPI_SUM,
                       world_comm());
  });
}
void reduce_scatter_fwd(benchmark::State& s) { reduce_scatter_fwd_of(s, false); }
void reduce_scatter_static_fwd(benchmark::State& s) { reduce_scatter_fwd_of(s, true); }
// Forward then backward (issue 15, item 5), beside the raw pair: each one's
// adjoint is the other's forward.
void all_gather_fwdbwd(benchmark::State& s) {
  auto& L = layers();
  const int64_t piece = count(s) / world_size();
  const at::Tensor x = data(piece, true), dy = data(piece * world_size(), false);
  at::Tensor out = data(piece * world_size(), false), back = data(piece, false);
  std::vector<int> counts(world_size(), static_cast<int>(piece));
  paired(s, s.range(0), [&] { fwdbwd(L.allgather, x, dy); }, [&] {
    MPI_Allgather(x.data_ptr(), mpi_n(x), MPI_FLOAT, out.data_ptr(), mpi_n(x), MPI_FLOAT,
                  world_comm());
    MPI_Reduce_scatter(dy.data_ptr(), back.data_ptr(), counts.data(), MPI_FLOAT, MPI_SUM,
                       world_comm());
  });
}
void reduce_scatter_fwdbwd(benchmark::State& s) {
  auto& L = layers();
  const int64_t piece = count(s) / world_size();
  const at::Tensor x = data(piece * world_size(), true), dy = data(piece, false);
  at::Tensor out = data(piece, false), back = data(piece * world_size(), false);
  std::vector<int> counts(world_size(), static_cast<int>(piece));
  paired(s, s.range(0), [&] { fwdbwd(L.reducescatter, x, dy); }, [&] {
    MPI_Reduce_scatter(x.data_ptr(), out.data_ptr(), counts.data(), MPI_FLOAT, MPI_SUM,
                       world_comm());
    MPI_Allgather(dy.data_ptr(), mpi_n(dy), MPI_FLOAT, back.data_ptr(), mpi_n(dy), MPI_FLOAT,
                  world_comm());
  });
}

// ---- repartition: rows to columns of a square matrix ------------------------
// P_x = ranks x 1 (row blocks) -> P_y = 1 x ranks (column blocks): every
// pair of ranks exchanges one block, beside MPI_Alltoallv of the same blocks
// already laid out contiguously (no strided access: a lower bound).
// The side of the square matrix of about `s`'s bytes, a multiple of ranks.
int64_t square_side(const benchmark::State& s) {
  int64_t side = 1;
  while ((side + 1) * (side + 1) <= count(s)) ++side;
  return side / world_size() * world_size();
}

// The layer of every rows-to-columns benchmark: P_x = ranks x 1 -> 1 x ranks.
partita::nn::Repartition& rows_to_columns() {
  static std::unique_ptr<partita::nn::Repartition> layer;
  if (!layer) {
    const int p = world_size();
    const auto world = partita::mpi::Partition::world();
    layer = std::make_unique<partita::nn::Repartition>(
        world.create_cartesian_topology_partition({p, 1}),
        world.create_cartesian_topology_partition({1, p}));
  }
  return *layer;
}

void repartition_fwd(benchmark::State& s) {
  const int p = world_size();
  const int64_t side = square_side(s);
  auto& layer = rows_to_columns();
  const at::Tensor x = torch::randn({side / p, side});
  const int64_t block = (side / p) * (side / p);
  at::Tensor send = data(block * p, false), recv = data(block * p, false);
  std::vector<int> counts(p, static_cast<int>(block)), displs(p);
  for (int i = 0; i < p; ++i) displs[i] = i * static_cast<int>(block);
  paired(s, side * side * 4, [&] { benchmark::DoNotOptimize(layer(x)); }, [&] {
    MPI_Alltoallv(send.data_ptr(), counts.data(), displs.data(), MPI_FLOAT, recv.data_ptr(),
                  counts.data(), displs.data(), MPI_FLOAT, world_comm());
  });
}

// The same repartition beside the fair twin (issue 15): what a competent MPI
// programmer writes for this transpose of row blocks into column blocks.
// Pack each destination's column block (rows of side/p floats, strided in
// x) into a contiguous send buffer, one MPI_Alltoallv, and receive straight
// into the output, where each source's block is a contiguous run of rows
// (so there is nothing to unpack). repartition_fwd's contiguous Alltoallv,
// without the packing, stays as the lower bound. The reverse (the adjoint)
// sends each source's rows of the gradient as they are and unpacks them
// into the strided columns of the input's gradient.
struct PackedTranspose {
  int p = world_size();
  int64_t side, b;
  std::vector<int> counts, displs;
  at::Tensor packed, landing;
  explicit PackedTranspose(int64_t side_) : side(side_), b(side_ / world_size()) {
    counts.assign(p, static_cast<int>(b * b));
    for (int i = 0; i < p; ++i) displs.push_back(i * static_cast<int>(b * b));
    packed = data(b * side, false);
    landing = data(b * side, false);
  }
  // x [b, side] row block -> out [side, b] column block.
  void forward(const at::Tensor& x, at::Tensor& out) {
    const float* src = x.data_ptr<float>();
    float* buf = packed.data_ptr<float>();
    for (int j = 0; j < p; ++j)
      for (int64_t r = 0; r < b; ++r)
        std::memcpy(buf + j * b * b + r * b, src + r * side + j * b, b * sizeof(float));
    MPI_Alltoallv(buf, counts.data(), displs.data(), MPI_FLOAT, out.data_ptr(), counts.data(),
                  displs.data(), MPI_FLOAT, world_comm());
  }
  // dy [side, b] -> dx [b, side].
  void reverse(const at::Tensor& dy, at::Tensor& dx) {
    MPI_Alltoallv(dy.data_ptr(), counts.data(), displs.data(), MPI_FLOAT, landing.data_ptr(),
                  counts.data(), displs.data(), MPI_FLOAT, world_comm());
    const float* l = landing.data_ptr<float>();
    float* g = dx.data_ptr<float>();
    for (int j = 0; j < p; ++j)
      for (int64_t r = 0; r < b; ++r)
        std::memcpy(g + r * side + j * b, l + j * b * b + r * b, b * sizeof(float));
  }
};
void repartition_packed_fwd(benchmark::State& s) {
  PackedTranspose t(square_side(s));
  const at::Tensor x = torch::randn({t.b, t.side});
  at::Tensor out = data(t.b * t.side, false);
  paired(s, t.side * t.side * 4, [&] { benchmark::DoNotOptimize(rows_to_columns()(x)); },
         [&] { t.forward(x, out); });
}
void repartition_packed_fwdbwd(benchmark::State& s) {
  PackedTranspose t(square_side(s));
  const at::Tensor x = torch::randn({t.b, t.side}).requires_grad_(true);
  const at::Tensor dy = torch::randn({t.side, t.b});
  at::Tensor out = data(t.b * t.side, false), dx = data(t.b * t.side, false);
  paired(s, t.side * t.side * 4, [&] { fwdbwd(rows_to_columns(), x, dy); }, [&] {
    t.forward(x, out);
    t.reverse(dy, dx);
  });
}

// The same repartition with the two exchanges, timed in the same
// iterations: the "twin" here is partita's own MPI_Ialltoallw exchange, so
// the ratio is point-to-point / alltoallw (the measurement behind the
// default, docs/benchmarks.md).
void repartition_p2p_vs_alltoallw(benchmark::State& s) {
  const int p = world_size();
  const int64_t side = square_side(s);
  static std::unique_ptr<partita::nn::Repartition> p2p, a2aw;
  if (!p2p) {
    const auto world = partita::mpi::Partition::world();
    const auto rows = world.create_cartesian_topology_partition({p, 1});
    const auto cols = world.create_cartesian_topology_partition({1, p});
    p2p = std::make_unique<partita::nn::Repartition>(rows, cols,
                                                      partita::nn::RepartitionExchange::kPointToPoint);
    a2aw = std::make_unique<partita::nn::Repartition>(rows, cols,
                                                       partita::nn::RepartitionExchange::kAlltoallw);
  }
  const at::Tensor x = torch::randn({side / p, side});
  paired(s, side * side * 4, [&] { benchmark::DoNotOptimize((*p2p)(x)); },
         [&] { benchmark::DoNotOptimize((*a2aw)(x)); });
}
// ---- halo exchange: a 1-D decomposition of rows, one ghost row each side ----
// P_x = ranks x 1; each window is 4 rows (2 of bulk) of size/4 floats, so
// every ghost row, and every message, has the benchmark's size. The raw twin
// is the hand-written exchange: two MPI_Sendrecv of contiguous rows, in
// place (MPI_PROC_NULL at the ends). partita returns a new tensor, so it
// also copies the window.
void halo_exchange_fwd(benchmark::State& s) {
  const int p = world_size(), me = world_rank();
  static std::unique_ptr<partita::nn::HaloExchange> layer;
  if (!layer)
    layer = std::make_unique<partita::nn::HaloExchange>(
        partita::mpi::Partition::world().create_cartesian_topology_partition({p, 1}),
        partita::Shape{1, 0}, partita::Shape{1, 0});
  const int64_t cols = count(s);
  const at::Tensor x = torch::randn({4, cols});
  at::Tensor w = torch::randn({4, cols});
  float* row = w.data_ptr<float>();
  const int n = static_cast<int>(cols);
  const int up = me > 0 ? me - 1 : MPI_PROC_NULL, down = me + 1 < p ? me + 1 : MPI_PROC_NULL;
  paired(s, s.range(0), [&] { benchmark::DoNotOptimize((*layer)(x)); }, [&] {
    // first bulk row up, last ghost row from below; last bulk row down,
    // first ghost row from above.
    MPI_Sendrecv(row + 1 * cols, n, MPI_FLOAT, up, 0, row + 3 * cols, n, MPI_FLOAT, down, 0,
                 world_comm(), MPI_STATUS_IGNORE);
    MPI_Sendrecv(row + 2 * cols, n, MPI_FLOAT, down, 1, row + 0 * cols, n, MPI_FLOAT, up, 1,
                 world_comm(), MPI_STATUS_IGNORE);
  });
}

// ---- halo exchange in place (DistDL's form, halo_exchange_; issue 15) ----
// The same exchange without the copy of the window: the twin is unchanged.
struct HaloBench {
  std::unique_ptr<partita::nn::HaloExchange> layer;
  int up = MPI_PROC_NULL, down = MPI_PROC_NULL;
  HaloBench() {
    const int p = world_size(), me = world_rank();
    layer = std::make_unique<partita::nn::HaloExchange>(
        partita::mpi::Partition::world().create_cartesian_topology_partition({p, 1}),
        partita::Shape{1, 0}, partita::Shape{1, 0},
        partita::nn::HaloExchangeImpl::Storage::kInPlace);
    if (me > 0) up = me - 1;
    if (me + 1 < p) down = me + 1;
  }
  // The hand-written exchange on rows of `w` (halo_exchange_fwd's twin).
  void raw(float* row, int64_t cols) const {
    const int n = static_cast<int>(cols);
    MPI_Sendrecv(row + 1 * cols, n, MPI_FLOAT, up, 0, row + 3 * cols, n, MPI_FLOAT, down, 0,
                 world_comm(), MPI_STATUS_IGNORE);
    MPI_Sendrecv(row + 2 * cols, n, MPI_FLOAT, down, 1, row + 0 * cols, n, MPI_FLOAT, up, 1,
                 world_comm(), MPI_STATUS_IGNORE);
  }
  // ... and its adjoint: the ghost rows' gradients travel back, are added
  // into the bulk rows they came from, and are zeroed.
  void raw_adjoint(float* row, float* landing, int64_t cols) const {
    const int n = static_cast<int>(cols);
    MPI_Sendrecv(row + 3 * cols, n, MPI_FLOAT, down, 2, landing, n, MPI_FLOAT, up, 2,
                 world_comm(), MPI_STATUS_IGNORE);
    MPI_Sendrecv(row + 0 * cols, n, MPI_FLOAT, up, 3, landing + cols, n, MPI_FLOAT, down, 3,
                 world_comm(), MPI_STATUS_IGNORE);
    if (up != MPI_PROC_NULL)
      for (int64_t j = 0; j < cols; ++j) row[1 * cols + j] += landing[j], row[j] = 0;
    if (down != MPI_PROC_NULL)
      for (int64_t j = 0; j < cols; ++j) row[2 * cols + j] += landing[cols + j], row[3 * cols + j] = 0;
  }
};
HaloBench& halo_bench() {
  static std::unique_ptr<HaloBench> h;
  if (!h) h = std::make_unique<HaloBench>();
  return *h;
}
void halo_exchange_inplace_fwd(benchmark::State& s) {
  auto& H = halo_bench();
  const int64_t cols = count(s);
  const at::Tensor x = torch::randn({4, cols});
  at::Tensor w = torch::randn({4, cols});
  paired(s, s.range(0), [&] { benchmark::DoNotOptimize((*H.layer)(x)); },
         [&] { H.raw(w.data_ptr<float>(), cols); });
}
// The out-of-place halo beside its fair twin (issue 34 item 3): the same
// copy of the window into a buffer of the twin's own (allocated once, as a
// competent MPI programmer would), then the same exchange on it.
// halo_exchange_fwd's twin is the exchange alone.
void halo_exchange_copy_fwd(benchmark::State& s) {
  static std::unique_ptr<partita::nn::HaloExchange> layer;
  if (!layer)
    layer = std::make_unique<partita::nn::HaloExchange>(
        partita::mpi::Partition::world().create_cartesian_topology_partition({world_size(), 1}),
        partita::Shape{1, 0}, partita::Shape{1, 0});
  auto& H = halo_bench();
  const int64_t cols = count(s);
  const at::Tensor x = torch::randn({4, cols});
  at::Tensor w = torch::randn({4, cols});
  paired(s, s.range(0), [&] { benchmark::DoNotOptimize((*layer)(x)); }, [&] {
    std::memcpy(w.data_ptr<float>(), x.data_ptr<float>(), x.nbytes());
    H.raw(w.data_ptr<float>(), cols);
  });
}
// Forward, then the adjoint of a gradient that only the exchange holds (as
// one arriving from the next layer's backward: the loss sum(y * c) hands
// its node a fresh one, which the adjoint reuses in place). The twin does
// the same arithmetic: the product and its sum, the gradient c, the raw
// exchange and its adjoint.
// `exchange` false: the floor under the halo's row
// (halo_exchange_autograd_floor_fwdbwd), the same user graph, (x * c).sum()
// on a clone of a leaf and its backward, with no exchange in it (LibTorch's
// autograd alone), beside the same raw twin. Partita's own share of the
// in-place halo's forward + backward is what the halo's row costs over the
// floor's time plus the twin's.
void halo_fwdbwd(benchmark::State& s, bool exchange) {
  auto& H = halo_bench();
  const int64_t cols = count(s);
  const at::Tensor leaf = torch::randn({4, cols}).requires_grad_(true);
  const at::Tensor c = torch::randn({4, cols});
  at::Tensor x;
  at::Tensor w = torch::randn({4, cols}), landing = torch::empty({2, cols});
  paired(
      s, s.range(0),
      [&] {
        at::Tensor y = exchange ? (*H.layer)(x) : x;
        (y * c).sum().backward();
        leaf.mutable_grad().reset();
      },
      [&] {
        H.raw(w.data_ptr<float>(), cols);
        benchmark::DoNotOptimize((w * c).sum());
        at::Tensor g = c * at::ones({}, c.options());  // the fresh gradient
        H.raw_adjoint(g.data_ptr<float>(), landing.data_ptr<float>(), cols);
        benchmark::DoNotOptimize(g);
      },
      [&] { x = leaf.clone(); });  // not a leaf; its backward passes the gradient on
}
void halo_exchange_inplace_fwdbwd(benchmark::State& s) { halo_fwdbwd(s, true); }
void halo_exchange_autograd_floor_fwdbwd(benchmark::State& s) { halo_fwdbwd(s, false); }

// The adjoint alone: the halo's autograd node applied to a gradient only it
// holds (as the engine hands one over), beside the hand-written adjoint
// (the ghost rows back, added into the bulk, zeroed): paired.hpp's
// adjoint_alone. The fwdbwd row adds LibTorch's engine over the user's
// whole graph.
void halo_exchange_inplace_adj(benchmark::State& s) {
  auto& H = halo_bench();
  const int64_t cols = count(s);
  const at::Tensor leaf = torch::randn({4, cols}).requires_grad_(true);
  const at::Tensor c = torch::randn({4, cols});
  at::Tensor w = torch::randn({4, cols}), landing = torch::empty({2, cols});
  adjoint_alone(
      s, s.range(0), c, [&] { return (*H.layer)(leaf.clone()); },
      [&] { H.raw_adjoint(w.data_ptr<float>(), landing.data_ptr<float>(), cols); });
}

// ---- the fair forward+backward twins (issue 34 item 4) ----------------------
using partita::bench::RawKind;
void broadcast_fair_fwdbwd(benchmark::State& s) {
  const at::Tensor x = world_rank() == 0 ? data(count(s), true) : empty(true);
  fair_fwdbwd(s, layers().bcast, x, RawKind::kBcast, count(s));
}
void sum_reduce_fair_fwdbwd(benchmark::State& s) {
  fair_fwdbwd(s, layers().reduce, data(count(s), true), RawKind::kReduce);
}
void all_sum_reduce_fair_fwdbwd(benchmark::State& s) {
  fair_fwdbwd(s, layers().allreduce, data(count(s), true), RawKind::kAllreduce);
}
void all_gather_fair_fwdbwd(benchmark::State& s) {
  fair_fwdbwd(s, layers().allgather, data(count(s) / world_size(), true), RawKind::kAllgather);
}
void reduce_scatter_fair_fwdbwd(benchmark::State& s) {
  const int64_t piece = count(s) / world_size();
  fair_fwdbwd(s, layers().reducescatter, data(piece * world_size(), true), RawKind::kReduceScatter);
}

// 4 KiB to 16 MiB by factors of 4.
void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes = 4 << 10; bytes <= 16 << 20; bytes *= 4) b->Arg(bytes);
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(broadcast_fwd)->Apply(sizes);
BENCHMARK(broadcast_fwdbwd)->Apply(sizes);
BENCHMARK(sum_reduce_fwd)->Apply(sizes);
BENCHMARK(sum_reduce_fwdbwd)->Apply(sizes);
BENCHMARK(all_sum_reduce_fwd)->Apply(sizes);
BENCHMARK(all_sum_reduce_fwdbwd)->Apply(sizes);
BENCHMARK(all_gather_fwd)->Apply(sizes);
BENCHMARK(reduce_scatter_fwd)->Apply(sizes);
BENCHMARK(all_gather_fwdbwd)->Apply(sizes);
BENCHMARK(reduce_scatter_fwdbwd)->Apply(sizes);
BENCHMARK(repartition_fwd)->Apply(sizes);
BENCHMARK(repartition_packed_fwd)->Apply(sizes);
BENCHMARK(repartition_packed_fwdbwd)->Apply(sizes);
BENCHMARK(halo_exchange_fwd)->Apply(sizes);
BENCHMARK(halo_exchange_copy_fwd)->Apply(sizes);
BENCHMARK(halo_exchange_inplace_fwd)->Apply(sizes);
BENCHMARK(halo_exchange_inplace_fwdbwd)->Apply(sizes);
BENCHMARK(halo_exchange_autograd_floor_fwdbwd)->Apply(sizes);
BENCHMARK(halo_exchange_inplace_adj)->Apply(sizes);
BENCHMARK(repartition_p2p_vs_alltoallw)->Apply(sizes);
BENCHMARK(broadcast_static_fwd)->Apply(sizes);
BENCHMARK(broadcast_fair_fwdbwd)->Apply(sizes);
BENCHMARK(sum_reduce_fair_fwdbwd)->Apply(sizes);
BENCHMARK(all_sum_reduce_fair_fwdbwd)->Apply(sizes);
BENCHMARK(all_gather_fair_fwdbwd)->Apply(sizes);
BENCHMARK(reduce_scatter_fair_fwdbwd)->Apply(sizes);
BENCHMARK(sum_reduce_static_fwd)->Apply(sizes);
BENCHMARK(all_sum_reduce_static_fwd)->Apply(sizes);
BENCHMARK(all_gather_static_fwd)->Apply(sizes);
BENCHMARK(reduce_scatter_static_fwd)->Apply(sizes);

// Each benchmark's raw-MPI twin, recorded in the JSON context: those of
// `<primitive>_fwd` and `<primitive>_fwdbwd` from the case runner's table
// (primitive_table.hpp), the variants' here.
const std::map<std::string, std::string>& twins() {
  static const std::map<std::string, std::string> t = [] {
    std::map<std::string, std::string> m = {
        {"repartition_packed_fwd", "pack column blocks + MPI_Alltoallv into the output"},
        {"broadcast_fair_fwdbwd", "autograd Function: MPI_Bcast, backward MPI_Reduce"},
        {"sum_reduce_fair_fwdbwd", "autograd Function: MPI_Reduce, backward MPI_Bcast"},
        {"all_sum_reduce_fair_fwdbwd", "autograd Function: MPI_Allreduce, backward MPI_Allreduce"},
        {"all_gather_fair_fwdbwd", "autograd Function: MPI_Allgather, backward MPI_Reduce_scatter_block"},
        {"reduce_scatter_fair_fwdbwd", "autograd Function: MPI_Reduce_scatter_block, backward MPI_Allgather"},
        {"repartition_packed_fwdbwd", "packed MPI_Alltoallv, then the reverse MPI_Alltoallv + unpack"},
        {"repartition_p2p_vs_alltoallw", "partita's MPI_Ialltoallw exchange"},
        {"halo_exchange_copy_fwd", "memcpy of the window + 2 x MPI_Sendrecv"},
        {"halo_exchange_inplace_fwd", "2 x MPI_Sendrecv (in place)"},
        {"halo_exchange_inplace_fwdbwd", "2 x MPI_Sendrecv, y*c summed, 2 x MPI_Sendrecv + add (adjoint)"},
        {"halo_exchange_autograd_floor_fwdbwd", "the same twin as halo_exchange_inplace_fwdbwd (ours: the user graph's autograd alone, no exchange)"},
        {"halo_exchange_inplace_adj", "2 x MPI_Sendrecv + add (the adjoint; ours: the halo's node applied, no engine)"},
    };
    for (const auto& e : partita::testing::primitive_table()) {
      if (e.linear) continue;  // linear_bench.cpp's
      if (!e.twin_fwd.empty()) m[e.name + "_fwd"] = e.twin_fwd;
      // The static-shapes rows of the five team primitives: the same twin.
      for (const char* team : {"broadcast", "sum_reduce", "all_sum_reduce", "all_gather", "reduce_scatter"})
        if (e.name == team) m[e.name + "_static_fwd"] = e.twin_fwd;
      if (!e.twin_fwdbwd.empty()) m[e.name + "_fwdbwd"] = e.twin_fwdbwd;
    }
    return m;
  }();
  return t;
}

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  partita::mpi::Environment env(&argc, &argv);
  torch::set_num_threads(1);
  // Only rank 0 writes files: the others drop --benchmark_out*. Random
  // interleaving shuffles differently on every rank, so the ranks would run
  // different benchmarks at once and wait for each other forever: refused.
  std::vector<char*> args(argv, argv + argc);
  for (int i = 1; i < argc; ++i)
    if (std::strstr(argv[i], "random_interleaving") && !std::strstr(argv[i], "=false")) {
      if (world_rank() == 0)
        std::fprintf(stderr, "bench_primitives: random interleaving would deadlock under MPI "
                             "(each rank shuffles differently); run without it\n");
      return 2;
    }
  if (world_rank() != 0)
    args.erase(std::remove_if(args.begin() + 1, args.end(),
                              [](char* a) { return std::strncmp(a, "--benchmark_out", 15) == 0; }),
               args.end());
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  char library[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(library, &len);
  std::string first_line(library, static_cast<size_t>(len));
  first_line = first_line.substr(0, first_line.find('\n'));
  benchmark::AddCustomContext("mpi_library", first_line);
  benchmark::AddCustomContext("libtorch", TORCH_VERSION);
  benchmark::AddCustomContext("ranks", std::to_string(world_size()));
  for (const auto& [name, twin] : twins()) benchmark::AddCustomContext("twin:" + name, twin);
  if (partita::bench::gloo_available())
    for (const auto& [name, call] : kGlooPeers)
      benchmark::AddCustomContext("peer:" + name, partita::bench::gloo_description(call));
  for (const auto& [name, twin] : partita::bench::communicator_twins())
    benchmark::AddCustomContext("twin:" + name, twin);
  for (const auto& [name, twin] : partita::bench::linear_twins())
    benchmark::AddCustomContext("twin:" + name, twin);
  size_t ran = 0;
  if (world_rank() == 0) {
    ran = benchmark::RunSpecifiedBenchmarks();
  } else {
    NullReporter quiet;
    ran = benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  // A filter that matches nothing is a mistake, not a pass.
  return ran > 0 ? 0 : 1;
}
