#include "conformance.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "partita/cli.hpp"
#include "partita/errors.hpp"
#include "partita/json.hpp"
#include "partita/shape.hpp"

namespace partita::tools {

namespace {

struct Row {
  std::string suite;
  int ranks = 0;
  int passed = 0, failed = 0, skipped = 0;
  double seconds = 0;
  std::string status, note;
  std::string command;  // what reruns this row (the repro line)
  std::string log;      // the run's output, when it failed
};

std::string dirname_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Counts the statuses in a gtest JSON report.
void count(const json::Value& report, Row& row) {
  for (const auto& suite : report.at("testsuites"))
    for (const auto& t : suite.at("testsuite")) {
      const bool failed = t.contains("failures");
      const std::string result = t.contains("result") ? t.at("result").get<std::string>() : "";
      if (failed) ++row.failed;
      else if (result == "SKIPPED") ++row.skipped;
      else if (t.at("status").get<std::string>() == "RUN") ++row.passed;
    }
}

void write_or_throw(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) throw Error("cannot write " + path);
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      case '\n': case '\t': out += static_cast<char>(c); break;
      default:
        // XML 1.0 allows no other control characters, even escaped.
        if (c >= 0x20) out += static_cast<char>(c);
    }
  }
  return out;
}

// JUnit XML as Jenkins, GitLab and GitHub's test reporters read it: one
// <testsuite> per conformance suite, one <testcase> per rank count (named
// "np<N>"), a <failure> carrying the command that reruns it and the run's
// output, <skipped> for UNIMPLEMENTED suites and runs in which every test
// skipped.
std::string junit_xml(const std::vector<Row>& rows) {
  std::vector<std::string> suites;
  for (const auto& r : rows)
    if (std::find(suites.begin(), suites.end(), r.suite) == suites.end()) suites.push_back(r.suite);
  int total = 0, failures = 0, skipped = 0;
  double seconds = 0;
  std::ostringstream body;
  body << std::fixed << std::setprecision(3);
  for (const auto& name : suites) {
    int n = 0, f = 0, k = 0;
    double t = 0;
    std::ostringstream cases;
    cases << std::fixed << std::setprecision(3);
    for (const auto& r : rows) {
      if (r.suite != name) continue;
      ++n;
      t += r.seconds;
      const std::string id = r.ranks ? "np" + std::to_string(r.ranks) : "unimplemented";
      cases << "    <testcase classname=\"partita.conformance." << xml_escape(name) << "\" name=\""
            << id << "\" time=\"" << r.seconds << "\"";
      if (r.status == "FAILED") {
        ++f;
        const std::string message =
            std::to_string(r.failed) + " failed at " + std::to_string(r.ranks) + " ranks" +
            (r.note.empty() ? "" : " (" + r.note + ")") + "; rerun: " + r.command;
        cases << ">\n      <failure message=\"" << xml_escape(message) << "\" type=\"conformance\">"
              << xml_escape("rerun: " + r.command + "\n\n" + r.log) << "</failure>\n    </testcase>\n";
      } else if (r.status == "SKIPPED" || r.status == "UNIMPLEMENTED") {
        ++k;
        cases << ">\n      <skipped message=\"" << xml_escape(r.note.empty() ? r.status : r.note)
              << "\"/>\n    </testcase>\n";
      } else {
        cases << "/>\n";
      }
    }
    total += n;
    failures += f;
    skipped += k;
    seconds += t;
    body << "  <testsuite name=\"" << xml_escape(name) << "\" tests=\"" << n << "\" failures=\"" << f
         << "\" errors=\"0\" skipped=\"" << k << "\" time=\"" << t << "\">\n"
         << cases.str() << "  </testsuite>\n";
  }
  std::ostringstream doc;
  doc << std::fixed << std::setprecision(3) << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<testsuites name=\"partita conformance\" tests=\"" << total << "\" failures=\"" << failures
      << "\" errors=\"0\" skipped=\"" << skipped << "\" time=\"" << seconds << "\">\n"
      << body.str() << "</testsuites>\n";
  return doc.str();
}

struct Options {
  std::string suites_file, ranks, json_out, junit_out, filter, simnodes;
  int timeout = 900;
  int nodes = 1;  // > 1: over that many simulated nodes (tools/simnodes.sh)
  bool netns = false;
};

int conformance(const Options& opt) {
  const std::string& suites_file = opt.suites_file;
  const std::string& filter = opt.filter;
  const int timeout = opt.timeout;
  const std::vector<int> only_ranks = opt.ranks.empty() ? std::vector<int>{} : parse_ranks(opt.ranks);
  const json::Value manifest = json::parse(read_file(suites_file), suites_file);
  const std::string mpiexec = manifest.at("mpiexec").get<std::string>();
  std::string simnodes = opt.simnodes;
  if (opt.nodes > 1 && simnodes.empty()) {
    if (!manifest.contains("simnodes"))
      throw Error("partita conformance: --nodes " + std::to_string(opt.nodes) + ": " + suites_file +
                  " names no simulated-node launcher; give one with --simnodes PATH (tools/simnodes.sh)");
    simnodes = manifest.at("simnodes").get<std::string>();
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<Row> rows;
  const std::string tmp = "/tmp/partita-conformance-" + std::to_string(getpid()) + ".json";
  for (const auto& s : manifest.at("suites")) {
    const std::string name = s.at("name").get<std::string>();
    if (s.contains("unimplemented")) {
      Row row;
      row.suite = name;
      row.status = "UNIMPLEMENTED";
      row.note = s.at("unimplemented").get<std::string>();
      rows.push_back(row);
      continue;
    }
    for (const auto n : s.at("ranks").get<std::vector<int64_t>>()) {
      if (!only_ranks.empty() &&
          std::find(only_ranks.begin(), only_ranks.end(), n) == only_ranks.end())
        continue;
      if (opt.nodes > 1 && n % opt.nodes != 0) continue;  // the nodes hold n / nodes ranks each
      Row row;
      row.suite = name;
      row.ranks = static_cast<int>(n);
      std::remove(tmp.c_str());
      std::ostringstream repro;
      std::string deadline = "${PARTITA_DEADLINE:-10}";
      if (opt.nodes > 1) {
        // The simulated nodes share this machine's cores, which partita's
        // deadline scaling cannot see (it counts a node's ranks): the
        // deadline is scaled here by the job's ranks per core.
        repro << shell_quote(simnodes) << " --nodes " << opt.nodes << " --ranks-per-node " << n / opt.nodes
              << (opt.netns ? " --netns" : "") << " --no-finalize --timeout " << timeout << " -- ";
        deadline = "$((${PARTITA_DEADLINE:-10} * " + std::to_string((n + cores - 1) / cores) + "))";
      } else {
        repro << shell_quote(mpiexec) << " -n " << n << " ";
      }
      repro << shell_quote(s.at("binary").get<std::string>());
      if (!filter.empty()) repro << " --gtest_filter=" << shell_quote(filter);
      row.command = repro.str();
      std::ostringstream cmd;
      // A stuck wait fails its case within seconds (deadline mode, scaled by
      // ranks per core) instead of waiting for the watchdog (issue 18).
      cmd << "PARTITA_DEADLINE=" << deadline << " PARTITA_WAIT_TIMEOUT="
          << std::max(10, timeout - 30) << " timeout -k 10 " << timeout
          << " " << row.command << " --gtest_output=json:" << tmp << " > " << tmp << ".log 2>&1";
      std::cout << "running " << name << " at " << n << " ranks ..." << std::flush;
      const auto t0 = std::chrono::steady_clock::now();
      const int rc = std::system(cmd.str().c_str());
      row.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
      bool reported = true;
      try {
        count(json::parse(read_file(tmp), tmp), row);
      } catch (const Error& e) {
        reported = false;
        row.note = "no readable gtest report (exit " + std::to_string(code) + ")";
      }
      if (code == 124 || code == 137) row.note = "timed out after " + std::to_string(timeout) + " s";
      // A crash, a timeout, an abort, or a run without a report: nothing to trust.
      if ((code != 0 || !reported) && row.failed == 0) row.failed = 1;
      row.status = row.failed ? "FAILED" : row.passed ? "PASSED" : "SKIPPED";
      if (row.failed) {
        try {
          row.log = read_file(tmp + ".log");
        } catch (const Error&) {
          row.log = "(no output)";
        }
        std::cout << " FAILED; its output:\n" << row.log << "\n";
      } else {
        std::cout << " " << row.status << "\n";
      }
      std::remove((tmp + ".log").c_str());
      rows.push_back(row);
    }
  }
  std::remove(tmp.c_str());

  std::cout << "\nConformance summary";
  if (opt.nodes > 1)
    std::cout << " over " << opt.nodes << " simulated nodes" << (opt.netns ? " (network namespaces)" : "");
  std::cout << "\n";
  std::cout << std::left << std::setw(28) << "suite" << std::setw(7) << "ranks" << std::setw(8)
            << "passed" << std::setw(8) << "failed" << std::setw(9) << "skipped" << std::setw(10)
            << "seconds" << "status\n";
  int failed = 0;
  json::Value out = json::Value::array();
  for (const auto& r : rows) {
    std::ostringstream secs;
    secs << std::fixed << std::setprecision(1) << r.seconds;
    std::cout << std::setw(28) << r.suite << std::setw(7) << (r.ranks ? std::to_string(r.ranks) : "-")
              << std::setw(8) << r.passed << std::setw(8) << r.failed << std::setw(9) << r.skipped
              << std::setw(10) << secs.str() << r.status << (r.note.empty() ? "" : "  (" + r.note + ")")
              << "\n";
    failed += r.status == "FAILED";
    json::Value j;
    j["suite"] = r.suite;
    j["ranks"] = r.ranks;
    j["passed"] = r.passed;
    j["failed"] = r.failed;
    j["skipped"] = r.skipped;
    j["seconds"] = r.seconds;
    j["status"] = r.status;
    if (!r.note.empty()) j["note"] = r.note;
    out.push_back(j);
  }
  if (!opt.json_out.empty()) write_or_throw(opt.json_out, json::dump(out) + "\n");
  if (!opt.junit_out.empty()) write_or_throw(opt.junit_out, junit_xml(rows));
  std::cout << (failed ? "CONFORMANCE FAILED" : "CONFORMANCE PASSED") << " (" << rows.size()
            << " rows, " << failed << " failed)\n";
  return failed ? 1 : 0;
}

}  // namespace

void add_conformance(CLI::App& app, std::function<int()>& action, const std::string& argv0) {
  auto o = std::make_shared<Options>();
  o->suites_file = dirname_of(argv0) + "/conformance_suites.json";
  CLI::App* c = app.add_subcommand(
      "conformance", "run the conformance suites under mpiexec at their rank counts and print the "
                     "summary table (exit status 1 when anything FAILED)");
  c->add_option("--suites", o->suites_file,
                "the suites to run (default: conformance_suites.json beside this program, "
                "written by CMake)")
      ->check(CLI::ExistingFile);
  c->add_option("--ranks", o->ranks, "run only these rank counts, e.g. 1,2,4")
      ->check(cli::ranks_list());
  c->add_option("--timeout", o->timeout, "seconds before one suite at one rank count is killed")
      ->check(CLI::Range(10, 86400))
      ->capture_default_str();
  c->add_option("--json", o->json_out, "also write the summary as JSON to FILE");
  c->add_option("--junit", o->junit_out,
                "also write a JUnit XML report to FILE (one testcase per suite and rank count)");
  c->add_option("--filter", o->filter, "a GoogleTest filter passed to every suite");
  c->add_option("--nodes", o->nodes,
                "run over N simulated nodes (tools/simnodes.sh, as root): each suite at the rank "
                "counts N divides, N nodes of ranks/N ranks")
      ->check(CLI::Range(1, 200))
      ->capture_default_str();
  c->add_option("--simnodes", o->simnodes,
                "the simulated-node launcher for --nodes (default: the one the manifest names)");
  c->add_flag("--netns", o->netns, "with --nodes: every node in its own network namespace");
  c->callback([o, &action] { action = [o] { return conformance(*o); }; });
}

}  // namespace partita::tools
