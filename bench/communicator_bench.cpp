// The differentiable communicator (issue 12) beside the raw MPI calls that
// move the same bytes, timed in the same iterations (paired.hpp):
//
//   comm_allreduce  allreduce(x, SUM)                  vs MPI_Allreduce
//   comm_bcast      bcast_(x, 0)                       vs MPI_Bcast
//   comm_alltoall   alltoall(x[1, n], 0, 1, n / p)     vs MPI_Alltoall of n / p floats
//   comm_ring       isend right, irecv left, 2 waits   vs MPI_Isend + MPI_Irecv + MPI_Waitall
//   comm_{bcast,alltoall}_static_fwd  the forward with a StaticShapes promise
//   comm_alltoall_out{,_static}_fwd  alltoall_out into a tensor made once (as
//                   the twin's receive buffer), without and with a promise
//   comm_{allreduce,alltoall}_fair_fwdbwd  forward+backward against the raw
//                   calls as their own autograd Function (raw_autograd.hpp);
//                   comm_alltoall_static_fair_fwdbwd the same with a promise
//
// "_fwd" is the forward call; "_fwdbwd" forward then backward, beside the
// raw calls of both directions (allreduce twice; bcast + reduce; alltoall
// twice; the ring both ways). The ring's forward+backward is the seed's
// graph with join_dummies / join_dummies_handle. "_adj" is the adjoint
// alone: the call's node applied to a gradient, no autograd engine, beside
// the raw call of the adjoint direction. Sizes are the bytes of the
// float32 tensor each rank passes. Floors under these rows:
// mpi_nonblocking_* time MPICH's non-blocking collectives finished by a loop
// of tests (what every call ran before blocking calls, docs/mpi-runtime.md,
// and still runs under a deadline or the yield policy) against the blocking
// ones (which the twins call, and partita under the spin policy),
// mpi_exchange_then_alltoall{,_fresh} the communicator's alltoall in MPI calls
// alone (into a fixed or a new receive buffer), mpi_exchange_then_bcast
// bcast_'s,
// mpi_exchange_{with,then}_allreduce the header agreement posted with, or
// before, the data collective,
// mpi_ring_fresh_recv the ring's, and
// comm_autograd_floor{,8}_fwdbwd LibTorch's autograd alone (no MPI).
#include <torch/torch.h>

#include "paired.hpp"
#include "raw_autograd.hpp"
#include "partita/mpi/communicator.hpp"

namespace partita::bench {

namespace {

using partita::mpi::Communicator;
using partita::bench::RawExchange;
using partita::bench::RawKind;

const Communicator& comm() {
  static const Communicator c = Communicator::world();
  return c;
}
int64_t floats(const benchmark::State& s) { return s.range(0) / 4; }
int n_of(const at::Tensor& t) { return static_cast<int>(t.numel()); }
at::Tensor data(int64_t n) { return torch::randn({n}); }

void backward_and_reset(const at::Tensor& y, const at::Tensor& dy, const at::Tensor& x) {
  torch::autograd::backward({y}, {dy});
  x.mutable_grad().reset();
}

// ---- allreduce ------------------------------------------------------------
void comm_allreduce_fwd(benchmark::State& s) {
  const at::Tensor x = data(floats(s));
  at::Tensor buf = data(floats(s)), out = data(floats(s));
  paired(s, s.range(0), [&] { benchmark::DoNotOptimize(comm().allreduce(x, ReduceOp::kSum)); },
         [&] {
           MPI_Allreduce(buf.data_ptr(), out.data_ptr(), n_of(buf), MPI_FLOAT, MPI_SUM,
                         world_comm());
         });
}
void comm_allreduce_fwdbwd(benchmark::State& s) {
  const at::Tensor x = data(floats(s)).requires_grad_();
  const at::Tensor dy = data(floats(s));
  at::Tensor buf = data(floats(s)), out = data(floats(s));
  paired(s, s.range(0),
         [&] { backward_and_reset(comm().allreduce(x, ReduceOp::kSum), dy, x); },
         [&] {
           MPI_Allreduce(buf.data_ptr(), out.data_ptr(), n_of(buf), MPI_FLOAT, MPI_SUM,
                         world_comm());
           MPI_Allreduce(out.data_ptr(), buf.data_ptr(), n_of(buf), MPI_FLOAT, MPI_SUM,
                         world_comm());
         });
}

// The fair twin (issue 34 item 4, raw_autograd.hpp): forward and backward
// of the raw calls as one autograd Function, on a flat copy of the input.
void fair_fwdbwd(benchmark::State& s, const at::Tensor& x, const at::Tensor& dy,
                 const std::function<at::Tensor(const at::Tensor&)>& call, RawKind kind) {
  const at::Tensor xr = x.detach().reshape({-1}).clone().requires_grad_(true);
  const at::Tensor dyr = data(xr.numel());
  paired(s, s.range(0), [&] { backward_and_reset(call(x), dy, x); },
         [&] { backward_and_reset(RawExchange::apply_to(xr, kind), dyr, xr); });
}
void comm_allreduce_fair_fwdbwd(benchmark::State& s) {
  const at::Tensor x = data(floats(s)).requires_grad_();
  fair_fwdbwd(s, x, data(floats(s)),
              [](const at::Tensor& v) { return comm().allreduce(v, ReduceOp::kSum); },
              RawKind::kAllreduce);
}

// ---- bcast_ (in place, from rank 0) -------------------------------------------
// (`site`: a StaticShapes promise, the `_static_fwd` rows; docs/static-shapes.md.)
void bcast_fwd(benchmark::State& s, const mpi::StaticShapes& site) {
  at::Tensor x = data(floats(s));
  at::Tensor buf = data(floats(s));
  paired(s, s.range(0), [&] { benchmark::DoNotOptimize(comm().bcast_(x, 0, site)); },
         [&] { MPI_Bcast(buf.data_ptr(), n_of(buf), MPI_FLOAT, 0, world_comm()); });
}
void comm_bcast_fwd(benchmark::State& s) { bcast_fwd(s, {}); }
void comm_bcast_static_fwd(benchmark::State& s) { bcast_fwd(s, mpi::StaticShapes::promise()); }
void comm_bcast_fwdbwd(benchmark::State& s) {
  const at::Tensor x = data(floats(s)).requires_grad_();
  const at::Tensor dy = data(floats(s));
  at::Tensor buf = data(floats(s)), out = data(floats(s));
  paired(s, s.range(0), [&] { backward_and_reset(comm().bcast_(x, 0), dy, x); }, [&] {
    MPI_Bcast(buf.data_ptr(), n_of(buf), MPI_FLOAT, 0, world_comm());
    MPI_Reduce(buf.data_ptr(), out.data_ptr(), n_of(buf), MPI_FLOAT, MPI_SUM, 0, world_comm());
  });
}

// ---- alltoall: a [1, n] row, piece j to rank j, gathered along axis 0 --------
// (the receive buffer is the output: no copy on either side)
struct AlltoallRow {
  int p = world_size();
  int64_t piece;
  at::Tensor x, dy, send, recv;  // the input, a cotangent of the output's shape, the twin's
  AlltoallRow(const benchmark::State& s, bool grad) : piece(floats(s) / p) {
    x = data(piece * p).view({1, piece * p}).requires_grad_(grad);
    dy = data(piece * p).view({p, piece});
    send = data(piece * p);
    recv = data(piece * p);
  }
  mpi::StaticShapes site;  // none, or a promise (comm_alltoall_static_fwd)
  at::Tensor call() const { return comm().alltoall(x, 0, 1, piece, site); }
  // Into a [p, piece] tensor made once, as the twin's receive buffer.
  at::Tensor out = torch::empty({p, piece});
  at::Tensor& call_out() { return comm().alltoall_out(out, x, 0, 1, piece, site); }
  void raw(bool back = false) {
    MPI_Alltoall(back ? recv.data_ptr() : send.data_ptr(), static_cast<int>(piece), MPI_FLOAT,
                 back ? send.data_ptr() : recv.data_ptr(), static_cast<int>(piece), MPI_FLOAT,
                 world_comm());
  }
};
// The forward rows: with or without a promise, into a new tensor or `out`.
void alltoall_fwd(benchmark::State& s, bool promise, bool into) {
  AlltoallRow a(s, false);
  if (promise) a.site = mpi::StaticShapes::promise();
  paired(s, s.range(0), [&] {
    if (into) benchmark::DoNotOptimize(a.call_out());
    else benchmark::DoNotOptimize(a.call());
  }, [&] { a.raw(); });
}
void comm_alltoall_fwd(benchmark::State& s) { alltoall_fwd(s, false, false); }
void comm_alltoall_static_fwd(benchmark::State& s) { alltoall_fwd(s, true, false); }
void comm_alltoall_out_fwd(benchmark::State& s) { alltoall_fwd(s, false, true); }
void comm_alltoall_out_static_fwd(benchmark::State& s) { alltoall_fwd(s, true, true); }
// The fair forward+backward rows (raw_autograd.hpp), with or without a promise.
void alltoall_fair_fwdbwd(benchmark::State& s, bool promise) {
  AlltoallRow a(s, true);
  if (promise) a.site = mpi::StaticShapes::promise();
  fair_fwdbwd(s, a.x, a.dy, [&](const at::Tensor&) { return a.call(); }, RawKind::kAlltoall);
}
void comm_alltoall_fair_fwdbwd(benchmark::State& s) { alltoall_fair_fwdbwd(s, false); }
void comm_alltoall_static_fair_fwdbwd(benchmark::State& s) { alltoall_fair_fwdbwd(s, true); }
void comm_alltoall_fwdbwd(benchmark::State& s) {
  AlltoallRow a(s, true);
  paired(s, s.range(0), [&] { backward_and_reset(a.call(), a.dy, a.x); }, [&] {
    a.raw();
    a.raw(true);
  });
}

// ---- the isend/irecv ring -----------------------------------------------------
void raw_ring(at::Tensor& send, at::Tensor& recv, int to, int from) {
  MPI_Request req[2];
  MPI_Irecv(recv.data_ptr(), n_of(recv), MPI_FLOAT, from, 0, world_comm(), &req[0]);
  MPI_Isend(send.data_ptr(), n_of(send), MPI_FLOAT, to, 0, world_comm(), &req[1]);
  MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
}
void comm_ring_fwd(benchmark::State& s) {
  const int next = (world_rank() + 1) % world_size();
  const int prev = (world_rank() - 1 + world_size()) % world_size();
  const at::Tensor x = data(floats(s));
  at::Tensor send = data(floats(s)), recv = data(floats(s));
  paired(s, s.range(0),
         [&] {
           auto r = comm().irecv(x, prev, 0);
           auto h = comm().isend(x, next, 0);
           benchmark::DoNotOptimize(comm().wait(r));
           comm().wait(h);
         },
         [&] { raw_ring(send, recv, next, prev); });
}
void comm_ring_fwdbwd(benchmark::State& s) {
  const int next = (world_rank() + 1) % world_size();
  const int prev = (world_rank() - 1 + world_size()) % world_size();
  const at::Tensor a = data(floats(s)).requires_grad_();
  const at::Tensor dy = data(floats(s));
  at::Tensor send = data(floats(s)), recv = data(floats(s));
  paired(s, s.range(0),
         [&] {
           auto h = comm().isend(a, next, 0);
           auto rh = comm().irecv(mpi::join_dummies(torch::empty_like(a), {h.dummy()}), prev, 0);
           at::Tensor b = comm().wait(rh);
           at::Tensor w = comm().wait(mpi::join_dummies_handle(h, {b}));
           backward_and_reset(mpi::join_dummies(b, {w}), dy, a);
         },
         [&] {
           raw_ring(send, recv, next, prev);
           raw_ring(recv, send, prev, next);
         });
}

// ---- the adjoints alone (paired.hpp's adjoint_alone) ---------------------------
// The call's node applied to a gradient only it holds, no engine, beside the
// raw call of the adjoint direction: allreduce's is an allreduce, bcast_'s a
// sum-reduce to the root (zeros elsewhere), alltoall's the reverse alltoall.
void comm_allreduce_adj(benchmark::State& s) {
  const at::Tensor x = data(floats(s)).requires_grad_();
  const at::Tensor dy = data(floats(s));
  at::Tensor buf = data(floats(s)), out = data(floats(s));
  adjoint_alone(s, s.range(0), dy, [&] { return comm().allreduce(x, ReduceOp::kSum); }, [&] {
    MPI_Allreduce(buf.data_ptr(), out.data_ptr(), n_of(buf), MPI_FLOAT, MPI_SUM, world_comm());
  });
}
void comm_bcast_adj(benchmark::State& s) {
  const at::Tensor x = data(floats(s)).requires_grad_();
  const at::Tensor dy = data(floats(s));
  at::Tensor buf = data(floats(s)), out = data(floats(s));
  adjoint_alone(s, s.range(0), dy, [&] { return comm().bcast_(x, 0); }, [&] {
    MPI_Reduce(buf.data_ptr(), out.data_ptr(), n_of(buf), MPI_FLOAT, MPI_SUM, 0, world_comm());
  });
}
void comm_alltoall_adj(benchmark::State& s) {
  AlltoallRow a(s, true);
  adjoint_alone(s, s.range(0), a.dy, [&] { return a.call(); }, [&] { a.raw(); });
}

// ---- the floor: LibTorch's autograd engine alone ------------------------------
// A custom Function that moves nothing (forward: a fresh tensor like x, as
// every communicator call returns; backward: the incoming gradient), chained
// `nodes` times after a leaf, forward then backward(), beside the same
// allocation without a graph. What every _fwdbwd row pays before any
// message: building the graph, the engine's backward() call, one node per
// call and the leaf's gradient (AccumulateGrad). One node is allreduce's
// graph; the ring's has eight.
struct NoOp : torch::autograd::Function<NoOp> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) {
    return at::empty_like(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list g) {
    return g;
  }
};
void autograd_floor(benchmark::State& s, int nodes) {
  const at::Tensor x = data(floats(s)).requires_grad_();
  const at::Tensor dy = data(floats(s));
  paired(s, s.range(0),
         [&] {
           at::Tensor y = x;
           for (int k = 0; k < nodes; ++k) y = NoOp::apply(y);
           backward_and_reset(y, dy, x);
         },
         [&] { benchmark::DoNotOptimize(at::empty_like(x)); });
}
void comm_autograd_floor_fwdbwd(benchmark::State& s) { autograd_floor(s, 1); }
void comm_autograd_floor8_fwdbwd(benchmark::State& s) { autograd_floor(s, 8); }

// ---- MPICH's non-blocking collectives against its blocking ones ---------------
// Every communicator call posts the non-blocking collective and finishes it
// under partita's waiting policy (mpi::wait: test + yield, deadline mode),
// where the twins call the blocking one; MPICH runs the two with different
// algorithms. These rows time exactly that difference (no LibTorch, no
// checks): MPI_I<call> + mpi::wait beside MPI_<call>, the same buffers.
template <typename Post, typename Blocking>
void nonblocking(benchmark::State& s, Post&& post, Blocking&& blocking) {
  paired(s, s.range(0),
         [&] {
           // Finished by a loop of tests, as partita's own waiting loop does
           // under the spin policy (mpi::wait would call MPI_Wait where
           // blocking calls are on).
           MPI_Request req;
           post(&req);
           for (int done = 0; !done;) MPI_Test(&req, &done, MPI_STATUS_IGNORE);
         },
         blocking);
}
void mpi_nonblocking_allreduce(benchmark::State& s) {
  at::Tensor buf = data(floats(s)), out = data(floats(s));
  nonblocking(
      s,
      [&](MPI_Request* r) {
        MPI_Iallreduce(buf.data_ptr(), out.data_ptr(), n_of(buf), MPI_FLOAT, MPI_SUM,
                       world_comm(), r);
      },
      [&] {
        MPI_Allreduce(buf.data_ptr(), out.data_ptr(), n_of(buf), MPI_FLOAT, MPI_SUM, world_comm());
      });
}
// (The header exchange of every layer's per-call agreement is an allgather.)
void mpi_nonblocking_allgather(benchmark::State& s) {
  const int piece = static_cast<int>(floats(s) / world_size());
  at::Tensor send = data(piece), recv = data(static_cast<int64_t>(piece) * world_size());
  nonblocking(
      s,
      [&](MPI_Request* r) {
        MPI_Iallgather(send.data_ptr(), piece, MPI_FLOAT, recv.data_ptr(), piece, MPI_FLOAT,
                       world_comm(), r);
      },
      [&] {
        MPI_Allgather(send.data_ptr(), piece, MPI_FLOAT, recv.data_ptr(), piece, MPI_FLOAT,
                      world_comm());
      });
}
void mpi_nonblocking_bcast(benchmark::State& s) {
  at::Tensor buf = data(floats(s));
  nonblocking(
      s, [&](MPI_Request* r) { MPI_Ibcast(buf.data_ptr(), n_of(buf), MPI_FLOAT, 0, world_comm(), r); },
      [&] { MPI_Bcast(buf.data_ptr(), n_of(buf), MPI_FLOAT, 0, world_comm()); });
}
void mpi_nonblocking_reduce(benchmark::State& s) {
  at::Tensor buf = data(floats(s)), out = data(floats(s));
  nonblocking(
      s,
      [&](MPI_Request* r) {
        MPI_Ireduce(buf.data_ptr(), out.data_ptr(), n_of(buf), MPI_FLOAT, MPI_SUM, 0,
                    world_comm(), r);
      },
      [&] {
        MPI_Reduce(buf.data_ptr(), out.data_ptr(), n_of(buf), MPI_FLOAT, MPI_SUM, 0, world_comm());
      });
}
void mpi_nonblocking_alltoall(benchmark::State& s) {
  const int piece = static_cast<int>(floats(s) / world_size());
  at::Tensor send = data(floats(s)), recv = data(floats(s));
  nonblocking(
      s,
      [&](MPI_Request* r) {
        MPI_Ialltoall(send.data_ptr(), piece, MPI_FLOAT, recv.data_ptr(), piece, MPI_FLOAT,
                      world_comm(), r);
      },
      [&] {
        MPI_Alltoall(send.data_ptr(), piece, MPI_FLOAT, recv.data_ptr(), piece, MPI_FLOAT,
                     world_comm());
      });
}

// The communicator's alltoall in MPI calls alone: the exchange of every
// rank's 15-word record (MPI_Iallgather) and then MPI_Ialltoall, each
// finished by mpi::wait, beside MPI_Alltoall: how much of comm_alltoall_fwd's
// overhead is MPI's, with no LibTorch and none of partita's code. `fresh`:
// into a new at::empty receive buffer per call, as the communicator's
// output is (mpi_exchange_then_alltoall_fresh), else into a fixed one.
// The communicator's record exchange: one MPI_Iallgather of 15 words.
struct RawRecords {
  std::vector<int64_t> mine = std::vector<int64_t>(15, 1), all;
  RawRecords() : all(15 * world_size()) {}
  void exchange() {
    MPI_Request req;
    MPI_Iallgather(mine.data(), 15, MPI_INT64_T, all.data(), 15, MPI_INT64_T, world_comm(), &req);
    partita::mpi::wait(req, "bench");
  }
  // The exchange, then the collective `post` posts, finished by mpi::wait.
  template <typename Post>
  void then(Post&& post) {
    exchange();
    MPI_Request req;
    post(&req);
    partita::mpi::wait(req, "bench");
  }
};
void exchange_then_alltoall(benchmark::State& s, bool fresh) {
  const int p = world_size();
  const int piece = static_cast<int>(floats(s) / p);
  at::Tensor send = data(floats(s)), recv = data(floats(s));
  RawRecords records;
  paired(s, s.range(0),
         [&] {
           at::Tensor r = fresh ? at::empty({floats(s)}) : recv;
           records.then([&](MPI_Request* req) {
             MPI_Ialltoall(send.data_ptr(), piece, MPI_FLOAT, r.data_ptr(), piece, MPI_FLOAT,
                           world_comm(), req);
           });
           benchmark::DoNotOptimize(r);
         },
         [&] {
           MPI_Alltoall(send.data_ptr(), piece, MPI_FLOAT, recv.data_ptr(), piece, MPI_FLOAT,
                        world_comm());
         });
}
void mpi_exchange_then_alltoall(benchmark::State& s) { exchange_then_alltoall(s, false); }
void mpi_exchange_then_alltoall_fresh(benchmark::State& s) { exchange_then_alltoall(s, true); }
// bcast_ in MPI calls alone: the record exchange, then MPI_Ibcast in place,
// each finished by mpi::wait, beside MPI_Bcast.
void mpi_exchange_then_bcast(benchmark::State& s) {
  at::Tensor buf = data(floats(s)), twin = data(floats(s));
  RawRecords records;
  paired(s, s.range(0),
         [&] {
           records.then([&](MPI_Request* req) {
             MPI_Ibcast(buf.data_ptr(), n_of(buf), MPI_FLOAT, 0, world_comm(), req);
           });
         },
         [&] { MPI_Bcast(twin.data_ptr(), n_of(twin), MPI_FLOAT, 0, world_comm()); });
}

// The floor of overlapping a layer's header agreement with its data
// collective (issue 15, item 4): the 15-word header MPI_Iallgather and an
// MPI_Iallreduce of the message, posted together and then both finished by
// mpi::wait (mpi_exchange_with_allreduce), or one after the other as the
// layers do today (mpi_exchange_then_allreduce), each beside MPI_Allreduce.
// MPI calls only, no LibTorch in the timed region.
struct HeaderAndAllreduce {
  std::vector<int64_t> mine = std::vector<int64_t>(15, 1), all;
  at::Tensor send, recv;
  int n;
  explicit HeaderAndAllreduce(const benchmark::State& s)
      : all(15 * world_size()), send(data(floats(s))), recv(data(floats(s))), n(n_of(send)) {}
  void post_headers(MPI_Request* req) {
    MPI_Iallgather(mine.data(), 15, MPI_INT64_T, all.data(), 15, MPI_INT64_T, world_comm(), req);
  }
  void post_data(MPI_Request* req) {
    MPI_Iallreduce(send.data_ptr(), recv.data_ptr(), n, MPI_FLOAT, MPI_SUM, world_comm(), req);
  }
  void raw() { MPI_Allreduce(send.data_ptr(), recv.data_ptr(), n, MPI_FLOAT, MPI_SUM, world_comm()); }
};
void together(HeaderAndAllreduce& m) {
  MPI_Request req[2];
  m.post_headers(&req[0]);
  m.post_data(&req[1]);
  partita::mpi::wait(req[0], "bench");
  partita::mpi::wait(req[1], "bench");
}
void in_sequence(HeaderAndAllreduce& m) {
  MPI_Request req;
  m.post_headers(&req);
  partita::mpi::wait(req, "bench");
  m.post_data(&req);
  partita::mpi::wait(req, "bench");
}
void mpi_exchange_with_allreduce(benchmark::State& s) {
  HeaderAndAllreduce m(s);
  paired(s, s.range(0), [&] { together(m); }, [&] { m.raw(); });
}
void mpi_exchange_then_allreduce(benchmark::State& s) {
  HeaderAndAllreduce m(s);
  paired(s, s.range(0), [&] { in_sequence(m); }, [&] { m.raw(); });
}
// The two against each other in the same iterations: the saving itself
// (partita_us is "together", mpi_us "in sequence").
void mpi_exchange_with_vs_then_allreduce(benchmark::State& s) {
  HeaderAndAllreduce m(s);
  paired(s, s.range(0), [&] { together(m); }, [&] { in_sequence(m); });
}


// The ring in MPI calls alone, as the communicator makes them: a fresh
// receive buffer (at::empty) per call, the send from the input tensor,
// MPI_Irecv + MPI_Isend, then mpi::wait on each.
void mpi_ring_fresh_recv(benchmark::State& s) {
  const int next = (world_rank() + 1) % world_size();
  const int prev = (world_rank() - 1 + world_size()) % world_size();
  const at::Tensor x = data(floats(s));
  at::Tensor send = data(floats(s)), recv = data(floats(s));
  paired(s, s.range(0),
         [&] {
           at::Tensor r = at::empty({floats(s)});
           MPI_Request req[2];
           MPI_Irecv(r.data_ptr(), n_of(r), MPI_FLOAT, prev, 0, world_comm(), &req[0]);
           MPI_Isend(x.data_ptr(), n_of(x), MPI_FLOAT, next, 0, world_comm(), &req[1]);
           partita::mpi::wait(req[0], "bench");
           partita::mpi::wait(req[1], "bench");
           benchmark::DoNotOptimize(r);
         },
         [&] { raw_ring(send, recv, next, prev); });
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes = 4 << 10; bytes <= 16 << 20; bytes *= 4) b->Arg(bytes);
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(comm_allreduce_fwd)->Apply(sizes);
BENCHMARK(comm_allreduce_fwdbwd)->Apply(sizes);
BENCHMARK(comm_bcast_fwd)->Apply(sizes);
BENCHMARK(comm_bcast_fwdbwd)->Apply(sizes);
BENCHMARK(comm_alltoall_fwd)->Apply(sizes);
BENCHMARK(comm_alltoall_fwdbwd)->Apply(sizes);
BENCHMARK(comm_ring_fwd)->Apply(sizes);
BENCHMARK(comm_ring_fwdbwd)->Apply(sizes);
BENCHMARK(comm_allreduce_adj)->Apply(sizes);
BENCHMARK(comm_bcast_adj)->Apply(sizes);
BENCHMARK(comm_alltoall_adj)->Apply(sizes);
BENCHMARK(mpi_nonblocking_allreduce)->Apply(sizes);
BENCHMARK(mpi_nonblocking_bcast)->Apply(sizes);
BENCHMARK(mpi_nonblocking_reduce)->Apply(sizes);
BENCHMARK(mpi_nonblocking_alltoall)->Apply(sizes);
BENCHMARK(mpi_nonblocking_allgather)->Apply(sizes);
BENCHMARK(mpi_exchange_then_alltoall)->Apply(sizes);
BENCHMARK(mpi_exchange_then_alltoall_fresh)->Apply(sizes);
BENCHMARK(mpi_exchange_then_bcast)->Apply(sizes);
BENCHMARK(mpi_exchange_with_allreduce)->Apply(sizes);
BENCHMARK(mpi_exchange_then_allreduce)->Apply(sizes);
BENCHMARK(mpi_exchange_with_vs_then_allreduce)->Apply(sizes);
BENCHMARK(mpi_ring_fresh_recv)->Apply(sizes);
BENCHMARK(comm_bcast_static_fwd)->Apply(sizes);
BENCHMARK(comm_alltoall_static_fwd)->Apply(sizes);
BENCHMARK(comm_allreduce_fair_fwdbwd)->Apply(sizes);
BENCHMARK(comm_alltoall_fair_fwdbwd)->Apply(sizes);
BENCHMARK(comm_alltoall_out_fwd)->Apply(sizes);
BENCHMARK(comm_alltoall_out_static_fwd)->Apply(sizes);
BENCHMARK(comm_alltoall_static_fair_fwdbwd)->Apply(sizes);
BENCHMARK(comm_autograd_floor_fwdbwd)->Arg(4 << 10)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(comm_autograd_floor8_fwdbwd)->Arg(4 << 10)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

const std::map<std::string, std::string>& communicator_twins() {
  static const std::map<std::string, std::string> twins = {
      {"comm_allreduce_fwd", "MPI_Allreduce"},
      {"comm_allreduce_fwdbwd", "2 x MPI_Allreduce"},
      {"comm_bcast_fwd", "MPI_Bcast"},
      {"comm_bcast_fwdbwd", "MPI_Bcast + MPI_Reduce"},
      {"comm_alltoall_fwd", "MPI_Alltoall"},
      {"comm_bcast_static_fwd", "MPI_Bcast"},
      {"comm_allreduce_fair_fwdbwd", "autograd Function: MPI_Allreduce, backward MPI_Allreduce"},
      {"comm_alltoall_fair_fwdbwd", "autograd Function: MPI_Alltoall, backward MPI_Alltoall"},
      {"comm_alltoall_static_fwd", "MPI_Alltoall"},
      {"comm_alltoall_out_fwd", "MPI_Alltoall"},
      {"comm_alltoall_out_static_fwd", "MPI_Alltoall"},
      {"comm_alltoall_static_fair_fwdbwd", "autograd Function: MPI_Alltoall, backward MPI_Alltoall"},
      {"comm_alltoall_fwdbwd", "2 x MPI_Alltoall"},
      {"comm_ring_fwd", "MPI_Irecv + MPI_Isend + MPI_Waitall"},
      {"comm_ring_fwdbwd", "2 x (MPI_Irecv + MPI_Isend + MPI_Waitall)"},
      {"comm_allreduce_adj", "MPI_Allreduce (ours: the adjoint's node applied, no engine)"},
      {"comm_bcast_adj", "MPI_Reduce (ours: the adjoint's node applied, no engine)"},
      {"comm_alltoall_adj", "MPI_Alltoall (ours: the adjoint's node applied, no engine)"},
      {"mpi_nonblocking_allreduce", "MPI_Allreduce"},
      {"mpi_nonblocking_bcast", "MPI_Bcast"},
      {"mpi_nonblocking_reduce", "MPI_Reduce"},
      {"mpi_nonblocking_alltoall", "MPI_Alltoall"},
      {"mpi_nonblocking_allgather", "MPI_Allgather"},
      {"mpi_exchange_then_alltoall", "MPI_Alltoall"},
      {"mpi_exchange_then_alltoall_fresh", "MPI_Alltoall"},
      {"mpi_exchange_then_bcast", "MPI_Bcast"},
      {"mpi_exchange_with_allreduce", "MPI_Allreduce"},
      {"mpi_exchange_then_allreduce", "MPI_Allreduce"},
      {"mpi_exchange_with_vs_then_allreduce", "MPI_Iallgather, wait, MPI_Iallreduce, wait"},
      {"mpi_ring_fresh_recv", "MPI_Irecv + MPI_Isend + MPI_Waitall"},
      {"comm_autograd_floor_fwdbwd", "at::empty_like (no graph, no MPI)"},
      {"comm_autograd_floor8_fwdbwd", "at::empty_like (no graph, no MPI)"},
  };
  return twins;
}

}  // namespace partita::bench
