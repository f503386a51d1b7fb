// The communicator's point-to-point calls on the list of every rank's
// tensor: a ring of isend/irecv pairs is a rotation of the list.
#include "partita/reference/communicator.hpp"

namespace partita::reference::comm {

Tensors ring(const Tensors& x, int shift) {
  const int p = static_cast<int>(x.size());
  Tensors out;
  for (int r = 0; r < p; ++r) out.push_back(x[((r - shift) % p + p) % p].clone());
  return out;
}

}  // namespace partita::reference::comm
