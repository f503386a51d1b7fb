// reference::distribute, the plain way: for each worker, for each
// dimension, count out the balanced piece (layout.hpp) and cut it.
#include "partita/reference/distribute.hpp"

#include "layout.hpp"

namespace partita::reference {

Tensors distribute(const Partition& P, const at::Tensor& global) {
  Tensors pieces;
  const Shape grid = ones_in_front(P.shape(), static_cast<size_t>(global.dim()));
  for (int w = 0; w < P.world_size(); ++w) {
    if (!P.active(w)) {
      pieces.push_back(at::zeros({0}, global.options()));
      continue;
    }
    // The worker's place on the grid: its partition rank, row-major.
    int64_t rank = P.rank(w);
    Index place(grid.size(), 0);
    for (size_t d = grid.size(); d-- > 0;) {
      place[d] = rank % grid[d];
      rank /= grid[d];
    }
    at::Tensor piece = global;
    for (size_t d = 0; d < grid.size(); ++d) {
      const auto [start, length] = balanced_piece(global.size(static_cast<int64_t>(d)), grid[d], place[d]);
      piece = piece.narrow(static_cast<int64_t>(d), start, length);
    }
    pieces.push_back(piece.clone());
  }
  return pieces;
}

}  // namespace partita::reference
