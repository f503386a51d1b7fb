// A distributed layer partita does not ship, written as a user would: a
// LayerNorm whose feature dimension is split over the world's ranks (rank r
// holds features [start_r, start_r + n_r) of every row, split as partita
// splits tensors) and whose parameters gamma and beta are split the same way
// (rank r trains its slice of each). The mean and the variance of each row
// are sums over every rank's features, taken by partita's AllSumReduce; the
// backward is written by hand and takes its two row sums the same way.
//
// Forward, per row, with n features in all:
//   mean = sum(x) / n,  var = sum((x - mean)^2) / n,  xhat = (x - mean) / sqrt(var + eps)
//   y = xhat * gamma + beta          (gamma, beta: this rank's slice)
// Backward, with g = dy * gamma:
//   dx = (g - sum(g) / n - xhat * sum(g * xhat) / n) / sqrt(var + eps)
//   dgamma = sum over rows of dy * xhat,  dbeta = sum over rows of dy
//   (this rank's slice: every row is whole on every rank, so no sum over ranks)
//
// `Plant` switches on one of three bugs planted by hand for the example's
// documentation (docs/testing-library.md): the suite must catch each.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "partita/nn/all_sum_reduce.hpp"

namespace example {

enum class Plant {
  none,
  missing_term,     // the backward forgets "- xhat * sum(g * xhat) / n"
  neighbour_slice,  // rank 1 reads the next rank's slice of gamma
  gamma_grad,       // gamma's gradient forgets the factor xhat
};

// Rank r's share of n features over p ranks, and where it starts.
inline int64_t share(int64_t n, int p, int r) { return n / p + (r < n % p ? 1 : 0); }
inline int64_t start(int64_t n, int p, int r) { return r * (n / p) + std::min<int64_t>(r, n % p); }

class DistributedLayerNorm {
 public:
  // P: a 1-D partition of the ranks that hold features (collective over
  // them: the AllSumReduce makes its communicator); gamma and beta: every
  // feature's, the same on every rank. The layer keeps its slice of each as
  // a parameter of its own (a leaf that requires grad).
  DistributedLayerNorm(const partita::mpi::Partition& P, torch::Tensor gamma, torch::Tensor beta,
                       Plant plant = Plant::none, double eps = 1e-5)
      : reduce_(P, std::vector<int>{0}), plant_(plant), eps_(eps) {
    const int rank = static_cast<int>(P.index().at(0)), ranks = static_cast<int>(P.shape().at(0));
    const int64_t n = gamma.size(0);
    int from = rank;
    if (plant == Plant::neighbour_slice && rank == 1) from = (rank + 1) % ranks;
    const int64_t s = start(n, ranks, from), len = std::min(share(n, ranks, rank), n - s);
    gamma_ = gamma.narrow(0, s, len).clone().requires_grad_(true);
    beta_ = beta.narrow(0, start(n, ranks, rank), share(n, ranks, rank)).clone().requires_grad_(true);
    features_ = n;
    start_ = start(n, ranks, rank);
  }

  torch::Tensor forward(const torch::Tensor& x) { return Fn::apply(x, gamma_, beta_, this); }

  // This rank's slices of gamma and beta, and where they start among the
  // n features.
  const torch::Tensor& gamma() const { return gamma_; }
  const torch::Tensor& beta() const { return beta_; }
  int64_t first_feature() const { return start_; }

 private:
  struct Fn : torch::autograd::Function<Fn> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                 const torch::Tensor& gamma, const torch::Tensor& beta, DistributedLayerNorm* self) {
      const double n = static_cast<double>(self->features_);
      const auto mean = self->sum_rows(x) / n;
      const auto xc = x - mean;
      const auto rstd = (self->sum_rows(xc * xc) / n + self->eps_).rsqrt();
      const auto xhat = xc * rstd;
      ctx->save_for_backward({xhat, rstd, gamma});
      ctx->saved_data["self"] = reinterpret_cast<int64_t>(self);
      return xhat * gamma.to(x.dtype()) + beta.to(x.dtype());
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list dy) {
      auto* self = reinterpret_cast<DistributedLayerNorm*>(ctx->saved_data["self"].toInt());
      const auto saved = ctx->get_saved_variables();
      const auto &xhat = saved[0], &rstd = saved[1], &gamma = saved[2];
      const double n = static_cast<double>(self->features_);
      const auto g = dy[0] * gamma.to(dy[0].dtype());
      auto dx = g - self->sum_rows(g) / n;
      const auto term = xhat * (self->sum_rows(g * xhat) / n);  // always summed: collective
      if (self->plant_ != Plant::missing_term) dx = dx - term;
      const auto dgamma = self->plant_ == Plant::gamma_grad ? dy[0].sum(0) : (dy[0] * xhat).sum(0);
      return {dx * rstd, dgamma.to(gamma.dtype()), dy[0].sum(0).to(gamma.dtype()), torch::Tensor()};
    }
  };

  // Each row's sum over every rank's features.
  torch::Tensor sum_rows(const torch::Tensor& t) { return reduce_(t.sum(1, /*keepdim=*/true)); }

  partita::nn::AllSumReduce reduce_;
  torch::Tensor gamma_, beta_;
  int64_t features_ = 0, start_ = 0;
  Plant plant_;
  double eps_;
};

}  // namespace example
