#include "partita/nn/vocab_parallel.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "partita/mpi/runtime.hpp"

#include "detail/layer_checks.hpp"
#include "detail/plan_cache.hpp"
#include "detail/team_comm.hpp"
#include "partita/nn/traffic.hpp"

namespace partita::nn {

namespace detail {

using namespace partita::mpi::detail;

int64_t bytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// The team of workers of P that differ along axis 1 (a replica's tp
// ranks), this worker's place in it, its balanced share of the vocabulary,
// and the agreed checks of the token-split inputs.
struct VocabTeam {
  std::string name;
  mpi::Partition P, team;
  Ranks members;  // world ranks, in team order
  int64_t vocab = 0, start = 0, rows = 0;
  struct Compiled {
    std::vector<int64_t> lengths;  // every member's tokens
    // Whether any member's input wants a gradient (the embedding's table,
    // the cross-entropy's logits): then every member attaches the adjoint,
    // whose collective needs them all.
    bool attach = false;
    // The logits' plan: their [batch, tokens], every member's the same.
    int64_t batch = 0, tokens = 0;
  };
  PlanCache<Compiled> token_plans, logit_plans;

  VocabTeam(const std::string& layer, const mpi::Partition& P_, int64_t vocab_) : P(P_), vocab(vocab_) {
    name = layer + "(P " + P.describe() + ", vocab " + std::to_string(vocab) + ")";
    if (P.is_null()) throw PartitionError(name + ": P is the null partition", rule_code::kNullPartition);
    if (!P.cartesian() || P.shape().size() < 2)
      throw PartitionError(name + ": P must be a Cartesian partition of at least 2 dimensions (replicas, tp, ...)",
                           rule_code::kAxisRange);
    for (size_t a = 2; a < P.shape().size(); ++a)
      if (P.shape()[a] != 1)
        throw PartitionError(name + ": P's dimensions after the second must be 1 (the hidden features are whole)",
                             rule_code::kAxisRange);
    const int64_t t = P.shape()[1];
    if (vocab < t)
      throw PartitionError(name + ": vocab " + std::to_string(vocab) + " must be at least the " + std::to_string(t) +
                               " workers it is split over",
                           rule_code::kLinearLayout);
    team = P.create_allreduction_partition({1});
    if (P.active()) {
      for (const auto& g : teams_along(P, {1}))
        if (std::find(g.begin(), g.end(), mpi::world_rank()) != g.end()) members = g;
      const int64_t s = P.index()[1];
      rows = vocab / t + (s < vocab % t ? 1 : 0);
      start = s * (vocab / t) + std::min(s, vocab % t);
    }
  }

  // Every member's token count for a token-split int64 [batch, tokens_s]
  // input, agreed: every worker sees every header and raises alike.
  // `grad`: this worker's table will want a gradient; the plan's `attach`
  // says whether any member's will (the ids never require grad themselves).
  std::shared_ptr<const Compiled> tokens(const at::Tensor& x, const char* what, bool grad = false) const {
    std::vector<Header> headers;
    Header mine = make_header(x);
    mine.requires_grad = grad_statement(grad);
    if (auto hit = token_plans.lookup(P, mine, name, headers)) return hit;
    check_inputs(name, P, P, headers);
    auto c = std::make_shared<Compiled>();
    for (const int w : members) {
      const Header& h = header_of(P, headers, w);
      const Header& first = header_of(P, headers, members[0]);
      if (h.ndim != 2 || h.scalar_type() != at::kLong)
        throw ShapeError(name + ": the " + what + " of world rank " + std::to_string(w) + " are " +
                             shape_string(h.shape()) + " of " + c10::toString(h.scalar_type()) +
                             "; they must be int64 [batch, tokens]",
                         rule_code::kDtypeUnsupported);
      if (h.dims[0] != first.dims[0])
        throw ShapeError(name + ": world ranks " + std::to_string(members[0]) + " and " + std::to_string(w) +
                             " of one team hold " + what + " of batch " + std::to_string(first.dims[0]) + " and " +
                             std::to_string(h.dims[0]),
                         rule_code::kTeamShapes);
      c->lengths.push_back(h.dims[1]);
    }
    c->attach = agree_attach(name, P, headers, members);
    token_plans.insert(headers, c);
    return c;
  }

  // The team's ids or targets, whole: the same on every member, which each
  // checks for values outside [0, vocab).
  at::Tensor gather_tokens(const at::Tensor& x, const Compiled& c, const char* what) const {
    at::Tensor all = allgather_dim(team, x.contiguous(), 1, c.lengths, name + " (" + what + ")");
    count_model_parallel((team.size() - 1) * bytes(x));
    if (all.numel()) {
      const int64_t lo = all.min().item<int64_t>(), hi = all.max().item<int64_t>();
      if (lo < 0 || hi >= vocab)
        throw ShapeError(name + ": " + what + " " + std::to_string(lo < 0 ? lo : hi) +
                             " lies outside the vocabulary [0, " + std::to_string(vocab) + ")",
                         rule_code::kTilingDims);
    }
    return all;
  }
};

}  // namespace detail

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const mpi::Partition& P, int64_t vocab, int64_t hidden,
                                                       const EmbeddingOptions& options)
    : P_(P), vocab_(vocab), hidden_(hidden) {
  auto team = std::make_shared<detail::VocabTeam>("VocabParallelEmbedding", P, vocab);
  if (hidden < 1) throw PartitionError(team->name + ": hidden must be at least 1", rule_code::kLinearLayout);
  start_ = team->start;
  team_ = team;
  weight = register_parameter("weight", at::randn({team->rows, hidden}, at::TensorOptions().dtype(options.dtype())));
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& ids) {
  using namespace mpi::detail;
  if (!P_.active()) return ids.clone();
  const auto& t = *team_;
  const auto plan = t.tokens(ids, "ids", weight.requires_grad() && at::GradMode::is_enabled());
  const at::Tensor all = t.gather_tokens(ids, *plan, "ids");
  // Ids outside this worker's rows look up an appended zero row.
  const at::Tensor mine = (all >= start_) & (all < start_ + t.rows);
  const at::Tensor local = at::where(mine, all - start_, at::full_like(all, t.rows));
  const at::Tensor table = at::cat({weight, at::zeros({1, hidden_}, weight.options())}, 0);
  const at::Tensor partial = at::embedding(table, local);
  at::Tensor y;
  {
    at::NoGradGuard no_grad;
    y = reduce_scatter_dim(t.team, partial.detach(), 1, plan->lengths, t.name);
  }
  detail::count_model_parallel(detail::bytes(partial) - detail::bytes(y));
  return with_adjoint(y, partial, plan->attach, t.name + " adjoint",
                      [team = t.team, lengths = plan->lengths, what = t.name + " adjoint"](const at::Tensor& g) {
                        detail::count_model_parallel((team.size() - 1) * detail::bytes(g));
                        return allgather_dim(team, g.contiguous(), 1, lengths, what);
                      });
}

VocabParallelCrossEntropyImpl::VocabParallelCrossEntropyImpl(const mpi::Partition& P, int64_t vocab)
    : P_(P), vocab_(vocab) {
  auto team = std::make_shared<detail::VocabTeam>("VocabParallelCrossEntropy", P, vocab);
  start_ = team->start;
  rows_ = team->rows;
  team_ = team;
}

torch::Tensor VocabParallelCrossEntropyImpl::forward(const torch::Tensor& logits, const torch::Tensor& targets) {
  using namespace mpi::detail;
  if (!P_.active()) return targets.clone();
  const auto& t = *team_;
  const auto plan = t.tokens(targets, "targets");
  int64_t tokens = 0, mine_at = 0, mine_len = 0;
  for (size_t i = 0; i < t.members.size(); ++i) {
    if (t.members[i] == mpi::world_rank()) {
      mine_at = tokens;
      mine_len = plan->lengths[i];
    }
    tokens += plan->lengths[i];
  }
  // The logits agreed too, so that no worker raises alone: [batch, tokens,
  // its vocabulary rows], a float dtype, the targets' batch and tokens.
  // (Those two are compared after the lookup: a plan is keyed by the
  // logits' headers alone, and the targets may change while they do not.)
  std::shared_ptr<const detail::VocabTeam::Compiled> lp;
  {
    std::vector<Header> headers;
    lp = t.logit_plans.lookup(P_, make_header(logits), t.name, headers);
    if (!lp) {
      check_inputs(t.name, P_, P_, headers);
      auto c = std::make_shared<detail::VocabTeam::Compiled>();
      const Header& first = header_of(P_, headers, t.members[0]);
      for (size_t i = 0; i < t.members.size(); ++i) {
        const Header& h = header_of(P_, headers, t.members[i]);
        const int64_t s = static_cast<int64_t>(i), T = P_.shape()[1];  // member i sits at index i of axis 1
        const int64_t rows = vocab_ / T + (s < vocab_ % T ? 1 : 0);
        if (h.ndim != 3 || !at::isFloatingType(h.scalar_type()) || h.dims[2] != rows || first.ndim != 3 ||
            h.dims[0] != first.dims[0] || h.dims[1] != first.dims[1])
          throw ShapeError(t.name + ": the logits of world rank " + std::to_string(t.members[i]) + " are " +
                               shape_string(h.shape()) + " of " + c10::toString(h.scalar_type()) + ", world rank " +
                               std::to_string(t.members[0]) + "'s " + shape_string(first.shape()) +
                               "; they must be float [batch, tokens, " + std::to_string(rows) +
                               "] (its vocabulary rows), the same batch and tokens on every worker of the team",
                           rule_code::kTilingDims);
      }
      c->attach = agree_attach(t.name, P_, headers, t.members);
      c->batch = first.dims[0];
      c->tokens = first.dims[1];
      t.logit_plans.insert(headers, c);
      lp = c;
    }
  }
  if (lp->batch != targets.size(0) || lp->tokens != tokens)
    throw ShapeError(t.name + ": the logits are [" + std::to_string(lp->batch) + ", " + std::to_string(lp->tokens) +
                         ", ...] on every worker of the team, the targets [" + std::to_string(targets.size(0)) + ", " +
                         std::to_string(tokens) + "] (batch, the team's tokens); they must agree",
                     rule_code::kTilingDims);
  const at::Tensor all = t.gather_tokens(targets, *plan, "targets");
  // 16-bit logits are taken in float32, as Megatron-LM takes logits.float():
  // the loss is float32 and the gradient is rounded back to the logits'
  // dtype. (MPI_MAX on 16-bit floats, sent as MPI_UINT16_T, would compare
  // bit patterns.)
  const at::ScalarType in_dtype = logits.scalar_type();
  const bool widen = in_dtype == at::kHalf || in_dtype == at::kBFloat16;
  const at::Tensor x = widen ? logits.detach().to(at::kFloat) : logits.detach();
  at::Tensor m, S, z;
  {
    at::NoGradGuard no_grad;
    // The maximum over the whole vocabulary, for stability.
    m = allreduce(group_of(t.team), x.amax(-1).contiguous(), MPI_MAX, t.name + " (maximum)");
    detail::count_model_parallel((t.team.size() - 1) * detail::bytes(m));
    at::Tensor local_sum = (x - m.unsqueeze(-1)).exp().sum(-1);
    const at::Tensor in_mine = (all >= start_) & (all < start_ + rows_);
    const at::Tensor idx = at::where(in_mine, all - start_, at::zeros_like(all));
    at::Tensor local_z = rows_ ? x.gather(-1, idx.unsqueeze(-1)).squeeze(-1) * in_mine.to(x.scalar_type())
                               : at::zeros(all.sizes(), x.options());
    // The sum of exponentials and the target's logit in one call.
    const at::Tensor both =
        allreduce_team(t.team, at::stack({local_sum, local_z}).contiguous(), t.name + " (sum of exponentials)");
    detail::count_model_parallel((t.team.size() - 1) * detail::bytes(both));
    S = both[0];
    z = both[1];
  }
  // The loss of every token of the team, then this worker's tokens.
  const at::Tensor loss = (S.log() + m - z).narrow(1, mine_at, mine_len).contiguous();
  const int64_t start = start_, rows = rows_;
  return with_adjoint(loss, logits, lp->attach, t.name + " adjoint",
                      [team = t.team, lengths = plan->lengths, what = t.name + " adjoint", x, m, S, all, start,
                       rows, in_dtype](const at::Tensor& g) {
                        // Every token's loss gradient, from the worker that holds it.
                        detail::count_model_parallel((team.size() - 1) * detail::bytes(g));
                        const at::Tensor gall = allgather_dim(team, g.contiguous(), 1, lengths, what);
                        at::Tensor grad = (x - m.unsqueeze(-1)).exp() / S.unsqueeze(-1);
                        const at::Tensor in_mine = (all >= start) & (all < start + rows);
                        if (rows) {
                          const at::Tensor idx = at::where(in_mine, all - start, at::zeros_like(all));
                          grad.scatter_add_(-1, idx.unsqueeze(-1), -in_mine.to(grad.scalar_type()).unsqueeze(-1));
                        }
                        return (grad * gall.unsqueeze(-1)).to(in_dtype);
                      });
}

}  // namespace partita::nn
