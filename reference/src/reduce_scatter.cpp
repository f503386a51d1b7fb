#include "partita/reference/reduce_scatter.hpp"

#include "partita/tensor_rules.hpp"

namespace partita::reference {

Tensors reduce_scatter(const Partition& P_x, int axis, int64_t dim, const Tensors& x) {
  check_inputs("reduce_scatter", P_x, x);
  const Family teams = P_x.create_allreduction_partition({axis});
  Tensors y(x.size());
  for (size_t w = 0; w < x.size(); ++w) {
    const int me = static_cast<int>(w);
    if (!P_x.active(me)) {
      y[w] = x[w].clone();
      continue;
    }
    const Partition team = teams.of(me);
    at::Tensor sum;
    for (int m : team.workers()) {
      if (dim < 0 || dim >= x[m].dim())
        throw ShapeError("reduce_scatter: worker " + std::to_string(m) + " has no dimension " +
                         std::to_string(dim));
      if (sum.defined() && x[m].sizes() != sum.sizes())
        throw ShapeError("reduce_scatter: the inputs of one team differ in shape");
      sum = sum.defined() ? sum + x[m] : x[m].clone();
    }
    const int64_t n = sum.size(dim), k = team.size(), i = team.rank(me);
    y[w] = sum.narrow(dim, local_start(n, k, i), local_length(n, k, i)).clone();
  }
  return y;
}

}  // namespace partita::reference
