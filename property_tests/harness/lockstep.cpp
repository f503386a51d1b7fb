#include "lockstep.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <iostream>

#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"

namespace partita::testing {

namespace {
std::string g_program = "<test binary>";

std::string current_test_filter() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (!info) return "";
  return std::string(info->test_suite_name()) + "." + info->name();
}
}  // namespace

void set_program_name(const std::string& argv0) { g_program = argv0; }

LockstepParams lockstep_params() {
  // configuration() parses RC_PARAMS; without a seed RapidCheck draws a
  // random one per process, so only rank 0's counts.
  const auto& config = rc::detail::configuration();
  uint64_t p[3] = {config.testParams.seed,
                   static_cast<uint64_t>(config.testParams.maxSuccess),
                   static_cast<uint64_t>(config.testParams.maxSize)};
  if (const char* n = std::getenv("PARTITA_PROP_CASES")) p[1] = std::strtoull(n, nullptr, 10);
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Ibcast(p, 3, MPI_UINT64_T, 0, mpi::world_comm(), &req));
  mpi::wait(req, "lockstep_params");
  return {p[0], static_cast<int>(p[1]), static_cast<int>(p[2])};
}

bool check_lockstep_impl(const std::string& name,
                         const std::function<void(Verdict&)>& draw_and_run,
                         std::string* report) {
  const LockstepParams lp = lockstep_params();
  const mpi::Partition world = mpi::Partition::world();
  auto property = rc::detail::toProperty([&] {
    Verdict v;
    draw_and_run(v);
    if (mpi::all_true(v.ok(), mpi::world_comm())) return;
    // Everyone learns what every failing rank saw, so the failure text (and
    // with it RapidCheck's choice of shrink) is the same on all ranks.
    const auto all = world.allgather_data(v.ok() ? std::string() : v.message());
    std::string text;
    for (size_t r = 0; r < all.size(); ++r)
      if (!all[r].empty()) text += "\n  rank " + std::to_string(r) + ": " + all[r];
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
  os << "\nreplay: RC_PARAMS=\"seed=" << lp.seed << " max_success=" << lp.max_success
     << " max_size=" << lp.max_size << "\" mpiexec.mpich -n " << mpi::world_size() << " "
     << g_program << " --gtest_filter=" << current_test_filter() << "\n";
  if (report) *report = os.str();
  if (mpi::world_rank() == 0) std::cerr << os.str() << std::flush;
  return false;
}

}  // namespace partita::testing
