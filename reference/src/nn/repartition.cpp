#include "partita/reference/repartition.hpp"

#include "partita/tensor_rules.hpp"
#include "layout.hpp"

namespace partita::reference {

Tensors repartition(const Partition& P_x, const Partition& P_y, const Tensors& x) {
  check_inputs("repartition", P_x, x);
  const int64_t d = x[P_x.workers()[0]].dim();
  if (d < static_cast<int64_t>(P_x.shape().size()) || d < static_cast<int64_t>(P_y.shape().size()))
    throw ShapeError("repartition: a tensor of " + std::to_string(d) +
                     " dimensions cannot be split over partitions of " +
                     std::to_string(P_x.shape().size()) + " and " +
                     std::to_string(P_y.shape().size()) + " dimensions", rule_code::kTilingDims);
  const Shape sx = ones_in_front(P_x.shape(), d), sy = ones_in_front(P_y.shape(), d);
  std::vector<Shape> pieces;
  for (int w : P_x.workers()) pieces.push_back(shape_of(x[w]));
  const Layout t = lay_out("repartition", sx, pieces, P_x.workers());
  const Shape& n = t.global;
  // Assemble the global tensor from the pieces.
  const at::ScalarType dtype = x[P_x.workers()[0]].scalar_type();
  at::Tensor global = at::zeros(n, at::TensorOptions().dtype(dtype));
  for (int w : P_x.workers()) {
    const Shape& start = t.start[P_x.rank(w)];
    at::Tensor window = global;
    for (int64_t k = 0; k < d; ++k) window = window.narrow(k, start[k], x[w].size(k));
    window.copy_(x[w]);
  }
  // Cut it by the balanced decomposition over P_y.
  return over_receivers(P_x, P_y, x, /*preserve_batch=*/false, [&](int me) {
    // This worker's place in P_y as the reference counts it, with the
    // leading ones the tensor's extra dimensions add.
    const Index own = P_y.index(me);
    Index iy(static_cast<size_t>(d) - own.size(), 0);
    iy.insert(iy.end(), own.begin(), own.end());
    at::Tensor piece = global;
    for (int64_t k = 0; k < d; ++k) {
      const auto [start, length] = balanced_piece(n[k], sy[k], iy[k]);
      piece = piece.narrow(k, start, length);
    }
    return piece.clone();
  });
}

}  // namespace partita::reference
