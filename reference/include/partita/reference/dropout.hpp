// Seeded dropout's serial twin: the mask of the whole tensor, drawn
// element by element from its global row-major index (the rule of
// partita/nn/dropout.hpp, restated), and each worker's slice of it.
#pragma once

#include <cstdint>
#include <vector>

#include "partita/reference/tensors.hpp"

namespace partita::reference {

// The `call`-th mask (counting from 0) of a layer seeded with `seed`, for
// every worker of P: x put together along P's axes (along the
// `replicated_axes` every worker holds the whole), the global mask applied
// and scaled by 1 / (1 - p), each worker's slice; a clone elsewhere.
Tensors seeded_dropout(const Partition& P, double p, uint64_t seed, uint64_t call,
                       const std::vector<int>& replicated_axes, const Tensors& x);

}  // namespace partita::reference
