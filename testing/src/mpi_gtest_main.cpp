// main() of every MPI GoogleTest binary: MPI up, one gtest run per rank with
// only rank 0 printing the progress (other ranks print their failures, each
// line tagged with the rank), one final summary agreed by all ranks (which
// tests failed on which ranks), and one exit code agreed by all ranks.
//
// No wait of this file is unwatched (docs/testing-library.md, "No test can
// hang"): every agreement between tests and at the end of the run is on a
// communicator of its own (end_comm(), which no test body touches), under a
// limit past which the waiting rank names the ranks that never arrived and
// ends the job; each test runs under the watchdog between partita's waits.
#include <gtest/gtest.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "partita/errors.hpp"
#include "partita/mpi/progress.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/testing/checks.hpp"
#include "partita/testing/lockstep.hpp"

#include "harness_comms.hpp"

namespace {

// The communicator of this file's agreements: made in main() while every
// rank is there.
MPI_Comm g_end = MPI_COMM_NULL;

// How long a rank waits here for the others. With PARTITA_WAIT_TIMEOUT no
// limit: a rank that never gets here is stuck in a partita wait or outside
// one, and its own watchdog ends the job naming it (a peer that is only
// slower, still training after this rank's part of the test, must not be
// taken for a stuck one). In deadline mode without it, ten deadlines (at
// least 120 s): then the waiting rank names the ranks that never arrived.
// Otherwise no limit.
double end_limit() {
  const char* t = std::getenv("PARTITA_WAIT_TIMEOUT");
  if (t && std::atof(t) > 0) return 0;
  if (partita::mpi::deadline() > 0) return std::max(120.0, 10 * partita::mpi::deadline());
  return 0;
}

[[noreturn]] void end_job(const std::string& text) {
  std::cerr << text << std::flush;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the launcher forward it
  MPI_Abort(MPI_COMM_WORLD, 5);
  std::abort();
}

// Finishes `requests` under the waiting policy and end_limit(). Past the
// limit, names `where` and the ranks among `peers` (the sources of the
// first peers.size() requests, receives) that never answered, and ends
// the job.
void finish_or_end(std::vector<MPI_Request>& requests, const std::vector<int>& peers,
                   const std::string& where) {
  // Not mpi::wait_all: its deadline would throw out of a listener.
  const double limit = end_limit();
  const auto start = std::chrono::steady_clock::now();
  for (unsigned polls = 1;; ++polls) {
    int done = 0;
    PARTITA_MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                                  MPI_STATUSES_IGNORE));
    if (done) return;
    if (partita::mpi::wait_policy() == partita::mpi::WaitPolicy::Yield) sched_yield();
    if (limit <= 0 || (polls & 1023u) != 0) continue;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited < limit) continue;
    std::string missing;
    for (size_t i = 0; i < peers.size(); ++i) {
      int got = 0;
      MPI_Test(&requests[i], &got, MPI_STATUS_IGNORE);
      if (!got) missing += (missing.empty() ? "" : ",") + std::to_string(peers[i]);
    }
    std::ostringstream os;
    os << "partita: rank " << partita::mpi::world_rank() << " waited " << waited << " s " << where << " for "
       << (missing.empty() ? std::string("another rank")
                           : std::string("rank") + (missing.find(',') == std::string::npos ? " " : "s ") + missing)
       << ", which never got there: stuck where no deadline reaches (a raw MPI call, a loop); "
          "ending the job\n";
    end_job(os.str());
  }
}

// A test's name as a number, to check that every rank ran the same test.
int64_t name_hash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);
}

// Every rank's `flag` for test `name`, on every rank: point to point on
// end_comm, so that ranks that never arrive can be named. A rank that
// finished another test (the ranks must run the same tests in the same
// order: no --gtest_shuffle without a seed) ends the job.
std::vector<int64_t> exchange_flags(int64_t flag, const std::string& name, const std::string& where) {
  int rank = 0, size = 1;
  MPI_Comm_rank(g_end, &rank);
  MPI_Comm_size(g_end, &size);
  const int64_t mine[2] = {flag, name_hash(name)};
  std::vector<int64_t> all(2 * static_cast<size_t>(size));
  std::vector<int> peers;
  std::vector<MPI_Request> requests;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    peers.push_back(r);
    requests.emplace_back();
    PARTITA_MPI_CHECK(MPI_Irecv(&all[2 * r], 2, MPI_INT64_T, r, 0, g_end, &requests.back()));
  }
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    requests.emplace_back();
    PARTITA_MPI_CHECK(MPI_Isend(mine, 2, MPI_INT64_T, r, 0, g_end, &requests.back()));
  }
  finish_or_end(requests, peers, where);
  all[2 * rank] = mine[0];
  all[2 * rank + 1] = mine[1];
  std::vector<int64_t> flags;
  for (int r = 0; r < size; ++r) {
    if (all[2 * r + 1] != mine[1])
      end_job("partita: rank " + std::to_string(rank) + " finished test " + name + " while rank " +
              std::to_string(r) + " finished another one: the ranks must run the same tests in the same order "
              "(no --gtest_shuffle without --gtest_random_seed); ending the job\n");
    flags.push_back(all[2 * r]);
  }
  return flags;
}

std::string test_name(const ::testing::TestInfo& t) {
  return std::string(t.test_suite_name()) + "." + t.name();
}

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::cerr << "[rank " << rank_ << "] " << (r.file_name() ? r.file_name() : "?") << ":"
              << r.line_number() << ": " << r.summary() << std::endl;
  }

 private:
  int rank_;
};

// Around every test: the watchdog between partita's waits while it runs
// (a rank stuck in it where no deadline reaches is named with the test);
// after it, every rank waits for every other to finish it (the ranks run
// the same tests in the same order) and learns whether any missed a
// deadline, in which case stale operations sit on partita's world
// communicator and the helpers': every rank renews both before the next
// test.
class BetweenTests : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo& t) override {
    watch_.emplace("test " + test_name(t));
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    watch_.reset();
    if (partita::mpi::world_size() == 1) return;
    const long now = partita::mpi::deadline_misses();
    const int clean = now == seen_ ? 1 : 0;
    seen_ = now;
    const auto all = exchange_flags(clean, test_name(t), "after test " + test_name(t));
    if (std::find(all.begin(), all.end(), 0) != all.end()) partita::testing::renew_after_missed_deadline();
  }

 private:
  long seen_ = 0;
  std::optional<partita::mpi::ScopedProgressWatch> watch_;
};

// The end-of-run summary, agreed by the ranks. gtest's own summary on rank 0
// tells rank 0's results only: a test that failed on rank 1 alone would end
// with "[  PASSED  ]" above an exit status of 1. At the end of each iteration
// every rank sends rank 0 the names of the tests that failed on it (and
// whether it missed a deadline no test expected); rank 0 prints gtest's
// summary only when nothing failed anywhere, and otherwise its own, naming
// each failing test with the ranks it failed on. The agreement is on the
// end_comm(), under end_limit() (a rank that never gets here is named by
// the agreement after its last test, or by its watchdog).
// On rank 0 this listener also carries gtest's printer and forwards every
// other event to it.
class AgreedSummary : public ::testing::TestEventListener {
 public:
  // `printer`: gtest's default printer (rank 0) or null (other ranks).
  explicit AgreedSummary(::testing::TestEventListener* printer) : printer_(printer) {}

  void OnTestIterationEnd(const ::testing::UnitTest& unit, int iteration) override {
    const MPI_Comm comm = g_end;
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    // This rank's failures, one name a line, in the order the tests ran.
    std::string mine;
    for (const auto& name : failed_here(unit)) mine += name + "\n";
    if (partita::mpi::deadline_misses() != partita::testing::expected_deadline_misses())
      mine += std::string(kUnexpectedMiss) + "\n";
    const std::vector<std::string> each = partita::mpi::allgather_strings(
        mine, comm, [](MPI_Request& r) {
          std::vector<MPI_Request> one{r};
          finish_or_end(one, {}, "in the summary of the run");
          r = one[0];
        });
    if (rank != 0) return;
    std::string all;
    std::vector<int> lengths(size), starts(size);
    for (int r = 0; r < size; ++r) {
      starts[r] = static_cast<int>(all.size());
      lengths[r] = static_cast<int>(each[r].size());
      all += each[r];
    }
    if (all.empty()) {  // nothing failed anywhere: gtest's summary is true
      if (printer_) printer_->OnTestIterationEnd(unit, iteration);
      return;
    }
    // Which ranks each failure happened on, in the order the tests ran.
    std::map<std::string, std::vector<int>> ranks_of;
    std::vector<std::string> order;
    for (int r = 0; r < size; ++r) {
      std::istringstream lines(
          all.substr(static_cast<size_t>(starts[r]), static_cast<size_t>(lengths[r])));
      for (std::string name; std::getline(lines, name);) {
        auto& ranks = ranks_of[name];
        if (ranks.empty()) order.push_back(name);
        ranks.push_back(r);
      }
    }
    std::vector<std::string> listed;
    for (const auto& name : all_tests(unit))
      if (ranks_of.count(name)) listed.push_back(name);
    for (const auto& name : order)  // not a test of rank 0's run
      if (std::find(listed.begin(), listed.end(), name) == listed.end()) listed.push_back(name);
    int tests = 0;
    for (const auto& name : listed) tests += name != kUnexpectedMiss;
    std::ostringstream os;  // one write
    const int ran = unit.test_to_run_count();
    os << "[==========] " << count(ran, "test") << " from "
       << count(unit.test_suite_to_run_count(), "test suite") << " ran on " << size
       << " ranks. (" << unit.elapsed_time() << " ms total on rank 0)\n"
       << "[  FAILED  ] " << tests << " of " << count(ran, "test")
       << " failed on some rank (the progress lines above are rank 0's), listed below:\n";
    for (const auto& name : listed) {
      const auto& ranks = ranks_of[name];
      os << "[  FAILED  ] " << name << " on rank" << (ranks.size() > 1 ? "s " : " ");
      for (size_t i = 0; i < ranks.size(); ++i) os << (i ? "," : "") << ranks[i];
      os << "\n";
    }
    os << "\n " << tests << " FAILED TEST" << (tests == 1 ? "" : "S") << " (on any rank)\n";
    std::cout << os.str() << std::flush;
  }

  // Everything else goes to gtest's printer as it would without this listener.
  void OnTestProgramStart(const ::testing::UnitTest& u) override {
    fwd([&](auto* p) { p->OnTestProgramStart(u); });
  }
  void OnTestIterationStart(const ::testing::UnitTest& u, int i) override {
    fwd([&](auto* p) { p->OnTestIterationStart(u, i); });
  }
  void OnEnvironmentsSetUpStart(const ::testing::UnitTest& u) override {
    fwd([&](auto* p) { p->OnEnvironmentsSetUpStart(u); });
  }
  void OnEnvironmentsSetUpEnd(const ::testing::UnitTest& u) override {
    fwd([&](auto* p) { p->OnEnvironmentsSetUpEnd(u); });
  }
  void OnTestSuiteStart(const ::testing::TestSuite& s) override {
    fwd([&](auto* p) { p->OnTestSuiteStart(s); });
  }
  void OnTestCaseStart(const ::testing::TestCase& s) override {
    fwd([&](auto* p) { p->OnTestCaseStart(s); });
  }
  void OnTestStart(const ::testing::TestInfo& t) override {
    fwd([&](auto* p) { p->OnTestStart(t); });
  }
  void OnTestDisabled(const ::testing::TestInfo& t) override {
    fwd([&](auto* p) { p->OnTestDisabled(t); });
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    fwd([&](auto* p) { p->OnTestPartResult(r); });
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    fwd([&](auto* p) { p->OnTestEnd(t); });
  }
  void OnTestSuiteEnd(const ::testing::TestSuite& s) override {
    fwd([&](auto* p) { p->OnTestSuiteEnd(s); });
  }
  void OnTestCaseEnd(const ::testing::TestCase& s) override {
    fwd([&](auto* p) { p->OnTestCaseEnd(s); });
  }
  void OnEnvironmentsTearDownStart(const ::testing::UnitTest& u) override {
    fwd([&](auto* p) { p->OnEnvironmentsTearDownStart(u); });
  }
  void OnEnvironmentsTearDownEnd(const ::testing::UnitTest& u) override {
    fwd([&](auto* p) { p->OnEnvironmentsTearDownEnd(u); });
  }
  void OnTestProgramEnd(const ::testing::UnitTest& u) override {
    fwd([&](auto* p) { p->OnTestProgramEnd(u); });
  }

 private:
  static constexpr const char* kUnexpectedMiss =
      "(a wait missed its deadline outside any ExpectedDeadlineMisses scope)";

  static std::string count(int n, const std::string& what) {
    return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
  }

  template <typename F>
  void fwd(F f) {
    if (printer_) f(printer_.get());
  }

  static std::vector<std::string> all_tests(const ::testing::UnitTest& unit) {
    std::vector<std::string> names;
    for (int i = 0; i < unit.total_test_suite_count(); ++i) {
      const auto* suite = unit.GetTestSuite(i);
      for (int j = 0; j < suite->total_test_count(); ++j)
        names.push_back(std::string(suite->name()) + "." + suite->GetTestInfo(j)->name());
    }
    return names;
  }

  static std::vector<std::string> failed_here(const ::testing::UnitTest& unit) {
    std::vector<std::string> names;
    for (int i = 0; i < unit.total_test_suite_count(); ++i) {
      const auto* suite = unit.GetTestSuite(i);
      for (int j = 0; j < suite->total_test_count(); ++j) {
        const auto* test = suite->GetTestInfo(j);
        if (test->should_run() && test->result()->Failed())
          names.push_back(std::string(suite->name()) + "." + test->name());
      }
    }
    // A failure outside any test (a global environment, a static object).
    if (unit.ad_hoc_test_result().Failed()) names.push_back("(outside any test)");
    return names;
  }

  std::unique_ptr<::testing::TestEventListener> printer_;
};

}  // namespace

int main(int argc, char** argv) {
  partita::mpi::Environment env(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  partita::testing::set_program_name(argv[0]);
  const int rank = partita::mpi::world_rank();
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  ::testing::TestEventListener* printer = listeners.Release(listeners.default_result_printer());
  if (rank != 0) {
    // One report per run: only rank 0 writes --gtest_output (the ranks would
    // otherwise write the same file at once and corrupt it). The writer is
    // set up by InitGoogleTest, so it is removed, not just the flag cleared.
    delete listeners.Release(listeners.default_xml_generator());
    delete printer;
    printer = nullptr;
    listeners.Append(new RankFailurePrinter(rank));
  }
  listeners.Append(new AgreedSummary(printer));  // rank 0's printer lives in it
  partita::testing::harness_comm();  // made now, while every rank is here (the helpers' too)
  // raw-mpi-ok: at start-up, every rank is here
  PARTITA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_end));
  MPI_Comm_set_errhandler(g_end, MPI_ERRORS_RETURN);
  listeners.Append(new BetweenTests);
  const int local = RUN_ALL_TESTS();
  const long misses = partita::mpi::deadline_misses();
  const long unexpected = misses - partita::testing::expected_deadline_misses();
  // Passed, no miss at all, no unexpected miss (the minimum over the ranks).
  int in[3] = {local == 0 ? 1 : 0, misses == 0 ? 1 : 0, unexpected == 0 ? 1 : 0}, out[3];
  std::vector<MPI_Request> req(1);
  PARTITA_MPI_CHECK(MPI_Iallreduce(in, out, 3, MPI_INT, MPI_MIN, g_end, &req[0]));
  finish_or_end(req, {}, "at the end of the run");
  if (!out[1]) {
    // Operations abandoned at a deadline could keep MPI_Finalize waiting:
    // everything is reported, so end the job here, without it. A run whose
    // tests all passed and whose every miss was expected (a test showing a
    // deadlock is caught, under testing::ExpectedDeadlineMisses) ends with
    // status 0; any other, with 1.
    out[0] = out[0] && out[2];
    std::cout << std::flush;
    std::cerr << std::flush;
    if (rank == 0)
      std::cerr << "partita: a wait missed its deadline in this run; ending the job without "
                   "MPI_Finalize"
                << (out[0] ? " (every test passed, every miss expected)"
                    : out[2] ? "" : " (a miss no test expected: the run fails)")
                << std::endl;
    // One rank ends the job (ranks leaving one by one without MPI_Finalize
    // race the launcher, which may kill the rest with a signal); the others
    // wait to be ended with it. First a pause: MPICH's launcher can end the
    // job on MPI_Abort before it has forwarded what the ranks printed last
    // (the summary above: death_one_sided_InLayer_np2 lost it in one run).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (!out[0] || rank == 0) MPI_Abort(MPI_COMM_WORLD, out[0] ? 0 : 1);
    for (;;) pause();
  }
  // No miss on any rank: every operation on the test main's communicators
  // finished, so they are freed before MPI_Finalize (made by MPI, they would
  // otherwise be alive at exit: LeakSanitizer reports them).
  PARTITA_MPI_CHECK(MPI_Comm_free(&g_end));
  partita::testing::detail::free_harness_comms();
  return out[0] ? 0 : 1;
}
