// Options of the broadcast and reduction layers (seed 001), with its
// defaults. Shared vocabulary of the reference and the MPI implementation.
#pragma once

namespace partita {

struct Options {
  // Reverse P_x's shape before applying the rules (the tensor is unchanged).
  bool transpose_src = false;
  // Reverse P_y's shape before padding it (seed 001, note to example 8).
  bool transpose_dest = false;
  // Zero-volume outputs keep the input's first dimension: {batch, 0}.
  bool preserve_batch = true;
};

}  // namespace partita
