#include "partita/reference/broadcast.hpp"

#include "partita/tensor_rules.hpp"

namespace partita::reference {

Tensors broadcast(const Partition& P_x, const Partition& P_y, const Tensors& x,
                  const Options& o) {
  // The partitions' rules first, then the tensors' (the order in which the
  // MPI layer meets them: construction, then the call), so that a case
  // breaking both names the same rule on both sides (issue 9).
  const SendRecv teams = P_x.create_broadcast_partition_to(P_y, o.transpose_src(), o.transpose_dest());
  check_inputs("broadcast", P_x, x);
  return over_receivers(P_x, P_y, x, o.preserve_batch(), [&](int me) {
    const int source = teams.recv(me).workers()[0];  // the root holds the data
    return x[source].clone();
  });
}

}  // namespace partita::reference
