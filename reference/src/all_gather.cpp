#include "partita/reference/all_gather.hpp"

#include "partita/tensor_rules.hpp"

namespace partita::reference {

Tensors all_gather(const Partition& P_x, int axis, int64_t dim, const Tensors& x) {
  return over_teams("all_gather", P_x, {axis}, x, [&](const Partition& team, int me) {
    std::vector<at::Tensor> pieces;
    for (int m : team.workers()) {
      if (dim < 0 || dim >= x[m].dim())
        throw ShapeError("all_gather: worker " + std::to_string(m) + " has no dimension " +
                         std::to_string(dim));
      auto a = x[m].sizes().vec(), b = x[me].sizes().vec();
      a[dim] = b[dim] = 0;
      if (a != b)
        throw ShapeError("all_gather: workers " + std::to_string(me) + " and " +
                         std::to_string(m) + " differ outside dimension " + std::to_string(dim));
      pieces.push_back(x[m]);
    }
    return at::cat(pieces, dim);
  });
}

}  // namespace partita::reference
