#include "conformance.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <random>
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
  std::string command;  // what reruns this row: its environment and launch line
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

// A word of a shell command: as it is when nothing in it is special.
std::string shell_word(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '.' || c == '_' || c == '-' || c == '/' || c == '+' || c == ':';
  });
  return plain ? s : shell_quote(s);
}

// Counts the statuses in a gtest JSON report (nlohmann's exceptions for a
// report of another form).
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

// Text as XML 1.0 character data: markup escaped, and what XML 1.0 does not
// allow, even escaped, replaced by U+FFFD: bytes that are not UTF-8 (a
// test's output may hold any bytes), control characters but tab, newline
// and carriage return, U+FFFE and U+FFFF.
std::string xml_escape(const std::string& s) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '&': out += "&amp;"; ++i; continue;
      case '<': out += "&lt;"; ++i; continue;
      case '>': out += "&gt;"; ++i; continue;
      case '"': out += "&quot;"; ++i; continue;
      case '\'': out += "&apos;"; ++i; continue;
      case '\n': case '\t': case '\r': out += static_cast<char>(c); ++i; continue;
      default: break;
    }
    if (c < 0x80) {
      if (c >= 0x20) out += static_cast<char>(c);
      else out += kReplacement;
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length and smallest code point from the lead
    // byte; continuation bytes 10xxxxxx; no overlong form, surrogate or
    // code point past U+10FFFF.
    const size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    const uint32_t least = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
    uint32_t code = n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    bool valid = n > 0 && i + n <= s.size();
    for (size_t k = 1; valid && k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      valid = (b & 0xC0) == 0x80;
      code = (code << 6) | (b & 0x3F);
    }
    valid = valid && code >= least && code <= 0x10FFFF && (code < 0xD800 || code > 0xDFFF) && code != 0xFFFE &&
            code != 0xFFFF;
    if (valid) {
      out.append(s, i, n);
      i += n;
    } else {
      out += kReplacement;
      ++i;
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

// PARTITA_DEADLINE as the runtime reads it (seconds; 10 when unset or
// empty, as the conformance run's default), times `scale`. Text the
// runtime's atof would read as something else, or a negative or infinite
// number, is refused.
std::string deadline_setting(int scale) {
  const char* given = std::getenv("PARTITA_DEADLINE");
  double seconds = 10;
  if (given && *given) {
    char* end = nullptr;
    seconds = std::strtod(given, &end);
    while (*end && std::isspace(static_cast<unsigned char>(*end))) ++end;
    if (end == given || *end || !std::isfinite(seconds) || seconds < 0 || !std::isfinite(seconds * scale))
      throw Error("partita conformance: PARTITA_DEADLINE='" + std::string(given) +
                  "' is not a number of seconds (e.g. 10 or 2.5; 0 turns deadlines off)");
  }
  std::ostringstream os;
  os << std::setprecision(12) << seconds * scale;
  return os.str();
}

// RC_PARAMS for every suite: the environment's, with a seed drawn here when
// it names none, so that a property suite's rerun command draws its cases.
std::string rc_params() {
  const char* given = std::getenv("RC_PARAMS");
  std::string params = given ? given : "";
  if (params.find("seed=") != std::string::npos || params.find("reproduce=") != std::string::npos) return params;
  std::random_device random;
  const uint64_t seed = (static_cast<uint64_t>(random()) << 32) ^ random();
  return params + (params.empty() ? "" : " ") + "seed=" + std::to_string(seed);
}

// SIGINT or SIGTERM while the run goes on: the suite running gets it, and
// the run stops.
volatile sig_atomic_t g_stop = 0;
void on_stop(int signo) { g_stop = signo; }

struct StopSignals {
  struct sigaction old_int {}, old_term {};
  StopSignals() {
    struct sigaction sa {};
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
};

struct Finished {
  int code = 0;             // the exit status, or 128 + the signal that ended it
  bool timed_out = false;   // ended after `timeout` seconds
  int interrupted = 0;      // the signal this process got while it ran, or 0
};

// Runs `command` under /bin/sh in a process group of its own, its output to
// `log`: after `timeout` seconds, or when this process gets SIGINT or
// SIGTERM, the group gets SIGTERM (the signal got), and SIGKILL 10 s later.
Finished run_command(const std::string& command, const std::string& log, int timeout) {
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error("cannot write " + log);
  const pid_t pid = fork();
  if (pid < 0) {
    ::close(fd);
    throw Error("partita conformance: cannot start a process");
  }
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    ::close(fd);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ::close(fd);
  setpgid(pid, pid);
  Finished f;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  Clock::time_point signalled{};
  bool sent = false, killed = false;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    const auto now = Clock::now();
    if (!sent && (g_stop || now - start > std::chrono::seconds(timeout))) {
      f.interrupted = g_stop;
      f.timed_out = !g_stop;
      kill(-pid, g_stop ? static_cast<int>(g_stop) : SIGTERM);
      signalled = now;
      sent = true;
    }
    if (sent && !killed && now - signalled > std::chrono::seconds(10)) {
      kill(-pid, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  f.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return f;
}

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
  deadline_setting(1);  // a PARTITA_DEADLINE that does not read stops the run before it starts
  const std::string rc = rc_params();
  const StopSignals stop_signals;
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
      if (g_stop) break;
      // The environment every rank runs under, part of the rerun command:
      // a stuck wait fails its case within seconds (deadline mode, scaled
      // by ranks per core) instead of waiting for the watchdog (issue 18).
      std::ostringstream env;
      std::ostringstream launch;
      int scale = 1;
      if (opt.nodes > 1) {
        // The simulated nodes share this machine's cores, which partita's
        // deadline scaling cannot see (it counts a node's ranks): the
        // deadline is scaled here by the job's ranks per core.
        launch << shell_quote(simnodes) << " --nodes " << opt.nodes << " --ranks-per-node " << n / opt.nodes
               << (opt.netns ? " --netns" : "") << " --no-finalize --timeout " << timeout << " -- ";
        scale = static_cast<int>((n + cores - 1) / cores);
      } else {
        launch << shell_quote(mpiexec) << " -n " << n << " ";
      }
      launch << shell_quote(s.at("binary").get<std::string>());
      if (!filter.empty()) launch << " --gtest_filter=" << shell_quote(filter);
      env << "PARTITA_DEADLINE=" << shell_word(deadline_setting(scale))
          << " PARTITA_WAIT_TIMEOUT=" << std::max(10, timeout - 30) << " RC_PARAMS=" << shell_word(rc);
      if (const char* cases = std::getenv("PARTITA_PROP_CASES"); cases && *cases)
        env << " PARTITA_PROP_CASES=" << shell_word(cases);
      row.command = env.str() + " " + launch.str();
      std::cout << "running " << name << " at " << n << " ranks ..." << std::flush;
      const auto t0 = std::chrono::steady_clock::now();
      const Finished finished =
          run_command("exec env " + row.command + " --gtest_output=json:" + tmp, tmp + ".log", timeout);
      row.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const int code = finished.code;
      bool reported = true;
      try {
        count(json::parse(read_file(tmp), tmp), row);
      } catch (const Error& e) {
        reported = false;
        row.note = "no readable gtest report (exit " + std::to_string(code) + ")";
      } catch (const std::exception& e) {
        // A report of another form than gtest's: the row fails, the run goes on.
        reported = false;
        row.passed = row.failed = row.skipped = 0;
        row.note = "its gtest report " + tmp + " is not gtest's (" + e.what() + "; exit " + std::to_string(code) + ")";
      }
      if (finished.timed_out) row.note = "timed out after " + std::to_string(timeout) + " s";
      if (finished.interrupted)
        row.note = std::string("stopped by ") + (finished.interrupted == SIGINT ? "SIGINT" : "SIGTERM");
      // A crash, a timeout, an abort, or a run without a report: nothing to trust.
      if ((code != 0 || !reported) && row.failed == 0) row.failed = 1;
      row.status = row.failed ? "FAILED" : row.passed ? "PASSED" : "SKIPPED";
      if (row.failed) {
        try {
          row.log = read_file(tmp + ".log");
        } catch (const Error&) {
          row.log = "(no output)";
        }
        std::cout << " FAILED; its output:\n" << row.log << "\nrerun: " << row.command << "\n";
      } else {
        std::cout << " " << row.status << "\n";
      }
      std::remove((tmp + ".log").c_str());
      rows.push_back(row);
      if (g_stop) break;
    }
    if (g_stop) break;
  }
  std::remove(tmp.c_str());

  std::cout << "\nConformance summary";
  if (opt.nodes > 1)
    std::cout << " over " << opt.nodes << " simulated nodes" << (opt.netns ? " (network namespaces)" : "");
  std::cout << "\n";
  std::cout << std::left << std::setw(28) << "suite" << std::setw(7) << "ranks" << std::setw(8)
            << "passed" << std::setw(8) << "failed" << std::setw(9) << "skipped" << std::setw(10)
            << "seconds" << "status\n";
  int failed = 0, tests_run = 0;
  json::Value out = json::Value::array();
  for (const auto& r : rows) {
    std::ostringstream secs;
    secs << std::fixed << std::setprecision(1) << r.seconds;
    std::cout << std::setw(28) << r.suite << std::setw(7) << (r.ranks ? std::to_string(r.ranks) : "-")
              << std::setw(8) << r.passed << std::setw(8) << r.failed << std::setw(9) << r.skipped
              << std::setw(10) << secs.str() << r.status << (r.note.empty() ? "" : "  (" + r.note + ")")
              << "\n";
    failed += r.status == "FAILED";
    tests_run += r.passed + r.failed;
    json::Value j;
    j["suite"] = r.suite;
    j["ranks"] = r.ranks;
    j["passed"] = r.passed;
    j["failed"] = r.failed;
    j["skipped"] = r.skipped;
    j["seconds"] = r.seconds;
    j["status"] = r.status;
    if (!r.note.empty()) j["note"] = r.note;
    if (r.status == "FAILED") j["command"] = r.command;
    out.push_back(j);
  }
  if (!opt.json_out.empty()) write_or_throw(opt.json_out, json::dump(out) + "\n");
  if (!opt.junit_out.empty()) write_or_throw(opt.junit_out, junit_xml(rows));
  if (g_stop) {
    std::cout << "CONFORMANCE STOPPED by " << (g_stop == SIGINT ? "SIGINT" : "SIGTERM") << " (" << rows.size()
              << " rows run, " << failed << " failed)\n";
    return 128 + g_stop;
  }
  // A run that tested nothing proves nothing: rank counts no suite has,
  // --nodes dividing none of them, a filter matching no test, or every test
  // skipped.
  if (!failed && tests_run == 0) {
    std::cout << "CONFORMANCE FAILED: no test ran (" << rows.size()
              << " rows; the rank counts, --nodes and --filter left nothing to run, or every test skipped)\n";
    return 1;
  }
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
                     "summary table (exit status 1 when anything FAILED or no test ran)");
  c->add_option("--suites", o->suites_file,
                "the suites to run (default: conformance_suites.json beside this program, "
                "written by CMake)")
      ->check(CLI::ExistingFile);
  c->add_option("--ranks", o->ranks, "run only these rank counts, e.g. 1,2,4 (at most 2^20 of at most 2^20)")
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
