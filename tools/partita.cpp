// The `partita` command: explain (worker tables from the reference),
// conformance (the conformance suites under mpiexec, with a summary table)
// and run (one case under mpiexec, checked against the reference). The
// command line is CLI11's; a usage error exits with status 2.
#include <c10/util/Exception.h>

#include <functional>
#include <iostream>
#include <string>

#include "conformance.hpp"
#include "explain.hpp"
#include "partita/cli.hpp"
#include "run.hpp"

int main(int argc, char** argv) {
  CLI::App app{"partita: distributed tensor partitions and data movement, checked against a "
               "serial reference"};
  app.require_subcommand(1);
  std::function<int()> action;
  partita::tools::add_explain(app, action);
  partita::tools::add_conformance(app, action, argv[0]);
  partita::tools::add_run(app, action, &argc, &argv);
  const int parsed = partita::cli::parse(app, argc, argv);
  if (parsed >= 0) return parsed;
  const std::string cmd = app.get_subcommands().front()->get_name();
  try {
    return action();
  } catch (const c10::Error& e) {
    // LibTorch's what() carries a C++ stack trace: the user gets its message.
    std::cerr << "partita " << cmd << ": " << e.what_without_backtrace() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "partita " << cmd << ": " << e.what() << "\n";
  }
  return 2;
}
