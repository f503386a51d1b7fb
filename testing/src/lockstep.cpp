#include "partita/testing/lockstep.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "partita/json.hpp"
#include "partita/testing/case.hpp"
#include "partita/testing/checks.hpp"
#include "partita/mpi/runtime.hpp"
#include "harness_comms.hpp"

namespace partita::testing {

namespace {
std::string g_program = "<test binary>";
std::string g_current_case = "<no case yet>";

std::string current_test_filter() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (!info) return "";
  return std::string(info->test_suite_name()) + "." + info->name();
}
}  // namespace

namespace {
long g_expected_misses = 0;
}  // namespace

ExpectedDeadlineMisses::ExpectedDeadlineMisses() : at_start_(mpi::deadline_misses()) {}
ExpectedDeadlineMisses::~ExpectedDeadlineMisses() { g_expected_misses += mpi::deadline_misses() - at_start_; }
long expected_deadline_misses() { return g_expected_misses; }

void set_program_name(const std::string& argv0) { g_program = argv0; }
void set_current_case(const std::string& repro) { g_current_case = repro; }

namespace {
MPI_Comm g_harness = MPI_COMM_NULL;
}  // namespace

MPI_Comm harness_comm() {
  if (g_harness == MPI_COMM_NULL) {
    MPI_Comm c = MPI_COMM_NULL;
    // raw-mpi-ok: made at the first use, which every rank reaches at once
    PARTITA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c));
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    checks_comm();  // the helpers' too, while every rank is here
    g_harness = c;
  }
  return g_harness;
}

void detail::free_harness_comms() {
  if (g_harness != MPI_COMM_NULL) MPI_Comm_free(&g_harness);
  free_checks_comm();
}

namespace {

std::string replay_line(const LockstepParams& lp) {
  return "replay: RC_PARAMS=\"seed=" + std::to_string(lp.seed) +
         " max_success=" + std::to_string(lp.max_success) +
         " max_size=" + std::to_string(lp.max_size) + "\" mpiexec.mpich -n " +
         std::to_string(mpi::world_size()) + " " + g_program +
         " --gtest_filter=" + current_test_filter();
}

// Waits for the harness's own collectives. They are not under partita's
// deadline (they must not fail a case) but under a longer one of their own:
// if it passes, some rank is stuck where no deadline reaches it; this rank
// says what it knows and the job ends.
void harness_wait(MPI_Request& req, const LockstepParams& lp, const char* what) {
  if (mpi::deadline() <= 0) return mpi::wait(req, what);  // the watchdog's care
  const double limit = std::max(30.0, 4 * mpi::deadline());
  const auto start = std::chrono::steady_clock::now();
  for (unsigned polls = 0;; ++polls) {
    int done = 0;
    PARTITA_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (mpi::wait_policy() == mpi::WaitPolicy::Yield) sched_yield();
    if ((polls & 1023u) != 0) continue;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited < limit) continue;
    std::ostringstream os;  // one write, as the failure report below
    os << "lockstep: rank " << mpi::world_rank() << " waited " << waited << " s in the " << what
       << " of a case: another rank is stuck where no deadline reaches it\n"
       << "  case: " << g_current_case << "\n  seed " << lp.seed << "\n  " << replay_line(lp)
       << "\n";
    std::cerr << os.str() << std::flush;
    MPI_Abort(MPI_COMM_WORLD, 4);
  }
}


// When `text` is a case file (a primitive's case), says how to keep it and,
// with PARTITA_REGRESSIONS_DIR set, writes it there (rank 0). A case line
// (a JSON object naming a primitive) that the reader refuses is said too:
// `partita run` could not replay it.
std::string keep_regression(const std::string& property, uint64_t seed, const std::string& text) {
  try {
    Case::parse(text, "counterexample");
  } catch (const std::exception& e) {
    bool case_line = false;
    try {
      const json::Value v = json::parse(text, "counterexample");
      case_line = v.is_object() && v.contains("primitive");
    } catch (const std::exception&) {
    }
    if (!case_line) return {};
    return "this case line is not a case file partita run reads (" + std::string(e.what()) +
           "): the case generator and the case reader (testing/src/case.cpp) disagree\n";
  }
  std::string stem = property.substr(0, property.find(' ')) + "_seed" + std::to_string(seed);
  const char* dir = std::getenv("PARTITA_REGRESSIONS_DIR");
  std::ostringstream os;
  if (dir && mpi::world_rank() == 0) {
    const std::string path = std::string(dir) + "/" + stem + ".json";
    std::ofstream(path) << text << "\n";
    os << "kept as " << path << " (ctest replays spec_tests/regressions/ with partita run)\n";
  } else {
    os << "keep it: save the case line above as spec_tests/regressions/" << stem
       << ".json (ctest replays it with partita run; PARTITA_REGRESSIONS_DIR=DIR writes it)\n";
  }
  return os.str();
}

}  // namespace

LockstepParams lockstep_params() {
  // configuration() parses RC_PARAMS; without a seed RapidCheck draws a
  // random one per process, so only rank 0's counts.
  const auto& config = rc::detail::configuration();
  uint64_t p[3] = {config.testParams.seed,
                   static_cast<uint64_t>(config.testParams.maxSuccess),
                   static_cast<uint64_t>(config.testParams.maxSize)};
  // PARTITA_PROP_CASES sets the count unless RC_PARAMS names one, as the
  // replay line does: a replay draws the failing run's cases whatever the
  // shell holds. Anything but a whole number from 1 to 10^9 is refused
  // (strtoull read "lots" as 0 cases: a property that tested nothing).
  const char* rc_params = std::getenv("RC_PARAMS");
  const char* n = std::getenv("PARTITA_PROP_CASES");
  if (n && *n && !(rc_params && std::strstr(rc_params, "max_success="))) {
    char* end = nullptr;
    const unsigned long long v = std::isdigit(static_cast<unsigned char>(n[0])) ? std::strtoull(n, &end, 10) : 0;
    if (!end || *end || v < 1 || v > 1000000000ULL)
      throw std::invalid_argument(std::string("PARTITA_PROP_CASES: expected a whole number of cases from 1 to 10^9, got \"") +
                                  n + "\"");
    p[1] = v;
  }
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Ibcast(p, 3, MPI_UINT64_T, 0, harness_comm(), &req));
  mpi::wait(req, "lockstep_params");
  return {p[0], static_cast<int>(p[1]), static_cast<int>(p[2])};
}

bool check_lockstep_impl(const std::string& name,
                         const std::function<void(Verdict&)>& draw_and_run,
                         std::string* report, uint64_t seed_offset) {
  LockstepParams lp = lockstep_params();
  lp.seed += seed_offset;
  const MPI_Comm comm = harness_comm();
  bool first_failure = true;
  // Each case that misses a deadline costs the deadline's seconds; shrinking
  // one could take minutes. Once a case failed, after this many such cases
  // (the failing one and shrink candidates), the remaining shrink candidates
  // are not run (they count as passing, so RapidCheck keeps the smallest
  // case that really failed). Cases before the first failure all run, also
  // those that miss a deadline and pass (a property that expects the
  // misses). A count, not a clock: every rank agrees on it.
  constexpr int kDeadlineCases = 3;
  int deadline_cases = 0;
  auto property = rc::detail::toProperty([&] {
    if (!first_failure && deadline_cases >= kDeadlineCases) return;
    Verdict v;
    const long misses_before = mpi::deadline_misses();
    draw_and_run(v);
    const bool missed = mpi::deadline_misses() != misses_before;
    // One agreement: did every rank pass, did any miss a deadline.
    int local[2] = {v.ok() ? 1 : 0, missed ? 0 : 1}, global[2] = {0, 0};
    MPI_Request req;
    PARTITA_MPI_CHECK(MPI_Iallreduce(local, global, 2, MPI_INT, MPI_MIN, comm, &req));
    harness_wait(req, lp, "verdict agreement");
    if (!global[1]) {
      renew_after_missed_deadline();  // stale operations stay on the old ones
      if (!global[0] || !first_failure) ++deadline_cases;
    }
    if (global[0]) return;
    // Everyone learns what every failing rank saw, so the failure text (and
    // with it RapidCheck's choice of shrink) is the same on all ranks.
    const auto all = mpi::allgather_strings(v.ok() ? std::string() : v.message(), comm,
                                            [&](MPI_Request& r) { harness_wait(r, lp, "failure report"); });
    const int n = mpi::world_size();
    std::string text;
    for (int r = 0; r < n; ++r)
      if (!all[r].empty()) text += "\n  rank " + std::to_string(r) + ": " + all[r];
    // The first failing case at once, before shrinking (which may take
    // long). The ranks agreed, so rank 0 speaks for all; when they cannot
    // agree, harness_wait has every rank speak.
    // Composed first and written at once: std::cerr writes each << on its
    // own, and mpiexec may put another rank's line between two of them.
    if (first_failure && mpi::world_rank() == 0) {
      std::ostringstream os;
      os << "lockstep property '" << name << "': case failed at " << n << " ranks"
         << (global[1] ? "" : " (a wait missed its deadline)") << ", shrinking\n  case: "
         << g_current_case << text << "\n  seed " << lp.seed << "\n  " << replay_line(lp) << "\n";
      std::cerr << os.str() << std::flush;
    }
    first_failure = false;
    RC_FAIL(text);
  });
  rc::detail::TestMetadata meta;
  meta.id = name;
  meta.description = name;
  rc::detail::TestParams params;
  params.seed = lp.seed;
  params.maxSuccess = lp.max_success;
  params.maxSize = lp.max_size;
  // A silent listener: RapidCheck's default one would print its own
  // "reproduce" hint on every rank at exit; the replay line below is ours.
  struct Quiet : rc::detail::TestListener {
    void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
    void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
    void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
  } quiet;
  const auto result = rc::detail::checkProperty(property, meta, params, quiet);
  if (result.is<rc::detail::SuccessResult>()) {
    if (mpi::world_rank() == 0)
      std::cout << "lockstep property '" << name << "': "
                << result.get<rc::detail::SuccessResult>().numSuccess << " cases passed at "
                << mpi::world_size() << " ranks (seed " << lp.seed << ")" << std::endl;
    return true;
  }

  std::ostringstream os;
  os << "lockstep property '" << name << "' failed at " << mpi::world_size()
     << " ranks (seed " << lp.seed << ")\n";
  rc::detail::printResultMessage(result, os);
  if (deadline_cases >= kDeadlineCases)
    os << "\n(shrinking stopped after " << deadline_cases
       << " cases that missed a deadline: the case above is the smallest that failed)";
  os << "\n" << replay_line(lp) << "\n";
  // A shrunk case that `partita run` reads is kept as a regression (issue 9).
  if (result.is<rc::detail::FailureResult>())
    for (const auto& [type, value] : result.get<rc::detail::FailureResult>().counterExample)
      if (const auto kept = keep_regression(name, lp.seed, value); !kept.empty()) os << kept;
  if (report) *report = os.str();
  if (mpi::world_rank() == 0) std::cerr << os.str() << std::flush;
  return false;
}

}  // namespace partita::testing
