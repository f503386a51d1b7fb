// main() of every MPI GoogleTest binary: MPI up, one gtest run per rank with
// only rank 0 printing the progress (other ranks print their failures, each
// line tagged with the rank), and one exit code agreed by all ranks.
#include <gtest/gtest.h>

#include <unistd.h>

#include <iostream>

#include "partita/testing/lockstep.hpp"
#include "partita/mpi/runtime.hpp"

namespace {

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

// Deadline mode: a test in which some rank missed a deadline leaves stale
// operations on partita's world communicator; every rank renews it before
// the next test (the ranks run the same tests in the same order).
class RenewAfterMissedDeadline : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo&) override {
    if (partita::mpi::deadline() <= 0) return;
    const long now = partita::mpi::deadline_misses();
    int clean = now == seen_ ? 1 : 0, all_clean = 0;
    seen_ = now;
    MPI_Allreduce(&clean, &all_clean, 1, MPI_INT, MPI_MIN, partita::testing::harness_comm());
    if (!all_clean) partita::mpi::renew_world();
  }

 private:
  long seen_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  partita::mpi::Environment env(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  partita::testing::set_program_name(argv[0]);
  const int rank = partita::mpi::world_rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    // One report per run: only rank 0 writes --gtest_output (the ranks would
    // otherwise write the same file at once and corrupt it). The writer is
    // set up by InitGoogleTest, so it is removed, not just the flag cleared.
    delete listeners.Release(listeners.default_xml_generator());
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  partita::testing::harness_comm();  // made now, while every rank is here
  ::testing::UnitTest::GetInstance()->listeners().Append(new RenewAfterMissedDeadline);
  const int local = RUN_ALL_TESTS();
  const long misses = partita::mpi::deadline_misses();
  const long unexpected = misses - partita::testing::expected_deadline_misses();
  // Passed, no miss at all, no unexpected miss (the minimum over the ranks).
  int in[3] = {local == 0 ? 1 : 0, misses == 0 ? 1 : 0, unexpected == 0 ? 1 : 0}, out[3];
  MPI_Allreduce(in, out, 3, MPI_INT, MPI_MIN, partita::testing::harness_comm());
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
    // wait to be ended with it.
    if (!out[0] || rank == 0) MPI_Abort(MPI_COMM_WORLD, out[0] ? 0 : 1);
    for (;;) pause();
  }
  return out[0] ? 0 : 1;
}
