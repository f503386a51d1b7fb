#include "conformance.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "partita/errors.hpp"
#include "partita/json.hpp"
#include "partita/shape.hpp"

namespace partita::tools {

namespace {

const char* kUsage =
    "usage: partita conformance [--suites FILE] [--ranks 1,2,4,12] [--timeout SECONDS]\n"
    "                           [--json FILE] [--filter GTEST_FILTER]\n"
    "  FILE defaults to conformance_suites.json beside the partita binary (written by CMake).\n";

struct Row {
  std::string suite;
  int ranks = 0;
  int passed = 0, failed = 0, skipped = 0;
  double seconds = 0;
  std::string status, note;
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

}  // namespace

int conformance(const std::vector<std::string>& args, const std::string& argv0) {
  std::string suites_file = dirname_of(argv0) + "/conformance_suites.json";
  std::string json_out, filter;
  std::vector<int> only_ranks;
  int timeout = 900;
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw Error(args[i] + " needs a value");
      return args[++i];
    };
    if (args[i] == "--suites") suites_file = value();
    else if (args[i] == "--ranks") only_ranks = parse_ranks(value());
    else if (args[i] == "--timeout") timeout = std::stoi(value());
    else if (args[i] == "--json") json_out = value();
    else if (args[i] == "--filter") filter = value();
    else {
      std::cerr << kUsage;
      return 2;
    }
  }
  const json::Value manifest = json::parse(read_file(suites_file), suites_file);
  const std::string mpiexec = manifest.at("mpiexec").get<std::string>();
  std::vector<Row> rows;
  const std::string tmp = "/tmp/partita-conformance-" + std::to_string(getpid()) + ".json";
  for (const auto& s : manifest.at("suites")) {
    const std::string name = s.at("name").get<std::string>();
    if (s.contains("unimplemented")) {
      rows.push_back({name, 0, 0, 0, 0, 0, "UNIMPLEMENTED", s.at("unimplemented").get<std::string>()});
      continue;
    }
    for (const auto n : s.at("ranks").get<std::vector<int64_t>>()) {
      if (!only_ranks.empty() &&
          std::find(only_ranks.begin(), only_ranks.end(), n) == only_ranks.end())
        continue;
      Row row{name, static_cast<int>(n)};
      std::remove(tmp.c_str());
      std::ostringstream cmd;
      cmd << "PARTITA_WAIT_TIMEOUT=" << std::max(10, timeout - 30) << " timeout -k 10 " << timeout
          << " " << shell_quote(mpiexec) << " -n " << n << " "
          << shell_quote(s.at("binary").get<std::string>()) << " --gtest_output=json:" << tmp;
      if (!filter.empty()) cmd << " --gtest_filter=" << shell_quote(filter);
      cmd << " > " << tmp << ".log 2>&1";
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
        std::cout << " FAILED; its output:\n" << read_file(tmp + ".log") << "\n";
      } else {
        std::cout << " " << row.status << "\n";
      }
      std::remove((tmp + ".log").c_str());
      rows.push_back(row);
    }
  }
  std::remove(tmp.c_str());

  std::cout << "\nConformance summary\n";
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
  if (!json_out.empty()) std::ofstream(json_out) << json::dump(out) << "\n";
  std::cout << (failed ? "CONFORMANCE FAILED" : "CONFORMANCE PASSED") << " (" << rows.size()
            << " rows, " << failed << " failed)\n";
  return failed ? 1 : 0;
}

}  // namespace partita::tools
