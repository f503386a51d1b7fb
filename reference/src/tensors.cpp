#include "partita/reference/tensors.hpp"

#include "partita/tensor_rules.hpp"

namespace partita::reference {

void check_inputs(const std::string& what, const Partition& P_x, const Tensors& x) {
  const int world = std::max(P_x.world_size(), static_cast<int>(x.size()));
  if (static_cast<int>(x.size()) != P_x.world_size())
    throw ShapeError(what + ": " + std::to_string(x.size()) + " tensors for a world of " +
                     std::to_string(P_x.world_size()), rule_code::kWorkerRange);
  at::ScalarType dtype = at::ScalarType::Undefined;
  int first = -1;
  for (int w = 0; w < world; ++w) {
    if (x[w].dim() > kMaxTensorDims)
      throw ShapeError(what + ": worker " + std::to_string(w) + " has " +
                       std::to_string(x[w].dim()) + " dimensions, more than " +
                       std::to_string(kMaxTensorDims), rule_code::kTooManyDims);
    if (!P_x.active(w)) {
      if (x[w].numel() != 0)
        throw ShapeError(what + ": worker " + std::to_string(w) +
                         " is outside P_x and must pass a zero-volume tensor, not " +
                         shape_string(shape_of(x[w])), rule_code::kOutsideNotEmpty);
      continue;
    }
    if (!dtype_supported(x[w].scalar_type()))
      throw ShapeError(what + ": worker " + std::to_string(w) + " has unsupported dtype " +
                       dtype_name(x[w].scalar_type()), rule_code::kDtypeUnsupported);
    if (first < 0) {
      first = w;
      dtype = x[w].scalar_type();
    } else if (x[w].scalar_type() != dtype) {
      throw ShapeError(what + ": worker " + std::to_string(first) + " has " + dtype_name(dtype) +
                       " but worker " + std::to_string(w) + " has " +
                       dtype_name(x[w].scalar_type()), rule_code::kDtypeMismatch);
    }
  }
}

// A worker that sends and receives nothing holds an empty tensor of its
// input's dtype: [batch, 0] when the batch size is kept, else [0]
// (docs/design.md, "Workers with no data").
at::Tensor no_data(const at::Tensor& x, bool preserve_batch) {
  const std::vector<int64_t> shape =
      preserve_batch && x.dim() >= 1 ? std::vector<int64_t>{x.size(0), 0} : std::vector<int64_t>{0};
  return at::zeros(shape, at::TensorOptions().dtype(x.scalar_type()));
}

Tensors over_receivers(const Partition& P_x, const Partition& P_y, const Tensors& x,
                       bool preserve_batch, const std::function<at::Tensor(int w)>& receiver) {
  Tensors y(x.size());
  for (size_t w = 0; w < x.size(); ++w) {
    const int me = static_cast<int>(w);
    if (P_y.active(me)) y[w] = receiver(me);
    else if (P_x.active(me)) y[w] = no_data(x[w], preserve_batch);
    else y[w] = x[w].clone();
  }
  return y;
}

Tensors over_teams(const std::string& what, const Partition& P_x, const std::vector<int>& axes,
                   const Tensors& x,
                   const std::function<at::Tensor(const Partition& team, int w)>& member) {
  check_inputs(what, P_x, x);
  const Family teams = P_x.create_allreduction_partition(axes);
  Tensors y(x.size());
  for (size_t w = 0; w < x.size(); ++w) {
    const int me = static_cast<int>(w);
    y[w] = P_x.active(me) ? member(teams.of(me), me) : x[w].clone();
  }
  return y;
}

}  // namespace partita::reference
