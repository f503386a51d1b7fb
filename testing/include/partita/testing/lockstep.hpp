// The lockstep property harness: RapidCheck under mpirun.
//
// Every rank draws the same case (one seed, chosen on rank 0 and broadcast),
// decides its own verdict locally, and the verdicts are agreed with a
// logical AND over the world before RapidCheck sees them, so that every rank
// passes, fails and shrinks in step. A rank never leaves a case early: an
// exception in the body is caught and becomes that rank's failure.
//
// On failure rank 0 prints the seed, the shrunk case (the case type's
// operator<<, which should print a repro line), what each failing rank saw,
// and the command that replays the run. The first failing case is printed
// at once, before shrinking starts.
//
// Deadline mode: the harness agrees on its own communicator, not
// on partita's. A case in which some wait missed its deadline (a
// partita::DeadlineError: ranks disagreeing about a plan) fails like any
// other, every rank prints what it was stuck in, and partita's world
// communicator is renewed before the next case. If the harness's own
// agreement cannot finish (a rank stuck where no deadline reaches), every
// rank that can prints the case, the seed and the replay line, and the job
// is aborted.
#pragma once

#include <mpi.h>
#include <rapidcheck.h>

#include <functional>
#include <sstream>
#include <string>

namespace partita::testing {

// What one rank found in one case.
class Verdict {
 public:
  // Records a failure unless `ok`; returns `ok` so checks can be chained.
  bool expect(bool ok, const std::string& what) {
    if (!ok) fail(what);
    return ok;
  }
  // Records `problem` as a failure unless it is empty (the checks of
  // checks.hpp return "" or what differed).
  bool expect_empty(const std::string& problem) {
    if (!problem.empty()) fail(problem);
    return problem.empty();
  }
  void fail(const std::string& what) {
    ok_ = false;
    if (!message_.empty()) message_ += "; ";
    message_ += what;
  }
  bool ok() const { return ok_; }
  const std::string& message() const { return message_; }

 private:
  bool ok_ = true;
  std::string message_;
};

// Seed, case count and size, identical on every rank.
struct LockstepParams {
  uint64_t seed = 0;
  int max_success = 100;
  int max_size = 100;
};

// Reads RC_PARAMS (seed, max_success, max_size) on rank 0 and broadcasts it;
// PARTITA_PROP_CASES (1 to 10^9) sets max_success unless RC_PARAMS names it
// (a replay line does); another value throws std::invalid_argument.
LockstepParams lockstep_params();

// argv[0] and the gtest test name go into the replay command.
void set_program_name(const std::string& argv0);

// The case being run, as its repro line (set before each case's body).
void set_current_case(const std::string& repro);

// A test that means to make a wait miss its deadline (to show a deadlock is
// caught) says so for its scope: the waits missed while one of these lives
// are expected. At the end of the run main() ends a job with missed
// deadlines without MPI_Finalize (abandoned operations could keep it
// waiting), with status 0 only when every test passed and every miss was
// expected; an unexpected miss fails the run even if the tests passed (an
// EXPECT_THROW that caught a DeadlineError instead of the error it meant).
class ExpectedDeadlineMisses {
 public:
  ExpectedDeadlineMisses();
  ~ExpectedDeadlineMisses();
  ExpectedDeadlineMisses(const ExpectedDeadlineMisses&) = delete;
  ExpectedDeadlineMisses& operator=(const ExpectedDeadlineMisses&) = delete;

 private:
  long at_start_;
};
// How many missed deadlines were expected so far (main()).
long expected_deadline_misses();

// The harness's own duplicate of MPI_COMM_WORLD (made on first use, which
// every rank reaches at once: lockstep_params, or main()).
MPI_Comm harness_comm();

// Runs the property: `body` is called on every rank with the same case.
// Returns true when all cases passed (the same answer on every rank); on
// failure the report is printed on rank 0 and `report` holds it.
// `seed_offset` is added to the seed (another round of cases from the same
// run's seed; the replay line names the seed the round used).
bool check_lockstep_impl(const std::string& name,
                         const std::function<void(Verdict&)>& draw_and_run,
                         std::string* report, uint64_t seed_offset = 0);

template <typename Case>
bool check_lockstep(const std::string& name, rc::Gen<Case> gen,
                    std::function<void(const Case&, Verdict&)> body,
                    std::string* report = nullptr, uint64_t seed_offset = 0) {
  return check_lockstep_impl(
      name,
      [gen, body](Verdict& v) {
        const Case c = *gen;
        std::ostringstream repro;
        repro << c;
        set_current_case(repro.str());
        try {
          body(c, v);
        } catch (const std::exception& e) {
          v.fail(std::string("exception: ") + e.what());
        } catch (const rc::detail::CaseResult& r) {
          // RapidCheck's RC_ macros throw these: a rank alone would shrink
          // or discard while the others wait. A failure is this rank's;
          // nothing else is the lockstep's to decide.
          if (r.type == rc::detail::CaseResult::Type::Failure)
            v.fail("RC_ASSERT or RC_FAIL: " + r.description);
          else if (r.type == rc::detail::CaseResult::Type::Discard)
            v.fail("RC_PRE or RC_DISCARD cannot discard a case in lockstep (every rank would have to): " +
                   r.description);
        } catch (...) {
          v.fail("an exception that is not a std::exception");
        }
      },
      report, seed_offset);
}

}  // namespace partita::testing
