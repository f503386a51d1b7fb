#pragma once
// The command lines of `partita` and `partita_perf`, through CLI11
// (Debian's libcli11-dev): one way to say a usage error (exit status 2,
// CLI11's message and a pointer to --help, on stderr) and validators for
// the rank and shape lists both programs take ("0-11", "1,2,3", "2,3,2").
#include <CLI/CLI.hpp>

#include <string>

#include "partita/shape.hpp"

namespace partita::cli {

// A CLI11 check that `read` (parse_ranks, parse_shape) accepts the text;
// its error message is CLI11's.
template <typename Read>
CLI::Validator readable_as(Read read, const char* name) {
  return CLI::Validator(
      [read](std::string& text) -> std::string {
        try {
          read(text);
          return {};
        } catch (const std::exception& e) {
          return e.what();
        }
      },
      name);
}

// A list of world ranks as parse_ranks reads it ("0-11", "1,2,3").
inline CLI::Validator ranks_list() { return readable_as(parse_ranks, "RANKS"); }

// A shape as parse_shape reads it ("2,3,2").
inline CLI::Validator shape_list() { return readable_as(parse_shape, "SHAPE"); }

// Parses the command line. Returns -1 when the program should go on; 0
// after --help (printed on stdout); 2 after a usage error (said on stderr).
inline int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return -1;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
}

}  // namespace partita::cli
