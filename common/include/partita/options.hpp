// Options of the broadcast and reduction layers (seed 001), with its
// defaults. Shared vocabulary of the reference and the MPI implementation.
#pragma once

#include <optional>
#include <vector>

namespace partita {

struct Options {
  // Reverse P_x's shape before applying the rules (the tensor is unchanged).
  bool transpose_src = false;
  // Reverse P_y's shape before padding it (seed 001, note to example 8).
  bool transpose_dest = false;
  // Zero-volume outputs keep the input's first dimension: {batch, 0}.
  bool preserve_batch = true;
};

// DistDL's parameters of AllGather and ReduceScatter (issue 9): the
// partition dimensions acted on (`axes`: DistDL's axes_all_gather or
// axes_reduce_scatter) or their complement (`axes_keep`), exactly one of the
// two; the tensor dimension gathered or scattered along partition dimension
// d is d. `scale_backward` (AllGather only): partition dimensions whose
// extents divide the gradient in backward (the product of P_x's extents
// along them; empty: no scaling). partita's general form, one partition
// dimension `axis` with any tensor dimension `dim`, is the other constructor.
struct GatherAxes {
  std::optional<std::vector<int>> axes;
  std::optional<std::vector<int>> axes_keep;
  std::vector<int> scale_backward;
};

}  // namespace partita
