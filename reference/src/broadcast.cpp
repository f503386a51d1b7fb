#include "partita/reference/broadcast.hpp"

#include "partita/tensor_rules.hpp"

namespace partita::reference {

Tensors broadcast(const Partition& P_x, const Partition& P_y, const Tensors& x,
                  const Options& o) {
  check_inputs("broadcast", P_x, x);
  const SendRecv teams = P_x.create_broadcast_partition_to(P_y, o.transpose_src, o.transpose_dest);
  Tensors y(x.size());
  for (size_t w = 0; w < x.size(); ++w) {
    const int me = static_cast<int>(w);
    if (P_y.active(me)) {
      const int source = teams.recv(me).workers()[0];  // the root holds the data
      y[w] = x[source].clone();
    } else if (P_x.active(me)) {
      y[w] = zero_volume_like(x[w], o.preserve_batch);
    } else {
      y[w] = x[w].clone();
    }
  }
  return y;
}

}  // namespace partita::reference
