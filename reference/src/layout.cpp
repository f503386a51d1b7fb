#include "layout.hpp"

#include "partita/errors.hpp"

namespace partita::reference {

namespace {

// The grid position of the piece numbered r, counting row-major.
Index position(int64_t r, const Shape& grid) {
  Index ix(grid.size(), 0);
  for (int64_t i = 0; i < r; ++i)
    for (size_t k = grid.size(); k-- > 0;) {
      if (++ix[k] < grid[k]) break;
      ix[k] = 0;
    }
  return ix;
}

}  // namespace

std::pair<int64_t, int64_t> balanced_piece(int64_t n, int64_t p, int64_t i) {
  auto length = [&](int64_t j) { return n / p + (j < n % p ? 1 : 0); };
  int64_t start = 0;
  for (int64_t j = 0; j < i; ++j) start += length(j);
  return {start, length(i)};
}

Shape ones_in_front(const Shape& s, size_t dims) {
  Shape out = s;
  while (out.size() < dims) out.insert(out.begin(), 1);
  return out;
}

Layout lay_out(const std::string& what, const Shape& grid, const std::vector<Shape>& pieces,
               const Ranks& workers) {
  const size_t d = grid.size();
  std::vector<Index> pos;
  for (size_t r = 0; r < pieces.size(); ++r) {
    if (pieces[r].size() != d)
      throw ShapeError(what + ": worker " + std::to_string(workers[r]) + " passed " +
                       std::to_string(pieces[r].size()) + " dimensions where " +
                       std::to_string(d) + " are expected", rule_code::kTilingDims);
    pos.push_back(position(static_cast<int64_t>(r), grid));
  }
  // Every pair of pieces in one slab of dimension k agrees on its extent.
  for (size_t a = 0; a < pieces.size(); ++a)
    for (size_t b = 0; b < a; ++b)
      for (size_t k = 0; k < d; ++k)
        if (pos[a][k] == pos[b][k] && pieces[a][k] != pieces[b][k])
          throw ShapeError(what + ": the inputs do not tile a tensor: worker " +
                           std::to_string(workers[a]) + " has extent " +
                           std::to_string(pieces[a][k]) + " in dimension " + std::to_string(k) +
                           " where others of its slab have " + std::to_string(pieces[b][k]),
                           rule_code::kTilingUneven);
  // A piece starts after the slabs before it: add up one piece of each.
  Layout l;
  l.global.assign(d, 0);
  l.start.assign(pieces.size(), Shape(d, 0));
  for (size_t k = 0; k < d; ++k)
    for (int64_t slab = 0; slab < grid[k]; ++slab) {
      int64_t extent = 0;
      for (size_t r = 0; r < pieces.size(); ++r)
        if (pos[r][k] == slab) extent = pieces[r][k];
      l.global[k] += extent;
      for (size_t r = 0; r < pieces.size(); ++r)
        if (pos[r][k] > slab) l.start[r][k] += extent;
    }
  return l;
}

Layout lay_out_bulks(const std::string& what, const Shape& grid, const std::vector<Shape>& windows,
                     const Ranks& workers, const Shape& left, const Shape& right,
                     std::vector<Shape>* bulks) {
  const size_t d = grid.size();
  if (left.size() != d || right.size() != d)
    throw ShapeError(what + ": ghost widths [" + list_string(left) + "] and [" +
                     list_string(right) + "] for a tensor of " + std::to_string(d) + " dimensions",
                     rule_code::kHaloWidthCount);
  bulks->clear();
  for (size_t r = 0; r < windows.size(); ++r) {
    Shape b = windows[r];
    for (size_t k = 0; k < b.size() && k < d; ++k) {
      b[k] -= left[k] + right[k];
      if (b[k] < 0)
        throw ShapeError(what + ": worker " + std::to_string(workers[r]) + " passed extent " +
                         std::to_string(windows[r][k]) + " in dimension " + std::to_string(k) +
                         ", too small for ghosts of widths " + std::to_string(left[k]) +
                         " and " + std::to_string(right[k]), rule_code::kHaloWindowSmall);
    }
    bulks->push_back(b);
  }
  const Layout l = lay_out(what, grid, *bulks, workers);
  // A worker with a neighbour below along k gets its left ghost from that
  // neighbour's bulk, one with a neighbour above its right ghost: each such
  // bulk must be at least as wide as the ghost it fills.
  for (size_t r = 0; r < bulks->size(); ++r) {
    const Index ix = position(static_cast<int64_t>(r), grid);
    for (size_t k = 0; k < d; ++k) {
      const int64_t e = (*bulks)[r][k];
      if (ix[k] > 0 && e < right[k])
        throw ShapeError(what + ": ghosts of width " + std::to_string(right[k]) +
                         " in dimension " + std::to_string(k) + " are wider than slab " +
                         std::to_string(ix[k]) + "'s bulk of " + std::to_string(e) +
                         " that fills its left neighbour's right ghost", rule_code::kHaloGhostWider);
      if (ix[k] + 1 < grid[k] && e < left[k])
        throw ShapeError(what + ": ghosts of width " + std::to_string(left[k]) +
                         " in dimension " + std::to_string(k) + " are wider than slab " +
                         std::to_string(ix[k]) + "'s bulk of " + std::to_string(e) +
                         " that fills its right neighbour's left ghost", rule_code::kHaloGhostWider);
    }
  }
  return l;
}

}  // namespace partita::reference
