// The fair forward+backward twin (issue 34 item 4): the hand-written MPI
// exchange of a primitive wrapped in its own torch::autograd::Function, so
// that a "_fair_fwdbwd" row times partita's forward and backward against
// the same MPI calls doing the same graph work (a node recorded in forward,
// LibTorch's engine running it in backward, a new output tensor and a new
// input gradient per call). What partita adds over such a twin is then its
// own work only: checks, the shape agreement, plans, its node.
// Float32, 1-D contiguous tensors; world communicator.
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include "partita/mpi/runtime.hpp"

namespace partita::bench {

// The forward's MPI call, and the adjoint's.
enum class RawKind : int64_t {
  kAllreduce,      // MPI_Allreduce           | MPI_Allreduce
  kBcast,          // MPI_Bcast from rank 0   | MPI_Reduce to rank 0 (zeros({0}) elsewhere)
  kReduce,         // MPI_Reduce to rank 0    | MPI_Bcast from rank 0
  kAllgather,      // MPI_Allgather           | MPI_Reduce_scatter_block
  kReduceScatter,  // MPI_Reduce_scatter_block | MPI_Allgather
  kAlltoall,       // MPI_Alltoall            | MPI_Alltoall
};

struct RawExchange : torch::autograd::Function<RawExchange> {
  // `n`: the broadcast's element count on every rank (the others' x is {0}),
  // unused by the other kinds.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t kind, int64_t n) {
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["in"] = x.numel();
    return run(static_cast<RawKind>(kind), x, n, false);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const auto kind = static_cast<RawKind>(ctx->saved_data["kind"].toInt());
    return {run(kind, g[0].contiguous(), ctx->saved_data["in"].toInt(), true), at::Tensor(),
            at::Tensor()};
  }

  static at::Tensor apply_to(const at::Tensor& x, RawKind kind, int64_t n = 0) {
    return apply(x, static_cast<int64_t>(kind), n);
  }

 private:
  // The forward (adjoint = false) or the adjoint of `kind` on x; `n` is the
  // broadcast's count (forward) or the input's element count (adjoint).
  static at::Tensor run(RawKind kind, const at::Tensor& x, int64_t n, bool adjoint) {
    const MPI_Comm comm = mpi::world_comm();
    const int p = mpi::world_size(), me = mpi::world_rank();
    const int k = static_cast<int>(x.numel());
    const auto f = at::TensorOptions().dtype(at::kFloat);
    at::Tensor y;
    switch (kind) {
      case RawKind::kAllreduce:
        y = at::empty({k}, f);
        MPI_Allreduce(x.data_ptr(), y.data_ptr(), k, MPI_FLOAT, MPI_SUM, comm);
        return y;
      case RawKind::kAlltoall:
        y = at::empty({k}, f);
        MPI_Alltoall(x.data_ptr(), k / p, MPI_FLOAT, y.data_ptr(), k / p, MPI_FLOAT, comm);
        return y;
      case RawKind::kAllgather:
      case RawKind::kReduceScatter:
        if ((kind == RawKind::kAllgather) != adjoint) {
          y = at::empty({static_cast<int64_t>(k) * p}, f);
          MPI_Allgather(x.data_ptr(), k, MPI_FLOAT, y.data_ptr(), k, MPI_FLOAT, comm);
        } else {
          y = at::empty({k / p}, f);
          MPI_Reduce_scatter_block(x.data_ptr(), y.data_ptr(), k / p, MPI_FLOAT, MPI_SUM, comm);
        }
        return y;
      case RawKind::kBcast:
      case RawKind::kReduce:
        if ((kind == RawKind::kBcast) != adjoint) {  // from rank 0 to every rank's new tensor
          y = me == 0 ? x.clone() : at::empty({n}, f);
          MPI_Bcast(y.data_ptr(), static_cast<int>(n), MPI_FLOAT, 0, comm);
        } else {  // the sum at rank 0; {0} elsewhere
          y = at::empty({me == 0 ? static_cast<int64_t>(k) : 0}, f);
          MPI_Reduce(x.data_ptr(), y.data_ptr(), k, MPI_FLOAT, MPI_SUM, 0, comm);
        }
        return y;
    }
    return y;
  }
};

}  // namespace partita::bench
