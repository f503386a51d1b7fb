#pragma once

#include <string>
#include <vector>

namespace partita::tools {

// `partita run CASE.json [--save DIR]` under mpiexec: runs the case against
// the reference, prints one verdict line per rank (on rank 0, in rank
// order), optionally saves DIR/rank<r>.pt, and returns non-zero on any
// mismatch. Initialises MPI itself.
int run(const std::vector<std::string>& args, int* argc, char*** argv);

}  // namespace partita::tools
