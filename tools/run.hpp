#pragma once

#include <functional>

namespace CLI {
class App;
}

namespace partita::tools {

// `partita run CASE.json [--save DIR]` under mpiexec: runs the case against
// the reference, prints one verdict line per rank (on rank 0, in rank
// order), optionally saves DIR/rank<r>.pt, and returns 1 on any mismatch,
// 2 when the case file is wrong. Initialises MPI itself (with argc/argv).
// Registers the subcommand on `app`; when given, `action` is set to run it.
void add_run(CLI::App& app, std::function<int()>& action, int* argc, char*** argv);

}  // namespace partita::tools
