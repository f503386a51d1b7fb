#include "partita/reference/repartition.hpp"

#include "partita/tensor_rules.hpp"

namespace partita::reference {

namespace {
Shape padded(const Shape& s, size_t d) {
  Shape out(d - s.size(), 1);
  out.insert(out.end(), s.begin(), s.end());
  return out;
}
}  // namespace

Tensors repartition(const Partition& P_x, const Partition& P_y, const Tensors& x) {
  check_inputs("repartition", P_x, x);
  const int64_t d = x[P_x.workers()[0]].dim();
  if (d < static_cast<int64_t>(P_x.shape().size()) || d < static_cast<int64_t>(P_y.shape().size()))
    throw ShapeError("repartition: a tensor of " + std::to_string(d) +
                     " dimensions cannot be split over partitions of " +
                     std::to_string(P_x.shape().size()) + " and " +
                     std::to_string(P_y.shape().size()) + " dimensions");
  const Shape sx = padded(P_x.shape(), d), sy = padded(P_y.shape(), d);
  // The extent of every slab of the grid, as the inputs give it.
  std::vector<std::vector<int64_t>> ext(d);
  for (int64_t k = 0; k < d; ++k) ext[k].assign(sx[k], -1);
  for (int w : P_x.workers()) {
    if (x[w].dim() != d)
      throw ShapeError("repartition: P_x's inputs have different numbers of dimensions");
    const Index ix = unravel(P_x.rank(w), sx);
    for (int64_t k = 0; k < d; ++k) {
      int64_t& e = ext[k][ix[k]];
      if (e >= 0 && e != x[w].size(k))
        throw ShapeError("repartition: the inputs do not tile a tensor: worker " + std::to_string(w) +
                         " has extent " + std::to_string(x[w].size(k)) + " in dimension " +
                         std::to_string(k) + " where its slab has " + std::to_string(e));
      e = x[w].size(k);
    }
  }
  // Assemble the global tensor from the pieces.
  Shape n(d, 0);
  for (int64_t k = 0; k < d; ++k)
    for (auto e : ext[k]) n[k] += e;
  const at::ScalarType dtype = x[P_x.workers()[0]].scalar_type();
  at::Tensor global = at::zeros(n, at::TensorOptions().dtype(dtype));
  for (int w : P_x.workers()) {
    const Index ix = unravel(P_x.rank(w), sx);
    at::Tensor window = global;
    for (int64_t k = 0; k < d; ++k) {
      int64_t start = 0;
      for (int64_t j = 0; j < ix[k]; ++j) start += ext[k][j];
      window = window.narrow(k, start, ext[k][ix[k]]);
    }
    window.copy_(x[w]);
  }
  // Cut it by the balanced decomposition over P_y.
  Tensors y(x.size());
  for (size_t w = 0; w < x.size(); ++w) {
    const int me = static_cast<int>(w);
    if (P_y.active(me)) {
      const Index iy = unravel(P_y.rank(me), sy);
      at::Tensor piece = global;
      for (int64_t k = 0; k < d; ++k)
        piece = piece.narrow(k, local_start(n[k], sy[k], iy[k]), local_length(n[k], sy[k], iy[k]));
      y[w] = piece.clone();
    } else if (P_x.active(me)) {
      y[w] = at::empty({0}, x[w].options().requires_grad(false));
    } else {
      y[w] = x[w].clone();
    }
  }
  return y;
}

}  // namespace partita::reference
