// Internal to the reference: where each piece of a tensor tiled over a grid
// sits in the global tensor. Restated here the plain way, on purpose: the MPI
// implementation's statement is common/src/tiling.cpp, and the reference
// must not share its mistakes (issue 9, docs/testing.md).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "partita/shape.hpp"

namespace partita::reference {

// The balanced decomposition (docs/design.md), counted out: worker i of p holds
// n/p elements of a length n, one more for each of the first n%p workers.
// Returns {start, length}.
std::pair<int64_t, int64_t> balanced_piece(int64_t n, int64_t p, int64_t i);

// `s` with ones in front up to `dims` dimensions.
Shape ones_in_front(const Shape& s, size_t dims);

struct Layout {
  Shape global;              // the tiled tensor's shape
  std::vector<Shape> start;  // per piece: where it starts in the global tensor
};

// pieces[r] is the piece at grid position r (row-major), held by workers[r].
// Throws ShapeError unless every piece has grid.size() dimensions and pieces
// in the same slab of a dimension have the same extent in it.
Layout lay_out(const std::string& what, const Shape& grid, const std::vector<Shape>& pieces,
               const Ranks& workers);

// The halo exchange's bulks: windows minus the ghost widths. Throws
// ShapeError unless the widths have one entry per dimension, every window
// holds its ghosts, the bulks tile a tensor, and every ghost with a
// neighbour is no wider than the neighbour's bulk that fills it.
Layout lay_out_bulks(const std::string& what, const Shape& grid, const std::vector<Shape>& windows,
                     const Ranks& workers, const Shape& left, const Shape& right,
                     std::vector<Shape>* bulks);

}  // namespace partita::reference
