// partita::nn::DistributedLinear and its four relatives — seed 002's
// distributed affine layers y = W x + b as torch::nn modules, each a
// composition of partita's own primitives (Broadcast, SumReduce, AllGather,
// ReduceScatter). docs/linear.md has the layouts, the rules the seed leaves
// open and how each is decided.
//
// Adjoints are not written here: every step is a primitive whose autograd
// function states its own adjoint, and the local GEMM is torch's. So
//  - DistributedLinear: broadcast x down the columns of P_W, local linear
//    (bias on column 0), sum-reduce the rows of P_W into P_y (transposed).
//    Adjoint: broadcast dy along the rows, local adjoint, sum-reduce dx
//    into P_x; dW and db stay where W and b live.
//  - DistributedLinearAllGather: all-gather x along the model-parallel
//    axis, broadcast W_m (and b_m) from the first data-parallel copy to the
//    others, local linear. Adjoint: reduce-scatter of dx, sum-reduce of dW
//    and db onto the stored copy (not an all-reduce of gradients).
//  - DistributedLinearReduceScatter: broadcast W_m (and b_m), local linear,
//    add b_m into the m-th slice of the output features, reduce-scatter
//    along the model-parallel axis. Adjoint: all-gather dy, local adjoint,
//    sum-reduce dW and db.
//  - ...Zero: W and b sharded over data-parallel axis 0 as well; the forward
//    all-gathers the shard into the local block, whose adjoint is the
//    reduce-scatter of dW back to the shards.
//
// Construction is collective over the world (every rank builds the layer,
// as in DistDL); a call is collective over the layer's workers, and ranks
// outside return a clone of their (zero-volume) input. Bad arguments raise
// PartitionError and bad inputs ShapeError on every rank of the layer.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <memory>
#include <optional>
#include <string>

#include "partita/arg.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/shape.hpp"

namespace partita::nn {

// Set in LibTorch's style: LinearOptions().bias(false).dtype(at::kDouble).
struct LinearOptions {
  PARTITA_ARG(bool, bias) = true;
  PARTITA_ARG(at::ScalarType, dtype) = at::kFloat;
  // The all-gather and reduce-scatter layers only (not their ZeRO-3 forms,
  // nor DistributedLinear): every data-parallel copy holds W's and b's
  // blocks itself, as torch's DistributedDataParallel keeps one model per
  // replica. The forward broadcasts nothing and the backward sums nothing
  // over the copies: each copy's gradient is its own, and whoever trains
  // the layer averages the gradients over the copies (smp::DistributedModel's
  // step does; docs/3d.md). The copies start equal: construction and
  // from_distdl broadcast the first copy's values to the others.
  PARTITA_ARG(bool, replicated) = false;
};

namespace detail {
struct LinearLayout;
}

// One rank's parameters as DistDL's twin of the layer holds them on the same
// rank (docs/linear.md, "DistDL checkpoints"): its `weight` and `bias`
// (`sublinear.weight` and `sublinear.bias` for DistributedLinear). Each is
// undefined where DistDL has none (`None`), zero-volume (`{0}`) where DistDL
// keeps a zero-volume buffer, and otherwise DistDL's local tensor, shaped
// as DistDL shapes it (as many dimensions as the partition; the ZeRO-3
// all-gather layer's weight transposed).
struct DistDLParameters {
  at::Tensor weight, bias;
};

// What the five layers share: the block of the global W and b each rank
// owns, and the conversions to and from one torch::nn::Linear.
class DistributedLinearBase : public torch::nn::Module {
 public:
  // y = W x + b for this rank's part of x (each layer's own composition of
  // primitives); the TORCH_MODULE holders call it.
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;

  int64_t in_features() const;
  int64_t out_features() const;
  bool has_bias() const;

  // The local parameters: this rank's block of W ([rows, cols]) and of b,
  // undefined on ranks that own none (they are registered as parameters
  // only where they exist).
  const at::Tensor& local_weight() const { return weight_; }
  const at::Tensor& local_bias() const { return bias_; }
  // Where they sit in the global W and b: {row0, rows, col0, cols} and
  // {start, length}; zero lengths where the rank owns none.
  std::array<int64_t, 4> weight_block() const;
  std::array<int64_t, 2> bias_block() const;
  // Every worker taking part in a call, as the layer was built on it (the
  // all-gather layers' P_y, the reduce-scatter layers' P_x: D x ... x 1 x
  // M; DistributedLinear's P_x, P_W and P_y together).
  const mpi::Partition& partition() const;
  // Built with LinearOptions::replicated: every data-parallel copy holds its
  // blocks and its own gradients.
  bool replicated() const;

  // The global layer, assembled from every owner's block: collective over
  // the layer's workers, returned on each of them; nullptr elsewhere.
  torch::nn::Linear gather_parameters() const;
  // Copies each rank's block out of `global` (the same layer on every rank;
  // no communication but the agreement that it fits). Collective over the
  // layer's workers; a no-op elsewhere.
  void scatter_parameters(const torch::nn::Linear& global);

  // DistDL's local parameters for this rank (copies, in the layer's dtype).
  // Collective over the same workers as gather_parameters (the reduce-scatter
  // layers' biases move between workers: DistDL places them elsewhere);
  // elsewhere both tensors are undefined.
  DistDLParameters to_distdl() const;
  // Loads DistDL's local parameters of this rank (a DistDL checkpoint's
  // tensors, each rank its own). Collective as to_distdl; every tensor must
  // have exactly the shape to_distdl() gives (an undefined or zero-volume
  // tensor where DistDL has none or a buffer), else ShapeError on every
  // worker naming the first that does not fit. Values are converted to the
  // layer's dtype.
  void from_distdl(const DistDLParameters& p);
  // The shapes to_distdl() gives on this rank ({0} for a zero-volume
  // buffer; empty optional where DistDL has no tensor).
  std::optional<Shape> distdl_weight_shape() const;
  std::optional<Shape> distdl_bias_shape() const;

 protected:
  void init_parameters(std::shared_ptr<const detail::LinearLayout> layout);
  // Throws ShapeError on every worker of the layer unless each passed an
  // x that fits (`local_error` empty); one small allreduce.
  void agree_on_input(const std::string& local_error) const;
  std::string check_x(const at::Tensor& x, bool holds, int64_t dims, int64_t features) const;
  // A replicated layer's copies take the first copy's values (collective
  // over the layer's workers; nothing to do for the other layers).
  virtual void sync_copies() {}

  std::shared_ptr<const detail::LinearLayout> layout_;
  at::Tensor weight_, bias_;
};

class DistributedLinearImpl : public DistributedLinearBase {
 public:
  // P_x 1 x P_fin, P_y 1 x P_fout, P_W P_fout x P_fin (seed 002).
  DistributedLinearImpl(const mpi::Partition& P_x, const mpi::Partition& P_y,
                        const mpi::Partition& P_W, int64_t in_features, int64_t out_features,
                        LinearOptions options = {});
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  struct Parts;
  std::shared_ptr<Parts> p_;
};
TORCH_MODULE(DistributedLinear);

// Every distributed Linear layer takes its partitions first, in one order
// (x's, y's, then W's where it has one), then in_features, out_features and
// LinearOptions, as DistributedLinear(P_x, P_y, P_W, in, out) does.
//
// P_y: D x ... x 1 x M, holds y (and x when P_x is the null partition,
// mpi::Partition()). P_x (or null): D x ... x M x 1 on the same workers, x
// split along the tokens.
class DistributedLinearAllGatherImpl : public DistributedLinearBase {
 public:
  DistributedLinearAllGatherImpl(const mpi::Partition& P_x, const mpi::Partition& P_y,
                                 int64_t in_features, int64_t out_features,
                                 LinearOptions options = {});
  torch::Tensor forward(const torch::Tensor& x) override;

 protected:
  DistributedLinearAllGatherImpl(bool zero, const mpi::Partition& P_x, const mpi::Partition& P_y,
                                 int64_t in_features, int64_t out_features, LinearOptions options);
  void sync_copies() override;

 private:
  struct Parts;
  std::shared_ptr<Parts> p_;
};
TORCH_MODULE(DistributedLinearAllGather);

// W additionally sharded over data-parallel axis 0 (ZeRO-3).
class DistributedLinearAllGatherZeroImpl : public DistributedLinearAllGatherImpl {
 public:
  DistributedLinearAllGatherZeroImpl(const mpi::Partition& P_x, const mpi::Partition& P_y,
                                     int64_t in_features, int64_t out_features,
                                     LinearOptions options = {});
};
TORCH_MODULE(DistributedLinearAllGatherZero);

// P_x: D x ... x 1 x M, holds x (and y when P_y is the null partition). P_y
// (or null): D x ... x M x 1 on the same workers, y split along the tokens.
class DistributedLinearReduceScatterImpl : public DistributedLinearBase {
 public:
  DistributedLinearReduceScatterImpl(const mpi::Partition& P_x, const mpi::Partition& P_y,
                                     int64_t in_features, int64_t out_features,
                                     LinearOptions options = {});
  torch::Tensor forward(const torch::Tensor& x) override;

 protected:
  DistributedLinearReduceScatterImpl(bool zero, const mpi::Partition& P_x, const mpi::Partition& P_y,
                                     int64_t in_features, int64_t out_features, LinearOptions options);
  void sync_copies() override;

 private:
  struct Parts;
  std::shared_ptr<Parts> p_;
};
TORCH_MODULE(DistributedLinearReduceScatter);

class DistributedLinearReduceScatterZeroImpl : public DistributedLinearReduceScatterImpl {
 public:
  DistributedLinearReduceScatterZeroImpl(const mpi::Partition& P_x, const mpi::Partition& P_y,
                                         int64_t in_features, int64_t out_features,
                                         LinearOptions options = {});
};
TORCH_MODULE(DistributedLinearReduceScatterZero);

}  // namespace partita::nn
