// Pieces laid on a grid: the shape arithmetic of inputs that tile a global
// tensor unevenly (repartition's inputs, the halo exchange's bulks). Shared
// vocabulary of the reference and the MPI implementation; which data moves
// where is computed separately by each side.
#pragma once

#include <string>
#include <vector>

#include "partita/shape.hpp"

namespace partita {

// `s` with leading ones up to `dim` dimensions (a partition of fewer
// dimensions than its tensor).
Shape padded_shape(const Shape& s, size_t dim);

struct Tiling {
  Shape grid;                                 // slabs per dimension
  std::vector<std::vector<int64_t>> extent;   // [dim][slab]
  std::vector<std::vector<int64_t>> offset;   // [dim][slab]: start in the global tensor
  Shape global;                               // the tiled tensor's shape

  // The box of the piece at grid index `i`.
  Shape start(const Index& i) const;
  Shape length(const Index& i) const;
};

// The tiling made by `pieces`: pieces[r] is the shape of the piece at grid
// position unravel(r, grid) and `workers[r]` names its holder in messages.
// Throws ShapeError (prefixed with `what`) unless every piece has
// grid.size() dimensions and the pieces of one slab agree on its extent.
Tiling tile(const std::string& what, const Shape& grid, const std::vector<Shape>& pieces,
            const Ranks& workers);

// The halo exchange's bulks: each window (a worker's tensor, ghosts
// included) minus `left` and `right` ghost widths per dimension, tiled on
// the grid. Throws ShapeError (prefixed with `what`) unless the widths have
// one entry per dimension, every window holds its ghosts, the bulks tile a
// tensor, and every ghost that has a neighbour is no wider than the
// neighbour's bulk that fills it.
Tiling halo_tiling(const std::string& what, const Shape& grid, const std::vector<Shape>& windows,
                   const Ranks& workers, const Shape& left, const Shape& right);

// A box of a tensor: per dimension, start and length.
struct Box {
  Shape start, len;
  bool empty() const;  // some length <= 0
  int64_t size() const { return volume(len); }
};
Box intersect(const Box& a, const Box& b);
Box relative(const Box& b, const Box& origin);  // b in origin's coordinates
std::string box_string(const Box& b);           // "[0:2, 1:3]" (half-open ranges)

// What one worker of a repartition sends and receives (seed 000's
// (slice, size, partner) lists): slices of its input (sends) and of its
// output (recvs), partners as world ranks (the worker itself for what stays
// local), in the partner's partition-rank order.
struct Transfer {
  Box slice;
  int partner;
};
struct RepartitionPlan {
  Shape in_shape, out_shape;  // empty when the worker is not in P_x / P_y
  std::vector<Transfer> sends, recvs;
};

// The plan of world rank `me` for moving the tensor tiled by `x` (grid
// positions held by x_workers in row-major order) to the balanced
// decomposition over the grid `y_grid` (same number of dimensions) held by
// y_workers.
RepartitionPlan plan_repartition(const Tiling& x, const Ranks& x_workers, const Shape& y_grid,
                                 const Ranks& y_workers, int me);

}  // namespace partita
