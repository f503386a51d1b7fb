#include "partita/nn/all_sum_reduce.hpp"

#include <ATen/core/grad_mode.h>


#include "detail/layer_checks.hpp"
#include "detail/plan_cache.hpp"
#include "detail/team_comm.hpp"

namespace partita::nn {

namespace detail {

using namespace partita::mpi::detail;

struct AllSumReduceLayer {
  std::string name, adjoint_name;  // both made once, not per call
  mpi::Partition P_x, team;
  std::vector<Ranks> groups;  // every team, world ranks
  // A call's plan (detail/plan_cache.hpp): the checks passed, and whether
  // the adjoint is attached.
  struct Compiled {
    bool attach = false;
  };
  PlanCache<Compiled> plans;
  // The last output returned without an autograd node, for the next call
  // (detail/team_comm.hpp, docs/output-reuse.md).
  OutputSlot out_slot;

  std::shared_ptr<const Compiled> prepare(const at::Tensor& x) const {
    std::vector<Header> headers;
    if (auto hit = plans.lookup(P_x, make_header(x), name, headers)) return hit;
    check_inputs(name, P_x, P_x, headers);
    check_same_shapes(name, P_x, groups, headers, "all-reduction team");
    if (team.size() > 1) check_volumes_fit(name, P_x, headers);
    auto c = std::make_shared<Compiled>();
    c->attach = agree_attach(name, P_x, headers);
    plans.insert(headers, c);
    return c;
  }

  at::Tensor forward(const at::Tensor& x) const {
    if (!P_x.active()) return x.clone();
    const bool attach = prepare(x)->attach;
    at::Tensor y;
    {
      const NoGradIfNeeded no_grad(x);
      y = allreduce_team(team, x, name, &out_slot);
    }
    // (with_adjoint returns y as it is when no node is attached: the
    // adjoint's closure is only built when one is.)
    if (!attach) {
      out_slot.keep(y);
      return y;
    }
    return with_adjoint(y, x, true, name,
                        [t = team, what = adjoint_name](const at::Tensor& gy) {
                          return allreduce_team(t, gy, what);
                        });
  }
};

}  // namespace detail

namespace functional {

AllSumReducePlan::AllSumReducePlan(const mpi::Partition& P_x, std::vector<int> axes,
                                   Shapes shapes) {
  auto l = std::make_shared<detail::AllSumReduceLayer>();
  l->name = "AllSumReduce(P_x " + P_x.describe() + " over dimensions {" +
            list_string(Ranks(axes.begin(), axes.end())) + "})";
  l->adjoint_name = l->name + " adjoint";
  l->P_x = P_x;
  l->team = P_x.create_allreduction_partition(axes);
  l->groups = detail::teams_along(P_x, axes);  // for the shape checks
  l->plans.set_static_shapes(shapes == Shapes::kStatic);
  layer_ = l;
}

const mpi::Partition& AllSumReducePlan::team() const { return layer_->team; }
at::Tensor all_sum_reduce(const at::Tensor& x, const AllSumReducePlan& plan) {
  return plan.layer_->forward(x);
}

}  // namespace functional

AllSumReduceImpl::AllSumReduceImpl(const mpi::Partition& P_x, std::vector<int> axes,
                                   Shapes shapes)
    : plan_(P_x, std::move(axes), shapes) {}
torch::Tensor AllSumReduceImpl::forward(const torch::Tensor& x) {
  return functional::all_sum_reduce(x, plan_);
}

}  // namespace partita::nn
