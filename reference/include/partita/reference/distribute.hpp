// The serial statement of partita::distribute (partita/distribute.hpp):
// every worker's piece of a global tensor cut over a partition, worked out
// one worker and one dimension at a time.
#pragma once

#include <ATen/ATen.h>

#include "partita/reference/partition.hpp"
#include "partita/reference/tensors.hpp"

namespace partita::reference {

// pieces[w]: what world worker w holds after distributing `global` over P:
// its balanced block (the partition read with leading ones when it has
// fewer dimensions than the tensor), or a zero-volume {0} tensor when w is
// not a worker of P.
Tensors distribute(const Partition& P, const at::Tensor& global);

}  // namespace partita::reference
