#include "partita/nn/linear.hpp"

#include <torch/torch.h>

#include <atomic>
#include <cmath>

#include "detail/agreement.hpp"
#include "partita/errors.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/all_gather.hpp"
#include "partita/nn/broadcast.hpp"
#include "partita/nn/reduce_scatter.hpp"
#include "partita/nn/sum_reduce.hpp"
#include "partita/nn/traffic.hpp"

namespace partita::nn {

namespace detail {

// Which block of the global W ([out, in]) and b ([out]) this rank owns, and
// over which workers the layer agrees and gathers.
struct LinearLayout {
  std::string name;
  int64_t in = 0, out = 0;
  bool bias = true;
  at::ScalarType dtype = at::kFloat;
  mpi::Partition P_layer;   // every worker taking part in a call
  mpi::Partition P_params;  // every owner of a block (gather/scatter)
  bool owns_weight = false, owns_bias = false;
  // LinearOptions::replicated: every data-parallel copy owns the blocks;
  // `first_copy` marks the copy gather_parameters reads (data-parallel
  // index 0), the others hold the same values.
  bool replicated = false, first_copy = true;
  int64_t w_r0 = 0, w_rn = 0, w_c0 = 0, w_cn = 0, b0 = 0, bn = 0;

  // What DistDL's twin of the layer holds on this rank (to_distdl /
  // from_distdl; docs/linear.md, "DistDL checkpoints"): nothing, a
  // zero-volume buffer, or a block of W or b in DistDL's shape. DistDL's
  // weight blocks are partita's (same rows and columns on the same worker,
  // checked against DistDL's source per layer); only the reduce-scatter
  // layers place the bias elsewhere (dd_b_moves: exchanged between workers).
  enum Held { kNone, kBuffer, kBlock };
  Held dd_w = kNone, dd_b = kNone;
  Shape dd_w_shape, dd_b_shape;
  bool dd_w_transposed = false;  // ZeRO-3 all-gather: DistDL stores W's shard as [in_d, ..., out_m, 1]
  bool dd_b_moves = false;
  int64_t dd_b0 = 0, dd_bn = 0;  // DistDL's bias block on this rank
};

}  // namespace detail

namespace {

using detail::LinearLayout;

// A shape of `d` ones with the given extents set (negative positions count
// from the end).
Shape ones_with(size_t d, std::initializer_list<std::pair<int, int64_t>> set) {
  Shape s(d, 1);
  for (const auto& [pos, n] : set) s[pos < 0 ? d + pos : pos] = n;
  return s;
}

std::string dtype_name(at::ScalarType t) { return c10::toString(t); }

// The Cartesian partition of the given world ranks (collective over the world).
mpi::CartesianPartition cartesian_of(const Ranks& world_ranks, const Shape& shape) {
  return mpi::Partition::world().create_partition_inclusive(world_ranks).create_cartesian_topology_partition(
      shape);
}

// World ranks of the workers of P whose index satisfies `keep`, in P order.
template <typename Keep>
Ranks workers_where(const mpi::Partition& P, Keep keep) {
  Ranks out;
  for (int r = 0; r < P.size(); ++r)
    if (keep(unravel(r, P.shape()))) out.push_back(P.workers()[r]);
  return out;
}

bool leading_zero(const Index& i) {  // every data-parallel coordinate is 0
  for (size_t k = 0; k + 2 < i.size(); ++k)
    if (i[k] != 0) return false;
  return true;
}

// The partition axis along which x is gathered (or y scattered): whichever of
// the last two is not 1 (DistDL's argmax over the last two extents).
int model_axis(const mpi::Partition& P) {
  const int d = static_cast<int>(P.shape().size());
  return P.shape()[d - 2] > P.shape()[d - 1] ? d - 2 : d - 1;
}

std::string describe(const mpi::Partition& P) { return P.is_null() ? "none" : P.describe(); }

void require(bool ok, const std::string& name, const std::string& what) {
  if (!ok) throw PartitionError(name + ": " + what, rule_code::kLinearLayout);
}

// The constructor's checks run on every rank and their outcome is agreed
// over the world, so either every rank builds the layer or every rank throws.
template <typename Body>
void checked_construction(const std::string& name, int64_t in, int64_t out, const LinearOptions& o,
                          const std::vector<const mpi::Partition*>& parts, Body&& body) {
  mpi::detail::Fingerprint f;
  f.add(name);
  f.add(in);
  f.add(out);
  f.add(static_cast<int64_t>(o.bias()));
  f.add(static_cast<int64_t>(o.dtype()));
  f.add(static_cast<int64_t>(o.replicated()));
  for (const auto* P : parts) {
    f.add(P->workers());
    f.add(P->shape());
  }
  mpi::detail::checked(mpi::world_comm(), name.c_str(), f, body);
}

at::Tensor nothing(at::ScalarType t) { return at::zeros({0}, at::TensorOptions().dtype(t)); }

// --- what the layers send (nn/traffic.hpp; docs/3d.md, "Communication volume") ---
// Counted at each collective the layers call, per docs/3d.md's definition:
// all-gather over a team of t, a piece of n bytes: (t - 1) n; reduce-scatter
// of N bytes keeping n: N - n; broadcast of n bytes to t copies: (t - 1) n
// from the stored copy, 0 elsewhere; its adjoint sum-reduce: n from every
// other copy, 0 on the stored one; all-reduce of n bytes over t: (t - 1) n.

enum Traffic { kModelParallel = 0, kDataParallel = 1 };
std::atomic<int64_t> g_traffic[2];

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

void count(Traffic kind, int64_t bytes) { g_traffic[kind] += bytes; }

// The adjoint of the collective that made y runs when autograd reaches y
// (once per pass that needs it: a split backward may run it in I and in W).
void count_adjoint(const at::Tensor& y, Traffic kind, int64_t bytes) {
  if (bytes > 0 && y.requires_grad()) y.register_hook([kind, bytes](const at::Tensor&) { count(kind, bytes); });
}

// An all-gather over `team` workers and its adjoint (a reduce-scatter of
// y's gradient back to x's slices).
// A team of one has nothing to gather or sum: x is used as it is (the
// layers' own agreement has checked it; at::linear never writes it).
at::Tensor gathered(AllGather& gather, const at::Tensor& x, int64_t team, Traffic kind) {
  if (team == 1) return x;
  at::Tensor y = gather(x);
  count(kind, (team - 1) * nbytes(x));
  count_adjoint(y, kind, nbytes(y) - nbytes(x));
  return y;
}

// A reduce-scatter over `team` workers and its adjoint (an all-gather of
// y's gradient).
at::Tensor scattered(ReduceScatter& scatter, const at::Tensor& x, int64_t team, Traffic kind) {
  if (team == 1) return x;
  at::Tensor y = scatter(x);
  count(kind, nbytes(x) - nbytes(y));
  count_adjoint(y, kind, (team - 1) * nbytes(y));
  return y;
}

// The data-parallel copies of a parameter (the broadcast's team): every
// worker of P but the M along the model-parallel axis.
int64_t copies(const mpi::Partition& P) { return volume(P.shape()) / P.shape().back(); }

// Standard data parallelism: a parameter broadcast from its stored copy to
// the other `copies` - 1 data-parallel copies; without copies (no
// broadcast built) the stored parameter itself.
at::Tensor share(Broadcast& broadcast, const at::Tensor& p, bool owns, at::ScalarType dtype, int64_t copies) {
  if (broadcast.is_empty()) return p;
  at::Tensor out = broadcast(owns ? p : nothing(dtype));
  count(kDataParallel, owns ? (copies - 1) * nbytes(out) : 0);
  if (!owns) count_adjoint(out, kDataParallel, nbytes(out));
  return out;
}

// A replicated layer's copies take the first copy's W and b (the broadcast
// the layer would otherwise run in every forward, once, without autograd).
void copy_from_first(Broadcast& broadcast, const LinearLayout& l, at::Tensor& weight, at::Tensor& bias) {
  if (!l.replicated || broadcast.is_empty()) return;
  torch::NoGradGuard no_grad;
  const at::Tensor w = broadcast(l.first_copy ? weight : nothing(l.dtype));
  if (!l.first_copy) weight.copy_(w);
  if (l.bias) {
    const at::Tensor b = broadcast(l.first_copy ? bias : nothing(l.dtype));
    if (!l.first_copy) bias.copy_(b);
  }
}

// The j-th of n balanced pieces of [0, total): {start, length}.
std::pair<int64_t, int64_t> piece(int64_t total, int64_t n, int64_t j) {
  return {local_start(total, n, j), local_length(total, n, j)};
}

// y = x W^T + b for a W (out x in) given as its column blocks: `blocks`
// holds W[:, c_j : c_j + k_j] (k_j = widths[j], c_j their running sum), each
// [out, k_j] row-major, one after the other. This is how the ZeRO-3
// all-gather layer receives W_m: every worker's stored shard is such a block,
// so the all-gather of the flattened shards delivers them without staging or
// reordering, and the GEMMs read them in place (docs/linear.md, "What the
// ZeRO-3 all-gather layer does differently"). A local operation (no
// communication): with its own autograd node so that dW is written block by
// block into one buffer of the same layout, which the all-gather's adjoint
// reduce-scatters as it is. `b` is the bias, or an empty tensor for none.
//
// float32 and float64 run one GEMM per block, accumulating into y and
// writing dx's column blocks in place. Other dtypes accumulate in their own
// precision (bfloat16 would round y once per block), so they assemble W with
// one copy and run torch's GEMMs on it: the composed layer's arithmetic.
struct ColumnBlockLinear : torch::autograd::Function<ColumnBlockLinear> {
  static bool blocked(const at::Tensor& x) {
    return x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble;
  }
  // Block j of W as an [out, k_j] view of `blocks`, from column c_j.
  template <typename Each>
  static void for_blocks(const at::Tensor& blocks, int64_t out, const std::vector<int64_t>& widths,
                         Each each) {
    int64_t col = 0, at_ = 0;
    for (size_t j = 0; j < widths.size(); ++j) {
      each(j, col, widths[j], blocks.narrow(0, at_, out * widths[j]).view({out, widths[j]}));
      col += widths[j];
      at_ += out * widths[j];
    }
  }
  static at::Tensor assemble(const at::Tensor& blocks, int64_t out, const std::vector<int64_t>& widths) {
    std::vector<at::Tensor> parts;
    for_blocks(blocks, out, widths, [&](size_t, int64_t, int64_t, at::Tensor w) { parts.push_back(w); });
    return at::cat(parts, 1);
  }

  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& blocks, const at::Tensor& b, int64_t out,
                            std::vector<int64_t> widths) {
    int64_t in = 0;
    for (int64_t k : widths) in += k;
    ctx->save_for_backward({x, blocks});
    ctx->saved_data["out"] = out;
    ctx->saved_data["widths"] = widths;
    std::vector<int64_t> y_sizes = x.sizes().vec();
    y_sizes.back() = out;
    const at::Tensor x2 = x.reshape({-1, in});
    const at::Tensor bias = b.numel() > 0 ? b : at::Tensor();
    if (!blocked(x)) return at::linear(x2, assemble(blocks, out, widths), bias).view(y_sizes);
    at::Tensor y2 = at::empty({x2.size(0), out}, x.options());
    for_blocks(blocks, out, widths, [&](size_t j, int64_t col, int64_t k, at::Tensor w) {
      const at::Tensor xj = x2.narrow(1, col, k);  // strided columns: a valid GEMM operand
      if (j > 0) y2.addmm_(xj, w.t());
      else if (b.numel() > 0) at::addmm_out(y2, b, xj, w.t());
      else at::mm_out(y2, xj, w.t());
    });
    return y2.view(y_sizes);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& blocks = saved[1];
    const int64_t out = ctx->saved_data["out"].toInt();
    const std::vector<int64_t> widths = ctx->saved_data["widths"].toIntVector();
    int64_t in = 0;
    for (int64_t k : widths) in += k;
    const at::Tensor x2 = x.reshape({-1, in});
    const at::Tensor gy = grads[0].reshape({-1, out}).contiguous();
    at::Tensor dx, dblocks, db;
    if (!blocked(x)) {
      const at::Tensor W = assemble(blocks, out, widths);
      if (ctx->needs_input_grad(0)) dx = at::mm(gy, W).view(x.sizes());
      if (ctx->needs_input_grad(1)) {
        const at::Tensor dW = at::mm(gy.t(), x2);
        dblocks = at::empty_like(blocks);
        for_blocks(dblocks, out, widths, [&](size_t, int64_t col, int64_t k, at::Tensor w) {
          w.copy_(dW.narrow(1, col, k));
        });
      }
    } else {
      if (ctx->needs_input_grad(0)) {
        at::Tensor dx2 = at::empty({x2.size(0), in}, x.options());
        for_blocks(blocks, out, widths, [&](size_t, int64_t col, int64_t k, at::Tensor w) {
          at::Tensor dxj = dx2.narrow(1, col, k);  // dx's columns of block j, in place
          at::mm_out(dxj, gy, w);
        });
        dx = dx2.view(x.sizes());
      }
      if (ctx->needs_input_grad(1)) {
        dblocks = at::empty_like(blocks);
        const at::Tensor gyt = gy.t();
        for_blocks(dblocks, out, widths, [&](size_t, int64_t col, int64_t k, at::Tensor w) {
          at::mm_out(w, gyt, x2.narrow(1, col, k));
        });
      }
    }
    if (ctx->needs_input_grad(2)) db = gy.sum(0);
    return {dx, dblocks, db, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

LayerTraffic layer_traffic() { return {g_traffic[kModelParallel].load(), g_traffic[kDataParallel].load()}; }

void detail::count_model_parallel(int64_t bytes) { count(kModelParallel, bytes); }

// --- DistributedLinearBase ---------------------------------------------------

int64_t DistributedLinearBase::in_features() const { return layout_->in; }
const mpi::Partition& DistributedLinearBase::partition() const { return layout_->P_layer; }
int64_t DistributedLinearBase::out_features() const { return layout_->out; }
bool DistributedLinearBase::has_bias() const { return layout_->bias; }
bool DistributedLinearBase::replicated() const { return layout_->replicated; }
std::array<int64_t, 4> DistributedLinearBase::weight_block() const {
  const auto& l = *layout_;
  if (!l.owns_weight) return {0, 0, 0, 0};
  return {l.w_r0, l.w_rn, l.w_c0, l.w_cn};
}
std::array<int64_t, 2> DistributedLinearBase::bias_block() const {
  const auto& l = *layout_;
  if (!l.owns_bias) return {0, 0};
  return {l.b0, l.bn};
}

void DistributedLinearBase::init_parameters(std::shared_ptr<const LinearLayout> layout) {
  layout_ = std::move(layout);
  const auto& l = *layout_;
  // torch::nn::Linear's distribution (kaiming_uniform with a = sqrt(5) is
  // U(-1/sqrt(in), 1/sqrt(in)); the bias uses the same bound), drawn per block.
  const double bound = 1.0 / std::sqrt(static_cast<double>(l.in));
  const auto opts = at::TensorOptions().dtype(l.dtype);
  if (l.owns_weight)
    weight_ = register_parameter("weight", at::empty({l.w_rn, l.w_cn}, opts).uniform_(-bound, bound));
  if (l.owns_bias) bias_ = register_parameter("bias", at::empty({l.bn}, opts).uniform_(-bound, bound));
}

std::string DistributedLinearBase::check_x(const at::Tensor& x, bool holds, int64_t dims,
                                           int64_t features) const {
  const auto& l = *layout_;
  const std::string shape = shape_string(Shape(x.sizes().begin(), x.sizes().end()));
  if (!holds) return x.numel() == 0 ? "" : "passed x of shape " + shape + " but holds no part of x";
  if (dims > 0 && x.dim() != dims)
    return "x of shape " + shape + " has " + std::to_string(x.dim()) + " dimensions, the partition " +
           std::to_string(dims);
  if (x.dim() < 1 || x.size(-1) != features)
    return "x of shape " + shape + " should have " + std::to_string(features) +
           " features in its last dimension (in_features " + std::to_string(l.in) + ")";
  if (x.scalar_type() != l.dtype)
    return "x has dtype " + dtype_name(x.scalar_type()) + ", the layer " + dtype_name(l.dtype);
  return "";
}

void DistributedLinearBase::agree_on_input(const std::string& local_error) const {
  const auto& P = layout_->P_layer;
  if (mpi::all_true(local_error.empty(), P.comm())) return;
  // Someone failed: every rank learns the first failing worker's reason.
  const auto all = P.allgather_data(local_error);
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty())
      throw ShapeError(layout_->name + ": worker " + std::to_string(P.workers()[r]) + " " + all[r],
                       rule_code::kLinearInput);
}

torch::nn::Linear DistributedLinearBase::gather_parameters() const {
  const auto& l = *layout_;
  if (!l.P_params.active()) return torch::nn::Linear(nullptr);
  // Each worker sends its block's coordinates and values (in double: every
  // supported dtype converts to it and back exactly); of a replicated
  // layer's copies, the first.
  const bool sends_w = l.owns_weight && l.first_copy, sends_b = l.owns_bias && l.first_copy;
  std::vector<double> mine = {double(sends_w), double(l.w_r0), double(l.w_rn), double(l.w_c0),
                              double(l.w_cn),  double(sends_b), double(l.b0),   double(l.bn)};
  auto append = [&](const at::Tensor& t) {
    const at::Tensor d = t.detach().to(at::kDouble).contiguous();
    mine.insert(mine.end(), d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
  };
  if (sends_w) append(weight_);
  if (sends_b) append(bias_);
  const auto all = l.P_params.allgather_data(mpi::pack(mine));
  at::Tensor W = at::zeros({l.out, l.in}, at::kDouble), b = at::zeros({l.out}, at::kDouble);
  for (const auto& bytes : all) {
    const auto v = mpi::unpack<double>(bytes);
    const auto i = [&](size_t k) { return static_cast<int64_t>(v[k]); };
    size_t at_ = 8;
    if (v[0] != 0) {
      const at::Tensor block = at::from_blob(const_cast<double*>(v.data() + at_), {i(2), i(4)}, at::kDouble);
      W.slice(0, i(1), i(1) + i(2)).slice(1, i(3), i(3) + i(4)).copy_(block);
      at_ += i(2) * i(4);
    }
    if (v[5] != 0)
      b.slice(0, i(6), i(6) + i(7)).copy_(at::from_blob(const_cast<double*>(v.data() + at_), {i(7)}, at::kDouble));
  }
  torch::nn::Linear global(torch::nn::LinearOptions(l.in, l.out).bias(l.bias));
  global->to(l.dtype);
  torch::NoGradGuard no_grad;
  global->weight.copy_(W);
  if (l.bias) global->bias.copy_(b);
  return global;
}

void DistributedLinearBase::scatter_parameters(const torch::nn::Linear& global) {
  const auto& l = *layout_;
  if (!l.P_params.active()) return;
  std::string error;
  if (global.is_empty())
    error = "no layer given";
  else if (global->options.in_features() != l.in || global->options.out_features() != l.out ||
           global->options.bias() != l.bias)
    error = "got torch::nn::Linear(" + std::to_string(global->options.in_features()) + ", " +
            std::to_string(global->options.out_features()) + ", bias " +
            (global->options.bias() ? "on" : "off") + "), the layer is (" + std::to_string(l.in) + ", " +
            std::to_string(l.out) + ", bias " + (l.bias ? "on" : "off") + ")";
  if (!mpi::all_true(error.empty(), l.P_params.comm()))
    throw ShapeError(l.name + ".scatter_parameters: " +
                         (error.empty() ? "another worker's layer does not fit" : error),
                     rule_code::kLinearParameters);
  torch::NoGradGuard no_grad;
  if (l.owns_weight)
    weight_.copy_(global->weight.slice(0, l.w_r0, l.w_r0 + l.w_rn).slice(1, l.w_c0, l.w_c0 + l.w_cn));
  if (l.owns_bias) bias_.copy_(global->bias.slice(0, l.b0, l.b0 + l.bn));
}

// --- DistDL's parameter layout --------------------------------------------------

namespace {

// The global bias (float64, zeros where nobody gave a block) from every
// P's worker's block [start, start + length) of `values` (if `holds`).
// Collective over P; float64 holds every supported dtype exactly.
at::Tensor assemble_bias(const mpi::Partition& P, int64_t out, bool holds, int64_t start,
                         int64_t length, const at::Tensor& values) {
  std::vector<double> mine = {double(holds), double(start), double(length)};
  if (holds) {
    const at::Tensor v = values.detach().reshape({-1}).to(at::kDouble).contiguous();
    mine.insert(mine.end(), v.data_ptr<double>(), v.data_ptr<double>() + v.numel());
  }
  at::Tensor b = at::zeros({out}, at::kDouble);
  for (const auto& bytes : P.allgather_data(mpi::pack(mine))) {
    const auto v = mpi::unpack<double>(bytes);
    if (v[0] == 0) continue;
    const int64_t s = static_cast<int64_t>(v[1]), n = static_cast<int64_t>(v[2]);
    b.slice(0, s, s + n).copy_(at::from_blob(const_cast<double*>(v.data() + 3), {n}, at::kDouble));
  }
  return b;
}

std::optional<Shape> held_shape(LinearLayout::Held held, const Shape& shape) {
  if (held == LinearLayout::kNone) return std::nullopt;
  return held == LinearLayout::kBuffer ? Shape{0} : shape;
}

// "" when `t` fits what DistDL holds here, else why not.
std::string distdl_fits(const at::Tensor& t, LinearLayout::Held held, const Shape& shape,
                        const char* what) {
  const auto shape_of = [](const at::Tensor& x) { return shape_string(Shape(x.sizes().begin(), x.sizes().end())); };
  if (held == LinearLayout::kBlock) {
    if (!t.defined()) return std::string(what) + " is undefined, DistDL's here is " + shape_string(shape);
    if (!t.sizes().equals(shape))
      return std::string(what) + " has shape " + shape_of(t) + ", DistDL's here is " + shape_string(shape);
    if (!at::isFloatingType(t.scalar_type()))
      return std::string(what) + " has dtype " + dtype_name(t.scalar_type()) + ", not a floating type";
    return "";
  }
  if (t.defined() && t.numel() > 0)
    return std::string(what) + " has shape " + shape_of(t) + ", but DistDL holds " +
           (held == LinearLayout::kBuffer ? "a zero-volume buffer" : "none") + " here";
  return "";
}

}  // namespace

std::optional<Shape> DistributedLinearBase::distdl_weight_shape() const {
  const auto& l = *layout_;
  if (!l.P_params.active()) return std::nullopt;
  return held_shape(l.dd_w, l.dd_w_shape);
}

std::optional<Shape> DistributedLinearBase::distdl_bias_shape() const {
  const auto& l = *layout_;
  if (!l.P_params.active()) return std::nullopt;
  return held_shape(l.dd_b, l.dd_b_shape);
}

DistDLParameters DistributedLinearBase::to_distdl() const {
  const auto& l = *layout_;
  DistDLParameters out;
  if (!l.P_params.active()) return out;
  torch::NoGradGuard no_grad;
  const auto opts = at::TensorOptions().dtype(l.dtype);
  if (l.dd_w == LinearLayout::kBuffer) out.weight = at::zeros({0}, opts);
  if (l.dd_w == LinearLayout::kBlock)
    out.weight = (l.dd_w_transposed ? weight_.t() : weight_).clone(at::MemoryFormat::Contiguous).view(l.dd_w_shape);
  at::Tensor b;  // DistDL's bias block on this rank, 1-D
  if (l.dd_b_moves) {
    const at::Tensor full = assemble_bias(l.P_params, l.out, l.owns_bias, l.b0, l.bn, bias_);
    if (l.dd_b == LinearLayout::kBlock) b = full.slice(0, l.dd_b0, l.dd_b0 + l.dd_bn).to(l.dtype);
  } else if (l.dd_b == LinearLayout::kBlock) {
    b = bias_.clone();
  }
  if (l.dd_b == LinearLayout::kBuffer) out.bias = at::zeros({0}, opts);
  if (l.dd_b == LinearLayout::kBlock) out.bias = b.contiguous().view(l.dd_b_shape);
  return out;
}

void DistributedLinearBase::from_distdl(const DistDLParameters& p) {
  const auto& l = *layout_;
  if (!l.P_params.active()) return;
  std::string error = distdl_fits(p.weight, l.dd_w, l.dd_w_shape, "weight");
  if (error.empty()) error = distdl_fits(p.bias, l.dd_b, l.dd_b_shape, "bias");
  if (!mpi::all_true(error.empty(), l.P_params.comm())) {
    const auto all = l.P_params.allgather_data(error);
    for (size_t r = 0; r < all.size(); ++r)
      if (!all[r].empty())
        throw ShapeError(l.name + ".from_distdl: worker " + std::to_string(l.P_params.workers()[r]) + ": " +
                             all[r],
                         rule_code::kLinearParameters);
  }
  torch::NoGradGuard no_grad;
  if (l.dd_w == LinearLayout::kBlock) {
    if (l.dd_w_transposed)
      weight_.copy_(p.weight.reshape({l.w_cn, l.w_rn}).t());
    else
      weight_.copy_(p.weight.reshape({l.w_rn, l.w_cn}));
  }
  if (l.dd_b_moves) {
    const bool holds = l.dd_b == LinearLayout::kBlock;
    const at::Tensor full = assemble_bias(l.P_params, l.out, holds, l.dd_b0, l.dd_bn, holds ? p.bias : at::Tensor());
    if (l.owns_bias) bias_.copy_(full.slice(0, l.b0, l.b0 + l.bn));
  } else if (l.dd_b == LinearLayout::kBlock) {
    bias_.copy_(p.bias.reshape({l.bn}));
  }
  // DistDL holds a replicated layer's blocks on the first copy only.
  sync_copies();
}

// --- DistributedLinear (general) ---------------------------------------------

struct DistributedLinearImpl::Parts {
  mpi::Partition P_x, P_y, P_W;
  Broadcast broadcast_x{nullptr};
  SumReduce sum_reduce_y{nullptr};
};

DistributedLinearImpl::DistributedLinearImpl(const mpi::Partition& P_x, const mpi::Partition& P_y,
                                             const mpi::Partition& P_W, int64_t in_features,
                                             int64_t out_features, LinearOptions o)
    : p_(std::make_shared<Parts>()) {
  auto l = std::make_shared<LinearLayout>();
  l->name = "DistributedLinear";
  checked_construction(l->name, in_features, out_features, o, {&P_x, &P_y, &P_W}, [&] {
    require(!o.replicated(), l->name,
            "LinearOptions::replicated does not apply: DistributedLinear has no data-parallel copies (P_x is 1 x P_fin)");
    const auto shape_is = [](const mpi::Partition& P, int64_t a, int64_t b) {
      return !P.is_null() && P.cartesian() && P.shape() == Shape{a, b};
    };
    require(P_W.cartesian() && P_W.shape().size() == 2, l->name,
            "P_W must be a 2-D Cartesian partition P_fout x P_fin, got " + describe(P_W));
    const int64_t fout = P_W.shape()[0], fin = P_W.shape()[1];
    require(shape_is(P_x, 1, fin), l->name,
            "P_x must be 1 x P_fin = 1 x " + std::to_string(fin) + " (P_W is " + describe(P_W) + "), got " +
                describe(P_x));
    require(shape_is(P_y, 1, fout), l->name,
            "P_y must be 1 x P_fout = 1 x " + std::to_string(fout) + " (P_W is " + describe(P_W) + "), got " +
                describe(P_y));
    require(in_features >= fin && out_features >= fout, l->name,
            "in_features " + std::to_string(in_features) + " and out_features " + std::to_string(out_features) +
                " must be at least P_fin " + std::to_string(fin) + " and P_fout " + std::to_string(fout));
  });
  p_->P_x = P_x;
  p_->P_y = P_y;
  p_->P_W = P_W;
  p_->broadcast_x = Broadcast(P_x, P_W);
  // P_W's rows are the output blocks: with P_W read transposed (P_fin x
  // P_fout), P_y (1 x P_fout) matches its last dimension, and each row of
  // P_W sums into the P_y worker of the same output block (seed 002's note).
  Options reduce;
  reduce.transpose_src(true);
  p_->sum_reduce_y = SumReduce(P_W, P_y, reduce);
  l->in = in_features;
  l->out = out_features;
  l->bias = o.bias();
  l->dtype = o.dtype();
  l->replicated = o.replicated();
  l->P_layer = P_x.create_partition_union(P_W).create_partition_union(P_y);
  l->P_params = P_W;
  if (P_W.active()) {
    const Index i = P_W.index();
    const int64_t fout = P_W.shape()[0], fin = P_W.shape()[1];
    l->owns_weight = true;
    std::tie(l->w_r0, l->w_rn) = piece(out_features, fout, i[0]);
    std::tie(l->w_c0, l->w_cn) = piece(in_features, fin, i[1]);
    // The bias lives on column 0 of P_W only, so the row sum adds it once.
    l->owns_bias = o.bias() && i[1] == 0;
    l->b0 = l->w_r0;
    l->bn = l->w_rn;
    // DistDL: a torch.nn.Linear `sublinear` per P_W worker, bias on column 0.
    l->dd_w = LinearLayout::kBlock;
    l->dd_w_shape = {l->w_rn, l->w_cn};
    if (l->owns_bias) {
      l->dd_b = LinearLayout::kBlock;
      l->dd_b_shape = {l->bn};
      l->dd_b0 = l->b0;
      l->dd_bn = l->bn;
    }
  }
  init_parameters(l);
}

torch::Tensor DistributedLinearImpl::forward(const torch::Tensor& x) {
  const auto& l = *layout_;
  if (!l.P_layer.active()) return x.clone();
  const int64_t fin = p_->P_W.shape()[1];
  const int64_t j = p_->P_x.active() ? p_->P_x.index()[1] : 0;
  agree_on_input(check_x(x, p_->P_x.active(), -1, local_length(l.in, fin, j)));
  const at::Tensor xb = p_->broadcast_x(x);
  const at::Tensor partial = p_->P_W.active() ? at::linear(xb, weight_, bias_) : xb;
  return p_->sum_reduce_y(partial);
}

// --- DistributedLinearAllGather (and Zero) --------------------------------------

struct DistributedLinearAllGatherImpl::Parts {
  bool zero = false;
  mpi::Partition P_y, P_x;
  Broadcast broadcast_w{nullptr};          // standard data parallelism
  AllGather gather_w{nullptr}, gather_b{nullptr};  // ZeRO-3
  std::vector<int64_t> shard_widths;               // ZeRO-3: W_m's column blocks
  AllGather gather_x{nullptr};
  bool separate = false;
};

DistributedLinearAllGatherImpl::DistributedLinearAllGatherImpl(const mpi::Partition& P_x,
                                                               const mpi::Partition& P_y,
                                                               int64_t in_features,
                                                               int64_t out_features,
                                                               LinearOptions options)
    : DistributedLinearAllGatherImpl(false, P_x, P_y, in_features, out_features, options) {}

DistributedLinearAllGatherZeroImpl::DistributedLinearAllGatherZeroImpl(const mpi::Partition& P_x,
                                                                       const mpi::Partition& P_y,
                                                                       int64_t in_features,
                                                                       int64_t out_features,
                                                                       LinearOptions options)
    : DistributedLinearAllGatherImpl(true, P_x, P_y, in_features, out_features, options) {}

DistributedLinearAllGatherImpl::DistributedLinearAllGatherImpl(bool zero, const mpi::Partition& P_x_given,
                                                               const mpi::Partition& P_y,
                                                               int64_t in, int64_t out,
                                                               LinearOptions o)
    : p_(std::make_shared<Parts>()) {
  auto l = std::make_shared<LinearLayout>();
  l->name = zero ? "DistributedLinearAllGatherZero" : "DistributedLinearAllGather";
  const mpi::Partition& P_x = P_x_given.is_null() ? P_y : P_x_given;
  checked_construction(l->name, in, out, o, {&P_y, &P_x}, [&] {
    require(!(zero && o.replicated()), l->name,
            "LinearOptions::replicated does not apply: the fully-sharded layer shards W over the data-parallel copies");
    const size_t d = P_y.shape().size();
    require(!P_y.is_null() && P_y.cartesian() && d >= 2 && P_y.shape()[d - 2] == 1, l->name,
            "P_y must be a Cartesian partition D x ... x 1 x M, got " + describe(P_y));
    if (!P_x_given.is_null()) {
      Shape want = P_y.shape();
      std::swap(want[d - 1], want[d - 2]);
      require(P_x.cartesian() && P_x.shape() == want && P_x.workers() == P_y.workers(), l->name,
              "P_x must be P_y's workers as " + shape_string(want) + " (x split along the tokens), got " +
                  describe(P_x) + " with P_y " + describe(P_y));
    }
    const int64_t M = P_y.shape()[d - 1];
    require(out >= M && in >= 1, l->name,
            "out_features " + std::to_string(out) + " must be at least M = " + std::to_string(M));
    if (zero) {
      require(d >= 3, l->name, "the fully-sharded layer needs a data-parallel axis (P_y of 3 or more dimensions), got " + describe(P_y));
      for (size_t k = 1; k + 2 < d; ++k)
        require(P_y.shape()[k] == 1, l->name,
                "the fully-sharded layer shards over data-parallel axis 0 only; P_y " + describe(P_y) +
                    " splits axis " + std::to_string(k));
      const int64_t D = P_y.shape()[0];
      require(in >= D && local_length(out, M, M - 1) >= D, l->name,
              "every shard must be non-empty: in_features " + std::to_string(in) + " and out_features / M (" +
                  std::to_string(out) + " / " + std::to_string(M) + ") must be at least D = " + std::to_string(D));
    }
  });
  const size_t d = P_y.shape().size();
  const int64_t M = P_y.shape()[d - 1];
  p_->zero = zero;
  p_->P_y = P_y;
  p_->P_x = P_x;
  p_->separate = !P_x_given.is_null();
  // W is applied on P_y's workers read as D x ... x M x 1: worker (.., 0, m)
  // of P_y holds output block m.
  Shape apply_shape = P_y.shape();
  std::swap(apply_shape[d - 1], apply_shape[d - 2]);
  const auto P_apply = cartesian_of(P_y.workers(), apply_shape);
  if (zero) {
    // Shards of W_m along its input features and of b_m, over axis 0. Each
    // shard is a contiguous [out_m, k_d] block of W_m's columns: they are
    // gathered flattened, one block after the other (a 1-D gather, which
    // moves them as they are), and the local linear reads W_m block by block.
    p_->gather_w = AllGather(P_apply, 0, 0);
    p_->gather_b = AllGather(P_apply, 0, 0);
    for (int64_t j = 0; j < P_y.shape()[0]; ++j) p_->shard_widths.push_back(local_length(in, P_y.shape()[0], j));
  } else {
    // Stored on the first data-parallel copy (1 x ... x M x 1), broadcast to
    // the others in the forward; the adjoint sums the copies' gradients.
    Shape store_shape(d, 1);
    store_shape[d - 2] = M;
    const auto P_store = cartesian_of(workers_where(P_y, leading_zero), store_shape);
    // With one data-parallel copy (D = 1) every worker is its own store:
    // no broadcast, W is used where it lives (saves a copy of W_m per call).
    if (volume(P_y.shape()) > M) p_->broadcast_w = Broadcast(P_store, P_apply);
  }
  const int axis = model_axis(P_x);
  p_->gather_x = AllGather(P_x, axis, axis);
  l->in = in;
  l->out = out;
  l->bias = o.bias();
  l->dtype = o.dtype();
  l->replicated = o.replicated();
  l->P_layer = P_y;
  l->P_params = P_y;
  if (P_y.active()) {
    const Index i = P_y.index();
    const int64_t m = i[d - 1];
    const auto [r0, rn] = piece(out, M, m);
    if (zero) {
      const int64_t D = P_y.shape()[0];
      l->owns_weight = true;
      l->w_r0 = r0;
      l->w_rn = rn;
      std::tie(l->w_c0, l->w_cn) = piece(in, D, i[0]);
      l->owns_bias = o.bias();
      const auto [s, n] = piece(rn, D, i[0]);
      l->b0 = r0 + s;
      l->bn = n;
    } else if (leading_zero(i) || o.replicated()) {
      l->owns_weight = true;
      l->first_copy = leading_zero(i);
      l->w_r0 = r0;
      l->w_rn = rn;
      l->w_c0 = 0;
      l->w_cn = in;
      l->owns_bias = o.bias();
      l->b0 = r0;
      l->bn = rn;
    }
    // DistDL (linear_ag.py, linear_ag_zero.py): W_m as [1, ..., out_m, in] on
    // the stored copy, zero-volume buffers on the other data-parallel
    // copies; ZeRO-3: every worker its shard transposed, [in_d, ..., out_m,
    // 1]; b's block as [1, ..., n, 1]. The blocks are partita's. (A
    // replicated layer is DistDL's with the stored copy's values everywhere.)
    if (l->owns_weight && l->first_copy) {
      l->dd_w = LinearLayout::kBlock;
      l->dd_w_transposed = zero;
      l->dd_w_shape = zero ? ones_with(d, {{0, l->w_cn}, {-2, l->w_rn}})
                           : ones_with(d, {{-2, l->w_rn}, {-1, l->w_cn}});
    } else {
      l->dd_w = LinearLayout::kBuffer;
    }
    if (l->owns_bias && l->first_copy) {
      l->dd_b = LinearLayout::kBlock;
      l->dd_b_shape = ones_with(d, {{-2, l->bn}});
      l->dd_b0 = l->b0;
      l->dd_bn = l->bn;
    } else if (o.bias()) {
      l->dd_b = LinearLayout::kBuffer;
    }
  }
  init_parameters(l);
  sync_copies();
}

void DistributedLinearAllGatherImpl::sync_copies() {
  if (p_->P_y.active()) copy_from_first(p_->broadcast_w, *layout_, weight_, bias_);
}

torch::Tensor DistributedLinearAllGatherImpl::forward(const torch::Tensor& x) {
  const auto& l = *layout_;
  if (!p_->P_y.active()) return x.clone();
  const int64_t d = static_cast<int64_t>(p_->P_y.shape().size());
  const int64_t M = p_->P_y.shape()[d - 1];
  const int64_t m = p_->P_y.index()[d - 1];
  agree_on_input(check_x(x, true, d, p_->separate ? l.in : local_length(l.in, M, m)));
  const at::Tensor xg = gathered(p_->gather_x, x, p_->P_x.shape()[model_axis(p_->P_x)], kModelParallel);
  at::Tensor W, b;
  if (p_->zero) {
    // W_m as its column blocks in data-parallel order: the composed
    // all-gather along dimension 1 without assembling W_m.
    const int64_t D = p_->P_y.shape()[0];
    const at::Tensor blocks = gathered(p_->gather_w, weight_.reshape({-1}), D, kDataParallel);
    if (l.bias) b = gathered(p_->gather_b, bias_, D, kDataParallel);
    // (No bias: an empty tensor, as torch's custom functions take no undefined input.)
    return ColumnBlockLinear::apply(xg, blocks, l.bias ? b : nothing(l.dtype), l.w_rn, p_->shard_widths);
  } else if (l.replicated) {
    W = weight_;
    b = bias_;
  } else {
    W = share(p_->broadcast_w, weight_, l.owns_weight, l.dtype, copies(p_->P_y));
    if (l.bias) b = share(p_->broadcast_w, bias_, l.owns_bias, l.dtype, copies(p_->P_y));
  }
  return at::linear(xg, W, b);
}

// --- DistributedLinearReduceScatter (and Zero) ----------------------------------

struct DistributedLinearReduceScatterImpl::Parts {
  bool zero = false;
  mpi::Partition P_x, P_y;
  Broadcast broadcast_w{nullptr};
  AllGather gather_w{nullptr}, gather_b{nullptr};
  ReduceScatter scatter_y{nullptr};
};

DistributedLinearReduceScatterImpl::DistributedLinearReduceScatterImpl(const mpi::Partition& P_x,
                                                                       const mpi::Partition& P_y,
                                                                       int64_t in_features,
                                                                       int64_t out_features,
                                                                       LinearOptions options)
    : DistributedLinearReduceScatterImpl(false, P_x, P_y, in_features, out_features, options) {}

DistributedLinearReduceScatterZeroImpl::DistributedLinearReduceScatterZeroImpl(
    const mpi::Partition& P_x, const mpi::Partition& P_y, int64_t in_features, int64_t out_features,
    LinearOptions options)
    : DistributedLinearReduceScatterImpl(true, P_x, P_y, in_features, out_features, options) {}

DistributedLinearReduceScatterImpl::DistributedLinearReduceScatterImpl(bool zero, const mpi::Partition& P_x,
                                                                       const mpi::Partition& P_y_given,
                                                                       int64_t in, int64_t out,
                                                                       LinearOptions o)
    : p_(std::make_shared<Parts>()) {
  auto l = std::make_shared<LinearLayout>();
  l->name = zero ? "DistributedLinearReduceScatterZero" : "DistributedLinearReduceScatter";
  const mpi::Partition& P_y = P_y_given.is_null() ? P_x : P_y_given;
  checked_construction(l->name, in, out, o, {&P_x, &P_y}, [&] {
    require(!(zero && o.replicated()), l->name,
            "LinearOptions::replicated does not apply: the fully-sharded layer shards W over the data-parallel copies");
    const size_t d = P_x.shape().size();
    require(!P_x.is_null() && P_x.cartesian() && d >= 2 && P_x.shape()[d - 2] == 1, l->name,
            "P_x must be a Cartesian partition D x ... x 1 x M, got " + describe(P_x));
    if (!P_y_given.is_null()) {
      Shape want = P_x.shape();
      std::swap(want[d - 1], want[d - 2]);
      require(P_y.cartesian() && P_y.shape() == want && P_y.workers() == P_x.workers(), l->name,
              "P_y must be P_x's workers as " + shape_string(want) + " (y split along the tokens), got " +
                  describe(P_y) + " with P_x " + describe(P_x));
    }
    const int64_t M = P_x.shape()[d - 1];
    require(in >= M && out >= M, l->name,
            "in_features " + std::to_string(in) + " and out_features " + std::to_string(out) +
                " must be at least M = " + std::to_string(M));
    if (zero) {
      require(d >= 3, l->name, "the fully-sharded layer needs a data-parallel axis (P_x of 3 or more dimensions), got " + describe(P_x));
      for (size_t k = 1; k + 2 < d; ++k)
        require(P_x.shape()[k] == 1, l->name,
                "the fully-sharded layer shards over data-parallel axis 0 only; P_x " + describe(P_x) +
                    " splits axis " + std::to_string(k));
      const int64_t D = P_x.shape()[0];
      require(out >= D && (!o.bias() || local_length(out, M, M - 1) >= D), l->name,
              "every shard must be non-empty: out_features " + std::to_string(out) +
                  (o.bias() ? " / M = " + std::to_string(M) : std::string()) + " must be at least D = " +
                  std::to_string(D));
    }
  });
  const size_t d = P_x.shape().size();
  const int64_t M = P_x.shape()[d - 1];
  p_->zero = zero;
  p_->P_x = P_x;
  p_->P_y = P_y;
  if (zero) {
    // Shards of W_m along its output features and of b_m, over axis 0.
    p_->gather_w = AllGather(P_x, 0, 0);
    p_->gather_b = AllGather(P_x, 0, 0);
  } else {
    Shape store_shape(d, 1);
    store_shape[d - 1] = M;
    const auto P_store = cartesian_of(workers_where(P_x, leading_zero), store_shape);
    if (volume(P_x.shape()) > M) p_->broadcast_w = Broadcast(P_store, P_x);  // D > 1
  }
  const int axis = model_axis(P_y);
  p_->scatter_y = ReduceScatter(P_y, axis, axis);
  l->in = in;
  l->out = out;
  l->bias = o.bias();
  l->dtype = o.dtype();
  l->replicated = o.replicated();
  l->P_layer = P_x;
  l->P_params = P_x;
  if (P_x.active()) {
    const Index i = P_x.index();
    const int64_t m = i[d - 1];
    const auto [c0, cn] = piece(in, M, m);
    const auto [o0, on] = piece(out, M, m);  // the bias block of worker m
    if (zero) {
      const int64_t D = P_x.shape()[0];
      l->owns_weight = true;
      std::tie(l->w_r0, l->w_rn) = piece(out, D, i[0]);
      l->w_c0 = c0;
      l->w_cn = cn;
      l->owns_bias = o.bias();
      const auto [s, n] = piece(on, D, i[0]);
      l->b0 = o0 + s;
      l->bn = n;
    } else if (leading_zero(i) || o.replicated()) {
      l->owns_weight = true;
      l->first_copy = leading_zero(i);
      l->w_r0 = 0;
      l->w_rn = out;
      l->w_c0 = c0;
      l->w_cn = cn;
      l->owns_bias = o.bias();
      l->b0 = o0;
      l->bn = on;
    }
    // DistDL (linear_rs.py, linear_rs_zero.py): W's block as [1, ..., out,
    // in_m] on the stored copy (zero-volume buffers elsewhere), ZeRO-3 every
    // worker its shard as [out_d, 1, ..., in_m]. The bias is not partita's:
    // linear_rs.py keeps all of it, [1, ..., out, 1], on P_x's worker 0, a
    // zero-volume buffer on the other workers of model-parallel index 0 and
    // none elsewhere; linear_rs_zero.py shards it over axis 0 on the workers
    // of model-parallel index 0 only, [out_d, 1, ..., 1] (entries
    // piece(out, D, d)), and none elsewhere.
    if (l->owns_weight && l->first_copy) {
      l->dd_w = LinearLayout::kBlock;
      l->dd_w_shape = zero ? ones_with(d, {{0, l->w_rn}, {-1, l->w_cn}})
                           : ones_with(d, {{-2, l->w_rn}, {-1, l->w_cn}});
    } else {
      l->dd_w = LinearLayout::kBuffer;
    }
    if (o.bias()) {
      l->dd_b_moves = true;
      const bool model_index_0 = i[d - 1] == 0 && i[d - 2] == 0;
      if (zero && model_index_0) {
        l->dd_b = LinearLayout::kBlock;
        std::tie(l->dd_b0, l->dd_bn) = piece(out, P_x.shape()[0], i[0]);
        l->dd_b_shape = ones_with(d, {{0, l->dd_bn}});
      } else if (!zero && P_x.rank() == 0) {
        l->dd_b = LinearLayout::kBlock;
        l->dd_b0 = 0;
        l->dd_bn = out;
        l->dd_b_shape = ones_with(d, {{-2, out}});
      } else if (!zero && model_index_0) {
        l->dd_b = LinearLayout::kBuffer;
      }
    }
  }
  init_parameters(l);
  sync_copies();
}

void DistributedLinearReduceScatterImpl::sync_copies() {
  if (p_->P_x.active()) copy_from_first(p_->broadcast_w, *layout_, weight_, bias_);
}

torch::Tensor DistributedLinearReduceScatterImpl::forward(const torch::Tensor& x) {
  const auto& l = *layout_;
  if (!p_->P_x.active()) return x.clone();
  const int64_t d = static_cast<int64_t>(p_->P_x.shape().size());
  const int64_t M = p_->P_x.shape()[d - 1];
  const int64_t m = p_->P_x.index()[d - 1];
  agree_on_input(check_x(x, true, d, local_length(l.in, M, m)));
  const int64_t D = p_->P_x.shape()[0];
  const at::Tensor W = p_->zero         ? gathered(p_->gather_w, weight_, D, kDataParallel)
                       : l.replicated ? weight_
                                      : share(p_->broadcast_w, weight_, l.owns_weight, l.dtype, copies(p_->P_x));
  at::Tensor partial = at::linear(x, W);
  if (l.bias) {
    // b is split over the model-parallel workers (seed 002): worker m adds
    // its block into its slice of the output features, so the reduction
    // counts every entry of b once, whichever way y is then scattered.
    const at::Tensor bm = p_->zero         ? gathered(p_->gather_b, bias_, D, kDataParallel)
                          : l.replicated ? bias_
                                         : share(p_->broadcast_w, bias_, l.owns_bias, l.dtype, copies(p_->P_x));
    const int64_t start = local_start(l.out, M, m);
    partial = partial + at::constant_pad_nd(bm, {start, l.out - start - bm.size(0)});
  }
  return scattered(p_->scatter_y, partial, p_->P_y.shape()[model_axis(p_->P_y)], kModelParallel);
}

}  // namespace partita::nn
