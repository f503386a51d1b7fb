// The broadcast and reduction rules of seed 001 (and their mirror for
// broadcast, DESIGN.md), as shape arithmetic only. Both the reference and
// the MPI implementation validate their partitions with this one function,
// so the rules are stated once; which workers end up together is computed
// separately by each side.
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

// The index a worker has in the effective (transposed, padded) view of its
// partition: reversed if transposed, then padded with leading zeros.
Index effective_index(const Index& index, bool transposed, size_t dim);

}  // namespace partita
