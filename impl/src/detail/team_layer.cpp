// Broadcast and SumReduce's shared team code (team_layer.hpp); the public
// plans and modules are in nn/broadcast.cpp and nn/sum_reduce.cpp.
#include "detail/team_layer.hpp"

#include <ATen/core/grad_mode.h>

#include "detail/layer_checks.hpp"
#include "detail/plan_cache.hpp"
#include "detail/plan_check.hpp"
#include "detail/team_comm.hpp"

namespace partita::nn::detail {

using namespace partita::mpi::detail;

TeamLayer::TeamLayer(Kind k, const mpi::Partition& px, const mpi::Partition& py, Options o)
    : kind(k), P_x(px), P_y(py), options(o) {
  name = std::string(k == Kind::Broadcast ? "Broadcast" : "SumReduce") + "(P_x " +
         px.describe() + (o.transpose_src() ? " transposed" : "") + " -> P_y " + py.describe() +
         (o.transpose_dest() ? " transposed" : "") + ")";
  adjoint_name = name + " adjoint";
  auto sendrecv = k == Kind::Broadcast
                      ? px.create_broadcast_partition_to(py, o.transpose_src(), o.transpose_dest())
                      : px.create_reduction_partition_to(py, o.transpose_src(), o.transpose_dest());
  P_send = sendrecv.first;
  P_recv = sendrecv.second;
  teams = k == Kind::Broadcast ? mpi::broadcast_teams(px, py, o.transpose_src(), o.transpose_dest())
                               : mpi::reduction_teams(px, py, o.transpose_src(), o.transpose_dest());
  P_union = px.create_partition_union(py);
  for (const auto& t : teams) contributors.push_back(t.paired);
  plans.set_static_shapes(o.shapes() == Shapes::kStatic);
  for (const auto& t : teams)
    if (P_recv.active() && t.workers() == P_recv.workers())
      y_source = k == Kind::Broadcast ? t.root : t.paired.at(0);
}

// Checked mode: the root of a broadcast team sends its input to every
// member; a member of a reduction team sends its contribution to the root.
std::vector<PeerClaim> TeamLayer::claims(const at::Tensor& x, const Shape& out_shape,
                                         at::ScalarType out_dtype) const {
  std::vector<PeerClaim> c(P_union.size());
  const bool self = P_send.active() && P_recv.active() && P_send.comm() == P_recv.comm();
  const auto none = [](const mpi::Partition& t) { return std::vector<int64_t>(t.size(), 0); };
  if (kind == Kind::Broadcast) {
    if (P_send.active())  // root
      add_team_claims(c, P_union, P_send.workers(), std::vector<int64_t>(P_send.size(), x.numel()),
                      none(P_send), static_cast<int64_t>(x.scalar_type()));
    if (P_recv.active() && !self) {  // member: from the root only
      auto recv = none(P_recv);
      recv[0] = volume(out_shape);
      add_team_claims(c, P_union, P_recv.workers(), none(P_recv), recv,
                      static_cast<int64_t>(out_dtype));
    }
  } else {
    if (P_recv.active())  // root: from every member
      add_team_claims(c, P_union, P_recv.workers(), none(P_recv),
                      std::vector<int64_t>(P_recv.size(), volume(out_shape)),
                      static_cast<int64_t>(out_dtype));
    if (P_send.active() && !self) {  // member: to the root only
      auto send = none(P_send);
      send[0] = x.numel();
      add_team_claims(c, P_union, P_send.workers(), send, none(P_send),
                      static_cast<int64_t>(x.scalar_type()));
    }
  }
  return c;
}

std::shared_ptr<const TeamLayer::Compiled> TeamLayer::prepare(const at::Tensor& x) const {
  std::vector<Header> headers;
  if (auto hit = plans.lookup(P_union, make_header(x), name, headers)) return hit;
  check_inputs(name, P_union, P_x, headers);
  check_volumes_fit(name, P_union, headers);
  // The output's shape and dtype: those of the root's input (broadcast) or
  // of the team's contributors, which must agree (sum-reduce).
  Shape out_shape;
  at::ScalarType out_dtype = x.scalar_type();
  if (kind == Kind::SumReduce) check_same_shapes(name, P_union, contributors, headers, "reduction team");
  if (y_source >= 0) {
    const Header& h = header_of(P_union, headers, y_source);
    out_shape = h.shape();
    out_dtype = h.scalar_type();
  }
  check_plan(P_union, name, claims(x, out_shape, out_dtype));
  auto c = std::make_shared<Compiled>();
  c->out_shape = std::move(out_shape);
  c->out_dtype = out_dtype;
  c->attach = agree_attach(name, P_union, headers);
  plans.insert(headers, c);
  return c;
}

at::Tensor TeamLayer::forward(const at::Tensor& x) const {
  if (!P_union.active()) return x.clone();  // in neither partition
  const auto c = prepare(x);
  const Shape& out_shape = c->out_shape;
  const auto out_options = x.options().dtype(c->out_dtype).requires_grad(false);
  const bool attach = c->attach;

  at::Tensor y;
  {
    const NoGradIfNeeded no_grad(x);
    y = kind == Kind::Broadcast
            ? bcast_teams(P_send, P_recv, x, out_shape, out_options, name, &out_slot)
            : reduce_teams(P_recv, P_send, x, out_shape, out_options, name, &out_slot);
    if (!y.defined()) y = zero_volume_like(x, options.preserve_batch());
  }
  // (with_adjoint returns y as it is when no node is attached: the
  // adjoint's closure is only built when one is.)
  if (!attach) {
    out_slot.keep(y);
    return y;
  }
  // The adjoint: the other direction over the same teams, into x's shape.
  const Shape x_shape = shape_of(x);
  const auto x_options = x.options().requires_grad(false);
  const bool broadcast = kind == Kind::Broadcast;
  const mpi::Partition send = P_send, recv = P_recv;
  return with_adjoint(y, x, true, name, [=, what = adjoint_name](const at::Tensor& gy) {
    at::Tensor gx = broadcast ? reduce_teams(send, recv, gy, x_shape, x_options, what)
                              : bcast_teams(recv, send, gy, x_shape, x_options, what);
    return gx.defined() ? gx : at::zeros(x_shape, x_options);
  });
}

}  // namespace partita::nn::detail
