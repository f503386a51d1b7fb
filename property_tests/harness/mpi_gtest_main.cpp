// main() of every MPI GoogleTest binary: MPI up, one gtest run per rank with
// only rank 0 printing the progress (other ranks print their failures, each
// line tagged with the rank), and one exit code agreed by all ranks.
#include <gtest/gtest.h>

#include <iostream>

#include "lockstep.hpp"
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
  const int local = RUN_ALL_TESTS();
  const bool all_ok = partita::mpi::all_true(local == 0, partita::mpi::world_comm());
  return all_ok ? 0 : 1;
}
