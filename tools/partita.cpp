// The `partita` command: explain (worker tables from the reference) and
// conformance (the conformance suites under mpiexec, with a summary table)
// and run (one case under mpiexec, checked against the reference).
#include <iostream>
#include <string>
#include <vector>

#include "conformance.hpp"
#include "explain.hpp"
#include "run.hpp"

namespace {
const char* kUsage =
    "usage: partita <command> [args]\n"
    "  explain PRIMITIVE ...   print the partitions of a broadcast, sum-reduce or\n"
    "                          all-sum-reduce as seed 000 tabulates them\n"
    "  conformance [...]       run the conformance suites at their rank counts and\n"
    "                          print the summary table\n"
    "  run CASE.json [--save DIR]  (under mpiexec) run one case against the\n"
    "                          reference; one verdict line per rank\n";
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  try {
    if (cmd == "explain") return partita::tools::explain(args, std::cout, std::cerr);
    if (cmd == "conformance") return partita::tools::conformance(args, argv[0]);
    if (cmd == "run") return partita::tools::run(args, &argc, &argv);
  } catch (const std::exception& e) {
    std::cerr << "partita " << cmd << ": " << e.what() << "\n";
    return 2;
  }
  std::cerr << "partita: unknown command '" << cmd << "'\n" << kUsage;
  return 2;
}
