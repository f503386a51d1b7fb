// The MPI communicators behind partita::smp's groups, for code built on smp
// (the pipeline). Valid until the next smp::init.
#pragma once

#include <mpi.h>

#include "partita/smp/layout.hpp"

namespace partita::smp {

// WORLD: smp's own duplicate of MPI_COMM_WORLD (its ranks are world ranks);
// MP_GROUP / DP_GROUP / TP_GROUP / PP_GROUP: this rank's group, ranks in
// group-rank order.
// Throws UsageError before init.
MPI_Comm communicator(CommGroup group);

// The pipeline's step number (docs/pipeline.md): one more at every call,
// the same sequence on every rank. smp::init agrees on where it continues
// (the largest any rank reached), so that a step never reuses an earlier
// step's number, even on a communicator MPI built from a freed one's.
long next_step_number();

}  // namespace partita::smp

namespace partita::smp {

// The tag of every object message (send, broadcast) on
// communicator(CommGroup::WORLD).
inline constexpr int kObjectTag = 4004;

}  // namespace partita::smp
