// partita::nn::SeededDropout: dropout whose mask is a function of the
// element's place in the *global* tensor (docs/transformer.md, "Seeded
// dropout"), so that each worker's mask is exactly the slice of the mask
// one process draws for the whole tensor, and a tensor replicated over
// workers gets the same mask on every one.
//
// The n-th training call of the layer (counting from 0, or from the last
// reseed) keeps element i of the global tensor (row-major index) when
//   u = splitmix64(splitmix64(splitmix64(seed) ^ n) ^ i) >> 11, as a
//   fraction of 2^53, is at least p,
// and scales the kept elements by 1 / (1 - p). The global tensor is the
// pieces of P's workers put together along each of P's axes (x has as many
// dimensions as P; the lengths are agreed per call, uneven and empty pieces
// allowed). In eval mode, or with p = 0, x is returned as it is.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "partita/arg.hpp"
#include "partita/mpi/partition.hpp"

namespace partita::nn {

// Set in LibTorch's style: DropoutOptions().p(0.1).seed(7).
struct DropoutOptions {
  PARTITA_ARG(double, p) = 0.1;
  PARTITA_ARG(uint64_t, seed) = 0;
  // Axes of P along which the workers hold the same tensor (a region
  // replicated over tp): there every worker is at offset 0 and draws the
  // same mask.
  PARTITA_ARG(std::vector<int>, replicated_axes);
};

namespace detail {
struct DropoutPlan;
}

class SeededDropoutImpl : public torch::nn::Module {
 public:
  SeededDropoutImpl(const mpi::Partition& P, const DropoutOptions& options = DropoutOptions());
  torch::Tensor forward(const torch::Tensor& x);
  // Starts the count of calls again (and changes the seed).
  void reseed(uint64_t seed);
  uint64_t calls() const { return calls_; }
  uint64_t seed() const { return options_.seed(); }
  // Sets the count of calls made (a resumed run: the count a checkpoint
  // saved), so the next call draws the mask it would have drawn.
  void set_calls(uint64_t calls) { calls_ = calls; }
  const mpi::Partition& partition() const { return P_; }

 private:
  mpi::Partition P_;
  DropoutOptions options_;
  uint64_t calls_ = 0;
  std::shared_ptr<const detail::DropoutPlan> plan_;
};
TORCH_MODULE(SeededDropout);

}  // namespace partita::nn
