#include "partita/reference/halo_exchange.hpp"

#include "partita/tensor_rules.hpp"
#include "layout.hpp"

namespace partita::reference {

Tensors halo_exchange(const Partition& P_x, const Shape& left, const Shape& right,
                      const Tensors& x) {
  // The widths first (the layer's arguments), then the tensors.
  if (left.size() != right.size())
    throw PartitionError("halo_exchange: " + std::to_string(left.size()) + " left widths and " +
                         std::to_string(right.size()) + " right widths", rule_code::kHaloWidths);
  for (size_t k = 0; k < left.size(); ++k)
    if (left[k] < 0 || right[k] < 0)
      throw PartitionError("halo_exchange: negative ghost width", rule_code::kHaloWidths);
  check_inputs("halo_exchange", P_x, x);
  const int64_t d = x[P_x.workers()[0]].dim();
  if (d < static_cast<int64_t>(P_x.shape().size()))
    throw ShapeError("halo_exchange: a tensor of " + std::to_string(d) +
                     " dimensions cannot be split over a partition of " +
                     std::to_string(P_x.shape().size()), rule_code::kTilingDims);
  const Shape grid = ones_in_front(P_x.shape(), d);
  std::vector<Shape> windows, bulks;
  for (int w : P_x.workers()) windows.push_back(shape_of(x[w]));
  const Layout t =
      lay_out_bulks("halo_exchange", grid, windows, P_x.workers(), left, right, &bulks);

  // The global tensor from the bulks, then padded by the widths.
  at::Tensor global = at::zeros(t.global, x[P_x.workers()[0]].options().requires_grad(false));
  for (int w : P_x.workers()) {
    const Shape& start = t.start[P_x.rank(w)];
    const Shape& len = bulks[P_x.rank(w)];
    at::Tensor box = global, bulk = x[w];
    for (int64_t k = 0; k < d; ++k) {
      box = box.narrow(k, start[k], len[k]);
      bulk = bulk.narrow(k, left[k], len[k]);
    }
    box.copy_(bulk);
  }
  // Padded by the widths (zeros; at::constant_pad_nd rejects zero extents).
  Shape padded_extent(t.global);
  for (int64_t k = 0; k < d; ++k) padded_extent[k] += left[k] + right[k];
  at::Tensor padded = at::zeros(padded_extent, global.options());
  at::Tensor interior = padded;
  for (int64_t k = 0; k < d; ++k) interior = interior.narrow(k, left[k], t.global[k]);
  interior.copy_(global);

  // Every P_x worker gets its window; others keep a clone.
  return over_receivers(P_x, P_x, x, /*preserve_batch=*/false, [&](int me) {
    const Shape& start = t.start[P_x.rank(me)];
    at::Tensor window = padded;
    // Inside the global tensor: global position start - left + p in [0, n).
    at::Tensor inside = at::ones({}, at::kBool);
    for (int64_t k = 0; k < d; ++k) {
      const int64_t len = x[me].size(k);
      window = window.narrow(k, start[k], len);
      const at::Tensor g = at::arange(len, at::kLong) + (start[k] - left[k]);
      Shape view(d, 1);
      view[k] = len;
      inside = inside.logical_and((g >= 0).logical_and(g < t.global[k]).reshape(view));
    }
    return at::where(inside, window, x[me]);
  });
}

}  // namespace partita::reference
