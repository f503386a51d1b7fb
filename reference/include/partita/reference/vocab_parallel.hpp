// The vocabulary-parallel layers' serial twins, on the global table and the
// whole logits: each replica's team (the workers of P that differ along
// axis 1) puts its token-split pieces together, works on the whole, and
// each worker keeps its own tokens. Autograd through them gives the global
// gradients.
#pragma once

#include <cstdint>

#include "partita/reference/tensors.hpp"

namespace partita::reference {

// Every worker of P: the rows of `table` ([vocab, hidden]) for its tokens'
// ids (int64 [batch, tokens_s]); a clone elsewhere. ShapeError for an id
// outside the table.
Tensors vocab_parallel_embedding(const Partition& P, const at::Tensor& table, const Tensors& ids);

// Every worker of P: the cross-entropy of each of its tokens, from the
// team's logits (float [batch, tokens, vocab_s], vocabulary split over the
// team in balanced pieces) put together along the vocabulary, and the
// team's targets (int64 [batch, tokens_s]); a clone of the targets elsewhere.
Tensors vocab_parallel_cross_entropy(const Partition& P, const Tensors& logits, const Tensors& targets);

}  // namespace partita::reference
