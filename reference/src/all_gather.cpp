#include "partita/reference/all_gather.hpp"

#include "partita/tensor_rules.hpp"

namespace partita::reference {

Tensors all_gather(const Partition& P_x, int axis, int64_t dim, const Tensors& x) {
  check_inputs("all_gather", P_x, x);
  const Family teams = P_x.create_allreduction_partition({axis});
  Tensors y(x.size());
  for (size_t w = 0; w < x.size(); ++w) {
    const int me = static_cast<int>(w);
    if (!P_x.active(me)) {
      y[w] = x[w].clone();
      continue;
    }
    std::vector<at::Tensor> pieces;
    for (int m : teams.of(me).workers()) {
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
    y[w] = at::cat(pieces, dim);
  }
  return y;
}

}  // namespace partita::reference
