#include "partita/reference/all_sum_reduce.hpp"

#include "partita/tensor_rules.hpp"

namespace partita::reference {

Tensors all_sum_reduce(const Partition& P_x, const std::vector<int>& axes, const Tensors& x) {
  check_inputs("all_sum_reduce", P_x, x);
  const Family teams = P_x.create_allreduction_partition(axes);
  Tensors y(x.size());
  for (size_t w = 0; w < x.size(); ++w) {
    const int me = static_cast<int>(w);
    if (!P_x.active(me)) {
      y[w] = x[w].clone();
      continue;
    }
    const Ranks team = teams.of(me).workers();
    at::Tensor sum = x[team[0]].clone();
    for (size_t i = 1; i < team.size(); ++i) {
      if (x[team[i]].sizes() != x[team[0]].sizes())
        throw ShapeError("all_sum_reduce: workers " + std::to_string(team[0]) + " and " +
                         std::to_string(team[i]) + " of one team have different shapes " +
                         shape_string(shape_of(x[team[0]])) + " and " +
                         shape_string(shape_of(x[team[i]])));
      sum = sum + x[team[i]];
    }
    y[w] = sum;
  }
  return y;
}

}  // namespace partita::reference
