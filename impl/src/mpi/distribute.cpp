// partita::distribute and partita::gather (distribute.hpp).
#include "partita/distribute.hpp"

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "partita/errors.hpp"
#include "partita/tiling.hpp"

namespace partita {

namespace {

Shape sizes_of(const at::Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end()); }

// P's grid read with leading ones up to `dims` dimensions.
Shape grid_for(const mpi::Partition& P, int64_t dims, const char* what) {
  const Shape& s = P.shape();
  if (static_cast<int64_t>(s.size()) > dims)
    throw ShapeError(std::string(what) + ": the partition " + shape_string(s) + " has more dimensions than the " +
                         std::to_string(dims) + "-dimensional tensor",
                     rule_code::kTilingDims);
  return padded_shape(s, static_cast<size_t>(dims));
}

}  // namespace

at::Tensor distribute(const at::Tensor& global, const mpi::Partition& P) {
  if (!global.defined()) throw ShapeError("distribute: an undefined global tensor");
  if (P.is_null() || !P.active()) return at::empty({0}, global.options().requires_grad(false));
  const Shape grid = grid_for(P, global.dim(), "distribute");
  const Index at_ = unravel(P.rank(), grid);  // row-major over the padded grid: P's own index
  at::Tensor piece = global.detach();
  for (int64_t d = 0; d < global.dim(); ++d) {
    const int64_t n = global.size(d), p = grid[d], i = at_[d];
    piece = piece.narrow(d, local_start(n, p, i), local_length(n, p, i));
  }
  return piece.clone(at::MemoryFormat::Contiguous);
}

at::Tensor gather(const at::Tensor& local, const mpi::Partition& P) {
  if (P.is_null() || !P.active()) return at::Tensor();
  // Every worker learns every piece; the checks below see the same pieces
  // on every worker and so raise the same error on all of them.
  const std::vector<at::Tensor> pieces = P.allgather_data(local);
  std::vector<Shape> shapes;
  for (size_t r = 0; r < pieces.size(); ++r) {
    if (!pieces[r].defined())
      throw ShapeError("gather: worker " + std::to_string(P.workers()[r]) + " passed an undefined tensor");
    if (pieces[r].scalar_type() != pieces[0].scalar_type())
      throw ShapeError("gather: worker " + std::to_string(P.workers()[r]) + " passed " +
                           std::string(c10::toString(pieces[r].scalar_type())) + ", worker " +
                           std::to_string(P.workers()[0]) + " " + c10::toString(pieces[0].scalar_type()),
                       rule_code::kDtypeMismatch);
    shapes.push_back(sizes_of(pieces[r]));
  }
  const Shape grid = grid_for(P, pieces[0].dim(), "gather");
  const Tiling tiling = tile("gather", grid, shapes, P.workers());
  at::Tensor global = at::empty(tiling.global, pieces[0].options().requires_grad(false));
  for (size_t r = 0; r < pieces.size(); ++r) {
    const Index i = unravel(static_cast<int64_t>(r), grid);
    const Shape start = tiling.start(i);
    at::Tensor box = global;
    for (size_t d = 0; d < grid.size(); ++d)
      box = box.narrow(static_cast<int64_t>(d), start[d], shapes[r][d]);
    box.copy_(pieces[r]);
  }
  return global;
}

}  // namespace partita
