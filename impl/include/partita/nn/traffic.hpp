// The bytes partita's distributed layers sent from this process,
// by kind, since it started (docs/3d.md, "Communication volume"). Counted
// where a layer calls a collective, in its forward and when autograd runs
// that collective's adjoint, by the definition docs/3d.md states for each
// collective (what this rank would send if every rank sent its own data
// straight to every rank that lacks it), not by watching MPI. The shape and
// error agreements the layers run beside their data are not counted.
// smp::DistributedModel reports a step's share (PipelineStats).
#pragma once

#include <cstdint>

namespace partita::nn {

struct LayerTraffic {
  // Activations and their gradients along the layers' model-parallel axis:
  // the all-gather layers' all-gather of x (adjoint: a reduce-scatter), the
  // reduce-scatter layers' reduce-scatter of y (adjoint: an all-gather);
  // the transformer layers' exchanges over their tp team: the vocabulary-
  // parallel embedding's all-gather of the ids and reduce-scatter of its
  // output (adjoint: an all-gather), the cross-entropy's all-gather of the
  // targets, all-reduces of the maximum and of the sums of exponentials and
  // target logits (adjoint: an all-gather of the loss gradient), and the
  // sequence-parallel LayerNorm's all-reduce of its parameters' gradients.
  int64_t model_parallel = 0;
  // Parameters along the data-parallel axis: W and b broadcast from their
  // stored copy (adjoint: the sum-reduce of their gradients onto it), or,
  // in the ZeRO-3 forms, the all-gather of the shards (adjoint: the
  // reduce-scatter of the gradients back to them).
  int64_t data_parallel = 0;
};

LayerTraffic layer_traffic();

namespace detail {
// Adds `bytes` to the model-parallel count (the layers outside linear.cpp
// count their exchanges with it, by the same definitions).
void count_model_parallel(int64_t bytes);
}  // namespace detail

}  // namespace partita::nn
