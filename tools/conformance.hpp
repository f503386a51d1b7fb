#pragma once

#include <functional>
#include <string>

namespace CLI {
class App;
}

namespace partita::tools {

// `partita conformance`: runs every conformance suite under mpiexec at its
// rank counts and prints a summary table (PASSED / FAILED / SKIPPED /
// UNIMPLEMENTED), optionally as JSON (--json) and JUnit XML (--junit).
// Exit status 1 when anything FAILED or no test ran, 128 + the signal when
// SIGINT or SIGTERM stopped it. Registers the subcommand on `app`;
// when it is given, `action` is set to run it.
void add_conformance(CLI::App& app, std::function<int()>& action, const std::string& argv0);

}  // namespace partita::tools
