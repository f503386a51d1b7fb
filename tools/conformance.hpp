#pragma once

#include <string>
#include <vector>

namespace partita::tools {

// `partita conformance`: runs every conformance suite under mpiexec at its
// rank counts and prints a summary table (PASSED / FAILED / SKIPPED /
// UNIMPLEMENTED). Exit status 1 when anything FAILED.
int conformance(const std::vector<std::string>& args, const std::string& argv0);

}  // namespace partita::tools
