#include "partita/testing/primitive_table.hpp"

#include <torch/torch.h>

#include "partita/errors.hpp"
#include "partita/nn/all_gather.hpp"
#include "partita/nn/all_sum_reduce.hpp"
#include "partita/nn/broadcast.hpp"
#include "partita/nn/halo_exchange.hpp"
#include "partita/nn/linear.hpp"
#include "partita/nn/reduce_scatter.hpp"
#include "partita/nn/repartition.hpp"
#include "partita/nn/sum_reduce.hpp"
#include "partita/reference/all_gather.hpp"
#include "partita/reference/all_sum_reduce.hpp"
#include "partita/reference/broadcast.hpp"
#include "partita/reference/halo_exchange.hpp"
#include "partita/reference/reduce_scatter.hpp"
#include "partita/reference/repartition.hpp"
#include "partita/reference/sum_reduce.hpp"
#include "partita/tensor_rules.hpp"

namespace partita::testing {

namespace {

// A module's call as the runner makes it (the holder shares its module).
template <typename Module>
MpiLayer layer_of(Module m) {
  MpiLayer l;
  l.call = [m](const at::Tensor& x) mutable { return m(x); };
  return l;
}

// The Linear layer a case names, built from MPI partitions.
std::shared_ptr<nn::DistributedLinearBase> make_linear(const Case& c, int64_t in,
                      const std::function<mpi::Partition(const PartitionSpec&)>& part) {
  nn::LinearOptions o;
  o.bias(c.bias);
  o.dtype(parse_dtype(c.dtype));
  const auto px = part(c.P_x);
  const auto py = c.P_y ? part(*c.P_y) : mpi::Partition();
  const auto kind = reference::linear_kind(c.primitive);
  using K = reference::LinearKind;
  // The case's P_y, where it has one, is the layer's P_y, and its P_x the
  // layer's P_x (x split along the tokens); without a P_y the all-gather
  // layers hold x and y on the case's P_x alone (their P_x is then null).
  const auto& first = c.P_y ? py : px;
  const auto second = c.P_y ? px : mpi::Partition();
  switch (kind) {
    case K::General:
      return nn::DistributedLinear(px, py, part(*c.P_W), in, c.out_features, o).ptr();
    case K::AllGather:
      return nn::DistributedLinearAllGather(second, first, in, c.out_features, o).ptr();
    case K::AllGatherZero:
      return nn::DistributedLinearAllGatherZero(second, first, in, c.out_features, o).ptr();
    case K::ReduceScatter:
      return nn::DistributedLinearReduceScatter(px, py, in, c.out_features, o).ptr();
    case K::ReduceScatterZero:
      return nn::DistributedLinearReduceScatterZero(px, py, in, c.out_features, o).ptr();
  }
  throw Error("no layer " + c.primitive);
}

// The reference twin of every Linear layer: the global layer on the
// gathered x, its output split as the layer splits y.
reference::Tensors linear_reference(CaseContext& w, const reference::Tensors& x) {
  const Case& c = w.c;
  const auto rx = w.rpart(c.P_x);
  w.rlayer.kind = reference::linear_kind(c.primitive);
  w.rlayer.P_x = rx;
  w.rlayer.P_y = c.P_y ? w.rpart(*c.P_y) : rx;
  if (c.P_W) w.rlayer.P_W = w.rpart(*c.P_W);
  w.rlayer.in = w.in;
  w.rlayer.out = c.out_features;
  w.rlayer.bias = c.bias;
  return reference::linear(w.rlayer, w.Wr, w.br, x);
}

// Every Linear layer starts from the reference's W and b.
MpiLayer linear_mpi(CaseContext& w) {
  const Case& c = w.c;
  MpiLayer l;
  l.linear = make_linear(c, w.in, w.mpart);
  torch::nn::Linear global(torch::nn::LinearOptions(w.in, c.out_features).bias(c.bias));
  global->to(parse_dtype(c.dtype));
  {
    torch::NoGradGuard no_grad;
    global->weight.copy_(w.W0);
    if (c.bias) global->bias.copy_(w.b0);
  }
  l.linear->scatter_parameters(global);
  l.call = [m = l.linear](const at::Tensor& x) { return m->forward(x); };
  return l;
}

PrimitiveEntry linear_entry(const char* name, const char* twin) {
  PrimitiveEntry e;
  e.name = name;
  e.forward = Moves::kSums;
  e.linear = true;
  e.twin_fwd = twin;
  e.twin_fwdbwd = std::string(twin) + ", then its adjoint collectives + 2 GEMMs";
  e.reference = linear_reference;
  e.mpi = linear_mpi;
  return e;
}

std::vector<PrimitiveEntry> make_table() {
  std::vector<PrimitiveEntry> t;
  {
    PrimitiveEntry e;
    e.name = "broadcast";
    e.adjoint = "sum_reduce";
    e.forward = Moves::kCopies;
    e.explain_command = "broadcast";
    e.explain = ExplainView::kTeams;
    e.explain_help = "broadcast from P_x to P_y: the teams and each worker's place in them";
    e.twin_fwd = "MPI_Bcast";
    e.twin_fwdbwd = "MPI_Bcast + MPI_Reduce";
    e.reference = [](CaseContext& w, const reference::Tensors& x) {
      const auto rx = w.rpart(w.c.P_x);
      return reference::broadcast(rx, w.rpart(*w.c.P_y), x, w.c.options);
    };
    e.mpi = [](CaseContext& w) {
      const auto px = w.mpart(w.c.P_x);
      return layer_of(nn::Broadcast(px, w.mpart(*w.c.P_y), w.c.options));
    };
    t.push_back(std::move(e));
  }
  {
    PrimitiveEntry e;
    e.name = "sum_reduce";
    e.adjoint = "broadcast";
    e.forward = Moves::kSums;
    e.explain_command = "sum-reduce";
    e.explain = ExplainView::kTeams;
    e.explain_help = "sum-reduce from P_x to P_y: the teams and each worker's place in them";
    e.twin_fwd = "MPI_Reduce";
    e.twin_fwdbwd = "MPI_Reduce + MPI_Bcast";
    e.reference = [](CaseContext& w, const reference::Tensors& x) {
      const auto rx = w.rpart(w.c.P_x);
      return reference::sum_reduce(rx, w.rpart(*w.c.P_y), x, w.c.options);
    };
    e.mpi = [](CaseContext& w) {
      const auto px = w.mpart(w.c.P_x);
      return layer_of(nn::SumReduce(px, w.mpart(*w.c.P_y), w.c.options));
    };
    t.push_back(std::move(e));
  }
  {
    PrimitiveEntry e;
    e.name = "all_sum_reduce";
    e.adjoint = "all_sum_reduce";
    e.forward = Moves::kSums;
    e.explain_command = "all-sum-reduce";
    e.explain = ExplainView::kAllReduction;
    e.explain_help = "all-sum-reduce over some of P_x's dimensions";
    e.twin_fwd = "MPI_Allreduce";
    e.twin_fwdbwd = "2 x MPI_Allreduce";
    e.reference = [](CaseContext& w, const reference::Tensors& x) {
      return reference::all_sum_reduce(w.rpart(w.c.P_x), w.c.axes, x);
    };
    e.mpi = [](CaseContext& w) {
      return layer_of(nn::AllSumReduce(w.mpart(w.c.P_x), w.c.axes));
    };
    t.push_back(std::move(e));
  }
  {
    PrimitiveEntry e;
    e.name = "all_gather";
    e.adjoint = "reduce_scatter";
    e.forward = Moves::kCopies;
    e.twin_fwd = "MPI_Allgather";
    e.twin_fwdbwd = "MPI_Allgather + MPI_Reduce_scatter";
    e.reference = [](CaseContext& w, const reference::Tensors& x) {
      const auto rx = w.rpart(w.c.P_x);
      return w.c.distdl ? reference::all_gather(rx, *w.c.distdl, x)
                        : reference::all_gather(rx, w.c.axis, w.c.dim, x);
    };
    e.mpi = [](CaseContext& w) {
      const auto px = w.mpart(w.c.P_x);
      return layer_of(w.c.distdl ? nn::AllGather(px, *w.c.distdl)
                                 : nn::AllGather(px, w.c.axis, w.c.dim));
    };
    t.push_back(std::move(e));
  }
  {
    PrimitiveEntry e;
    e.name = "reduce_scatter";
    e.adjoint = "all_gather";
    e.forward = Moves::kSums;
    e.twin_fwd = "MPI_Reduce_scatter";
    e.twin_fwdbwd = "MPI_Reduce_scatter + MPI_Allgather";
    e.reference = [](CaseContext& w, const reference::Tensors& x) {
      const auto rx = w.rpart(w.c.P_x);
      return w.c.distdl ? reference::reduce_scatter(rx, *w.c.distdl, x)
                        : reference::reduce_scatter(rx, w.c.axis, w.c.dim, x);
    };
    e.mpi = [](CaseContext& w) {
      const auto px = w.mpart(w.c.P_x);
      return layer_of(w.c.distdl ? nn::ReduceScatter(px, *w.c.distdl)
                                 : nn::ReduceScatter(px, w.c.axis, w.c.dim));
    };
    t.push_back(std::move(e));
  }
  {
    PrimitiveEntry e;
    e.name = "repartition";
    e.adjoint = "repartition";
    e.forward = Moves::kCopies;
    e.exact_backward = true;
    e.explain_command = "repartition";
    e.explain = ExplainView::kRepartition;
    e.explain_help = "repartition from P_x to P_y: who sends what to whom";
    e.twin_fwd = "MPI_Alltoallv (contiguous blocks)";
    e.reference = [](CaseContext& w, const reference::Tensors& x) {
      const auto rx = w.rpart(w.c.P_x);
      return reference::repartition(rx, w.rpart(*w.c.P_y), x);
    };
    e.mpi = [](CaseContext& w) {
      const auto px = w.mpart(w.c.P_x);
      return layer_of(nn::Repartition(px, w.mpart(*w.c.P_y)));
    };
    t.push_back(std::move(e));
  }
  {
    PrimitiveEntry e;
    e.name = "halo_exchange";
    e.adjoint = "halo_exchange";  // its own adjoint: ghosts added back into the bulk
    e.forward = Moves::kCopies;
    e.twin_fwd = "2 x MPI_Sendrecv (in place)";
    e.reference = [](CaseContext& w, const reference::Tensors& x) {
      return reference::halo_exchange(w.rpart(w.c.P_x), w.c.left, w.c.right, x);
    };
    e.mpi = [](CaseContext& w) {
      const auto px = w.mpart(w.c.P_x);
      if (!w.c.in_place) return layer_of(nn::HaloExchange(px, w.c.left, w.c.right));
      // DistDL's form: the ghosts of a computed (non-leaf) copy of x are
      // filled in place, and the gradient reaches x through it.
      nn::HaloExchange layer(px, w.c.left, w.c.right, nn::HaloExchangeImpl::Storage::kInPlace);
      MpiLayer l;
      l.written = std::make_shared<at::Tensor>();
      l.call = [layer, written = l.written](const at::Tensor& x) mutable {
        *written = x.requires_grad() ? x * 1 : x.clone();
        return layer(*written);
      };
      return l;
    };
    t.push_back(std::move(e));
  }
  t.push_back(linear_entry("linear", "GEMM + MPI_Bcast (columns) + MPI_Reduce (rows)"));
  t.push_back(linear_entry("linear_all_gather", "MPI_Allgather + GEMM"));
  t.push_back(linear_entry("linear_reduce_scatter", "GEMM + MPI_Reduce_scatter_block"));
  t.push_back(linear_entry("linear_all_gather_zero", "MPI_Allgather (W shards, x) + GEMM"));
  t.push_back(linear_entry("linear_reduce_scatter_zero",
                           "MPI_Allgather (W shards) + GEMM + MPI_Reduce_scatter_block"));
  return t;
}

}  // namespace

const std::vector<PrimitiveEntry>& primitive_table() {
  static const std::vector<PrimitiveEntry> table = make_table();
  return table;
}

const PrimitiveEntry& primitive_entry(const std::string& name) {
  for (const auto& e : primitive_table())
    if (e.name == name) return e;
  throw Error("no primitive or layer named \"" + name + "\" in the case runner's table");
}

}  // namespace partita::testing
