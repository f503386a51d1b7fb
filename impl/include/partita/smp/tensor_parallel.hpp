// The partitions a pipeline stage's tensor-parallel layers run on, in smp's
// 3-D layout (docs/3d.md): partita's distributed Linear layers (seed 002)
// over the stage's tp group, with the stage's data-parallel replicas as
// their data-parallel axis 0.
//
//   smp::init(config);                                  // partitions x tensor_parallel_degree
//   auto P = smp::stage_partitions(stage);              // every rank, every stage, same order
//   nn::DistributedLinearAllGather up(P.tokens, P.features, H, F);
//   nn::DistributedLinearReduceScatter down(P.features, P.tokens, F, H);
//
// An activation [batch, ..., tokens, features] of the stage is split over
// the partitions' workers: batch over dp (axis 0), and over tp either its
// tokens (`tokens`: D x 1 x ... x tp x 1, what crosses a stage boundary in
// Megatron's sequence-parallel blocks) or its features (`features`: D x 1 x
// ... x 1 x tp, between the all-gather and the reduce-scatter layer).
// Worker (d, ..., t) of either is the world rank with dp_rank d, pp_rank
// `stage` and tp_rank t.
#pragma once

#include "partita/mpi/partition.hpp"

namespace partita::smp {

struct StagePartitions {
  mpi::Partition features;  // D x 1 x ... x 1 x T
  mpi::Partition tokens;    // D x 1 x ... x T x 1
};

// Collective over the world (as every rank builds every distributed layer):
// every rank calls it with the same arguments, in the same order, after
// smp::init. `dims`: the activations' dimensions (>= 3: batch, tokens,
// features). UsageError on every rank for a stage outside [0, pp_size) or
// dims < 3.
StagePartitions stage_partitions(int stage, int dims = 3);

// The world ranks of stage `stage`, in the partitions' worker order
// (dp-major, then tp): pure, from smp::layout().
std::vector<int> stage_workers(int stage);

}  // namespace partita::smp
