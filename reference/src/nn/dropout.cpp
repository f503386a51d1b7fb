#include "partita/reference/dropout.hpp"

#include <ATen/ATen.h>

#include <algorithm>

namespace partita::reference {

namespace {

uint64_t mix(uint64_t z) {  // splitmix64's finaliser
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

Tensors seeded_dropout(const Partition& P, double p, uint64_t seed, uint64_t call,
                       const std::vector<int>& replicated_axes, const Tensors& x) {
  Tensors y;
  for (const auto& t : x) y.push_back(t.clone());
  const int64_t dims = static_cast<int64_t>(P.shape().size());
  auto replicated = [&](int64_t a) {
    return std::find(replicated_axes.begin(), replicated_axes.end(), a) != replicated_axes.end();
  };
  // Each worker's offset and the global extent along every axis: the
  // lengths of the workers before it on its line along that axis.
  for (int w : P.workers()) {
    const Index mine = P.index(w);
    std::vector<int64_t> offset(dims, 0), global(dims, 0);
    for (int64_t a = 0; a < dims; ++a) {
      if (replicated(a)) {
        global[a] = x[w].size(a);
        continue;
      }
      for (int u : P.workers()) {
        const Index other = P.index(u);
        bool same_line = true;
        for (int64_t b = 0; b < dims; ++b) same_line = same_line && (b == a || other[b] == mine[b]);
        if (!same_line) continue;
        global[a] += x[u].size(a);
        if (other[a] < mine[a]) offset[a] += x[u].size(a);
      }
    }
    // The global mask over this worker's box, one element at a time.
    const uint64_t key = mix(mix(seed) ^ call);
    const at::Tensor flat = x[w].reshape(-1);
    at::Tensor keep = at::zeros({flat.numel()}, at::TensorOptions().dtype(at::kDouble));
    for (int64_t e = 0; e < flat.numel(); ++e) {
      int64_t rest = e, g = 0, scale = 1;
      for (int64_t d = dims - 1; d >= 0; --d) {
        const int64_t i = rest % x[w].size(d);
        rest /= x[w].size(d);
        g += (offset[d] + i) * scale;
        scale *= global[d];
      }
      const double u = static_cast<double>(mix(key ^ static_cast<uint64_t>(g)) >> 11) / 9007199254740992.0;
      keep[e] = u >= p ? 1.0 : 0.0;
    }
    y[w] = x[w] * keep.reshape(x[w].sizes()).to(x[w].scalar_type()) / (1 - p);
  }
  return y;
}

}  // namespace partita::reference
