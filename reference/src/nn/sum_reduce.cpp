#include "partita/reference/sum_reduce.hpp"

#include "partita/tensor_rules.hpp"

namespace partita::reference {

Tensors sum_reduce(const Partition& P_x, const Partition& P_y, const Tensors& x,
                   const Options& o) {
  // The partitions' rules first, then the tensors' (as in broadcast.cpp).
  const SendRecv teams = P_x.create_reduction_partition_to(P_y, o.transpose_src(), o.transpose_dest());
  check_inputs("sum_reduce", P_x, x);
  return over_receivers(P_x, P_y, x, o.preserve_batch(), [&](int me) {
    // Add up the inputs of every worker whose P_send is this worker's team.
    const int label = teams.recv_label[me];
    at::Tensor sum;
    int first = -1;
    for (size_t c = 0; c < x.size(); ++c) {
      if (teams.send_label[c] != label) continue;
      if (!sum.defined()) {
        sum = x[c].clone();
        first = static_cast<int>(c);
      } else if (x[c].sizes() != x[first].sizes()) {
        throw ShapeError("sum_reduce: workers " + std::to_string(first) + " and " +
                         std::to_string(c) + " reduce into worker " + std::to_string(me) +
                         " with different shapes " + shape_string(shape_of(x[first])) + " and " +
                         shape_string(shape_of(x[c])), rule_code::kTeamShapes);
      } else {
        sum = sum + x[c];
      }
    }
    return sum;
  });
}

}  // namespace partita::reference
