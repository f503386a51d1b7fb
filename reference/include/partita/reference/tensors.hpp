// The reference's tensor primitives work on one tensor per world rank:
// `x[w]` is what worker w passes (zero-volume where it holds nothing), and
// the result holds what each worker returns. Plain torch operations (clone,
// add), so the adjoint of each comes from autograd.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "partita/reference/partition.hpp"

namespace partita::reference {

using Tensors = std::vector<at::Tensor>;

// Throws ShapeError unless: x has one tensor per world rank; workers outside
// P_x pass zero-volume tensors; P_x's tensors share one supported dtype and
// have at most kMaxTensorDims dimensions.
void check_inputs(const std::string& what, const Partition& P_x, const Tensors& x);

// The skeleton of the primitives that work within teams of P_x (all-sum-
// reduce, all-gather, reduce-scatter): after check_inputs, every worker
// outside P_x ends with a clone of its input and every worker w of P_x with
// `member(team, w)`, `team` being its team of workers that differ only
// along `axes`.
Tensors over_teams(const std::string& what, const Partition& P_x, const std::vector<int>& axes,
                   const Tensors& x,
                   const std::function<at::Tensor(const Partition& team, int w)>& member);

// The skeleton of broadcast and sum-reduce: every P_y worker w ends with
// `receiver(w)`, a worker only in P_x with a zero-volume tensor ({batch, 0}
// with preserve_batch), any other with a clone of its input.
Tensors over_receivers(const Partition& P_x, const Partition& P_y, const Tensors& x,
                       bool preserve_batch, const std::function<at::Tensor(int w)>& receiver);

}  // namespace partita::reference
