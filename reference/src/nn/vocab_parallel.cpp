#include "partita/reference/vocab_parallel.hpp"

#include <ATen/ATen.h>

#include "partita/errors.hpp"

namespace partita::reference {

namespace {

// The world ranks of each replica's team, in order along axis 1.
std::vector<Ranks> teams(const Partition& P) {
  std::vector<Ranks> out;
  for (const auto& team : P.create_allreduction_partition({1}).parts) out.push_back(team.workers());
  return out;
}

void check_ids(const at::Tensor& ids, int64_t vocab, const char* what) {
  if (ids.numel() && (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= vocab))
    throw ShapeError(std::string(what) + " outside the vocabulary [0, " + std::to_string(vocab) + ")",
                     rule_code::kTilingDims);
}

}  // namespace

Tensors vocab_parallel_embedding(const Partition& P, const at::Tensor& table, const Tensors& ids) {
  Tensors y;
  for (const auto& x : ids) y.push_back(x.clone());
  for (const Ranks& team : teams(P)) {
    Tensors pieces;
    for (int w : team) pieces.push_back(ids[w]);
    const at::Tensor all = at::cat(pieces, 1);
    check_ids(all, table.size(0), "an id");
    const at::Tensor rows = table.index_select(0, all.reshape(-1)).reshape({all.size(0), all.size(1), table.size(1)});
    int64_t at = 0;
    for (int w : team) {
      y[w] = rows.narrow(1, at, ids[w].size(1));
      at += ids[w].size(1);
    }
  }
  return y;
}

Tensors vocab_parallel_cross_entropy(const Partition& P, const Tensors& logits, const Tensors& targets) {
  Tensors y;
  for (const auto& x : targets) y.push_back(x.clone());
  for (const Ranks& team : teams(P)) {
    Tensors l, t;
    for (int w : team) {
      l.push_back(logits[w]);
      t.push_back(targets[w]);
    }
    at::Tensor whole = at::cat(l, 2);
    const at::Tensor all = at::cat(t, 1);
    // 16-bit logits: the loss in float32.
    if (whole.scalar_type() == at::kHalf || whole.scalar_type() == at::kBFloat16) whole = whole.to(at::kFloat);
    check_ids(all, whole.size(2), "a target");
    // -log softmax at the target, written out.
    const at::Tensor loss = at::logsumexp(whole, -1) - whole.gather(-1, all.unsqueeze(-1)).squeeze(-1);
    int64_t at = 0;
    for (int w : team) {
      y[w] = loss.narrow(1, at, targets[w].size(1));
      at += targets[w].size(1);
    }
  }
  return y;
}

}  // namespace partita::reference
