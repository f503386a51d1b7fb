// The broadcast and reduction rules of seed 001 (and their mirror for
// broadcast, docs/design.md, "Broadcast and reduction rules"), as shape arithmetic only: the MPI implementation's
// statement of them. The reference restates them on its own
// (reference/src/partition.cpp), so that a mistake here is caught.
#pragma once

#include "partita/shape.hpp"

namespace partita {

// Shapes of P_x and P_y as the broadcast sees them: each reversed if its
// transpose flag is set, then P_x padded on the left with ones to the
// dimension of P_y. Throws PartitionError (naming both shapes and the
// dimension that fails) unless, along every dimension, P_x is 1 or equals
// P_y, and dim(P_x) <= dim(P_y).
struct EffectiveShapes {
  Shape src;  // effective shape of the partition that holds the data
  Shape dst;  // effective shape of the partition that receives it
};
EffectiveShapes broadcast_shapes(const Shape& px, const Shape& py,
                                 bool transpose_src, bool transpose_dest);

// The reduction rules: P_x reduces to P_y when, after the transposes and
// padding P_y on the left, along every dimension P_y is 1 or equals P_x, and
// dim(P_x) >= dim(P_y). Returned with src = effective P_x, dst = effective P_y.
EffectiveShapes reduction_shapes(const Shape& px, const Shape& py,
                                 bool transpose_src, bool transpose_dest);

// Which workers of a broadcast or reduction pair up (DistDL's rule,
// docs/partitions.md): the dimensions where the two effective shapes agree
// are the matched ones; a worker's key is its effective index over the
// matched dimensions, raveled in C order, or in Fortran order when its
// partition is transposed (which is C order over its own, unreversed
// coordinates). Workers with equal keys pair. `index` is the worker's index
// in its own partition, `own` and `other` the two effective shapes.
int64_t pairing_key(const Index& index, bool transposed, const Shape& own, const Shape& other);

}  // namespace partita
