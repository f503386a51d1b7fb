#include "partita/tiling.hpp"

#include <algorithm>

#include "partita/errors.hpp"

namespace partita {

Shape padded_shape(const Shape& s, size_t dim) {
  Shape out(dim > s.size() ? dim - s.size() : 0, 1);
  out.insert(out.end(), s.begin(), s.end());
  return out;
}

Shape Tiling::start(const Index& i) const {
  Shape s(grid.size());
  for (size_t k = 0; k < grid.size(); ++k) s[k] = offset[k][i[k]];
  return s;
}

Shape Tiling::length(const Index& i) const {
  Shape s(grid.size());
  for (size_t k = 0; k < grid.size(); ++k) s[k] = extent[k][i[k]];
  return s;
}

Tiling tile(const std::string& what, const Shape& grid, const std::vector<Shape>& pieces,
            const Ranks& workers) {
  const size_t d = grid.size();
  Tiling t;
  t.grid = grid;
  t.extent.resize(d);
  t.offset.resize(d);
  for (size_t k = 0; k < d; ++k) t.extent[k].assign(grid[k], -1);
  // Every piece's dimension count before any extent, so that a case
  // breaking both rules names tiling.dims here as in the reference.
  for (size_t r = 0; r < pieces.size(); ++r)
    if (pieces[r].size() != d)
      throw ShapeError(what + ": worker " + std::to_string(workers[r]) + " passed " +
                       std::to_string(pieces[r].size()) + " dimensions where " +
                       std::to_string(d) + " are expected", rule_code::kTilingDims);
  for (size_t r = 0; r < pieces.size(); ++r) {
    const Shape& p = pieces[r];
    const Index ix = unravel(static_cast<int64_t>(r), grid);
    for (size_t k = 0; k < d; ++k) {
      int64_t& e = t.extent[k][ix[k]];
      if (e >= 0 && e != p[k])
        throw ShapeError(what + ": the inputs do not tile a tensor: worker " +
                         std::to_string(workers[r]) + " has extent " + std::to_string(p[k]) +
                         " in dimension " + std::to_string(k) + " where others of its slab have " +
                         std::to_string(e), rule_code::kTilingUneven);
      e = p[k];
    }
  }
  t.global.assign(d, 0);
  for (size_t k = 0; k < d; ++k)
    for (auto e : t.extent[k]) {
      t.offset[k].push_back(t.global[k]);
      t.global[k] += e;
    }
  return t;
}

Tiling halo_tiling(const std::string& what, const Shape& grid, const std::vector<Shape>& windows,
                   const Ranks& workers, const Shape& left, const Shape& right) {
  const size_t d = grid.size();
  if (left.size() != d || right.size() != d)
    throw ShapeError(what + ": ghost widths [" + list_string(left) + "] and [" +
                     list_string(right) + "] for a tensor of " + std::to_string(d) + " dimensions",
                     rule_code::kHaloWidthCount);
  std::vector<Shape> bulks;
  for (size_t r = 0; r < windows.size(); ++r) {
    Shape b = windows[r];
    for (size_t k = 0; k < b.size() && k < d; ++k) {
      b[k] -= left[k] + right[k];
      if (b[k] < 0)
        throw ShapeError(what + ": worker " + std::to_string(workers[r]) + " passed extent " +
                         std::to_string(windows[r][k]) + " in dimension " + std::to_string(k) +
                         ", too small for ghosts of widths " + std::to_string(left[k]) + " and " +
                         std::to_string(right[k]), rule_code::kHaloWindowSmall);
    }
    bulks.push_back(b);
  }
  Tiling t = tile(what, grid, bulks, workers);
  for (size_t k = 0; k < d; ++k)
    for (int64_t j = 0; j < grid[k]; ++j) {
      // Slab j's left ghost comes from slab j-1, its right ghost from j+1.
      const int64_t e = t.extent[k][j];
      if (j > 0 && e < right[k])
        throw ShapeError(what + ": ghosts of width " + std::to_string(right[k]) +
                         " in dimension " + std::to_string(k) + " are wider than slab " +
                         std::to_string(j) + "'s bulk of " + std::to_string(e) +
                         " that fills its left neighbour's right ghost", rule_code::kHaloGhostWider);
      if (j + 1 < grid[k] && e < left[k])
        throw ShapeError(what + ": ghosts of width " + std::to_string(left[k]) +
                         " in dimension " + std::to_string(k) + " are wider than slab " +
                         std::to_string(j) + "'s bulk of " + std::to_string(e) +
                         " that fills its right neighbour's left ghost", rule_code::kHaloGhostWider);
    }
  return t;
}

bool Box::empty() const {
  for (auto l : len)
    if (l <= 0) return true;
  return false;
}

Box intersect(const Box& a, const Box& b) {
  Box c{Shape(a.start.size()), Shape(a.start.size())};
  for (size_t k = 0; k < a.start.size(); ++k) {
    c.start[k] = std::max(a.start[k], b.start[k]);
    c.len[k] = std::min(a.start[k] + a.len[k], b.start[k] + b.len[k]) - c.start[k];
  }
  return c;
}

Box relative(const Box& b, const Box& origin) {
  Box r = b;
  for (size_t k = 0; k < b.start.size(); ++k) r.start[k] -= origin.start[k];
  return r;
}

std::string box_string(const Box& b) {
  std::string s = "[";
  for (size_t k = 0; k < b.start.size(); ++k)
    s += (k ? ", " : "") + std::to_string(b.start[k]) + ":" + std::to_string(b.start[k] + b.len[k]);
  return s + "]";
}

RepartitionPlan plan_repartition(const Tiling& x, const Ranks& x_workers, const Shape& y_grid,
                                 const Ranks& y_workers, int me) {
  const size_t d = x.grid.size();
  auto x_box = [&](size_t r) {
    const Index ix = unravel(static_cast<int64_t>(r), x.grid);
    return Box{x.start(ix), x.length(ix)};
  };
  auto y_box = [&](size_t r) {
    const Index iy = unravel(static_cast<int64_t>(r), y_grid);
    Box b{Shape(d), Shape(d)};
    for (size_t k = 0; k < d; ++k) {
      b.start[k] = local_start(x.global[k], y_grid[k], iy[k]);
      b.len[k] = local_length(x.global[k], y_grid[k], iy[k]);
    }
    return b;
  };
  RepartitionPlan p;
  const auto xi = std::find(x_workers.begin(), x_workers.end(), me);
  if (xi != x_workers.end()) {
    const Box mine = x_box(xi - x_workers.begin());
    p.in_shape = mine.len;
    for (size_t j = 0; j < y_workers.size(); ++j) {
      const Box c = intersect(mine, y_box(j));
      if (!c.empty()) p.sends.push_back({relative(c, mine), y_workers[j]});
    }
  }
  const auto yi = std::find(y_workers.begin(), y_workers.end(), me);
  if (yi != y_workers.end()) {
    const Box mine = y_box(yi - y_workers.begin());
    p.out_shape = mine.len;
    for (size_t i = 0; i < x_workers.size(); ++i) {
      const Box c = intersect(mine, x_box(i));
      if (!c.empty()) p.recvs.push_back({relative(c, mine), x_workers[i]});
    }
  }
  return p;
}

}  // namespace partita
