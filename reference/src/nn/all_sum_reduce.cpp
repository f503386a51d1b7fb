#include "partita/reference/all_sum_reduce.hpp"

#include "partita/tensor_rules.hpp"

namespace partita::reference {

Tensors all_sum_reduce(const Partition& P_x, const std::vector<int>& axes, const Tensors& x) {
  return over_teams("all_sum_reduce", P_x, axes, x, [&](const Partition& team, int) {
    const Ranks& t = team.workers();
    at::Tensor sum = x[t[0]].clone();
    for (size_t i = 1; i < t.size(); ++i) {
      if (x[t[i]].sizes() != x[t[0]].sizes())
        throw ShapeError("all_sum_reduce: workers " + std::to_string(t[0]) + " and " +
                         std::to_string(t[i]) + " of one team have different shapes " +
                         shape_string(shape_of(x[t[0]])) + " and " +
                         shape_string(shape_of(x[t[i]])), rule_code::kTeamShapes);
      sum = sum + x[t[i]];
    }
    return sum;
  });
}

}  // namespace partita::reference
