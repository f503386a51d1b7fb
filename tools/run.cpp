#include "run.hpp"

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "partita/testing/case_runner.hpp"
#include "partita/cli.hpp"
#include "partita/errors.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"

namespace partita::tools {
using testing::Case;
using testing::CaseOutcome;
using testing::run_case;

namespace {

void save(const std::string& dir, int rank, const CaseOutcome& o) {
  c10::Dict<std::string, at::Tensor> d;
  auto plain = [](const at::Tensor& t) { return t.defined() ? t.detach().clone() : at::Tensor(); };
  d.insert("x", plain(o.x));
  d.insert("y", plain(o.y).defined() ? plain(o.y) : at::empty({0}));
  d.insert("dx", plain(o.dx).defined() ? plain(o.dx) : at::empty({0}));
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(d));
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/rank" + std::to_string(rank) + ".pt";
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw Error("cannot write " + path);
}

std::string one_line(const std::string& what) { return what.substr(0, what.find('\n')); }

int run(const std::string& file, const std::string& save_dir, int* argc, char*** argv) {
  mpi::Environment env(argc, argv);
  torch::set_num_threads(1);  // one rank per core: do not fight over them
  const int rank = mpi::world_rank();
  // A stuck wait fails the case within seconds (issue 18): the report goes
  // over a communicator of its own, which stale operations cannot reach.
  if (mpi::deadline() <= 0) mpi::set_deadline(mpi::scaled_for_ranks(10));
  MPI_Comm report = MPI_COMM_NULL;
  PARTITA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &report));
  std::string line;
  bool ok = false;
  bool case_file_ok = true;
  try {
    // Every rank reads the file, so every rank reports a bad one.
    const Case c = Case::load(file);
    const CaseOutcome o = run_case(c);
    if (!save_dir.empty()) save(save_dir, rank, o);
    ok = o.ok;
    line = std::string(o.ok ? "PASS " : "FAIL ") + c.primitive + ": " + o.summary;
  } catch (const CaseError& e) {
    case_file_ok = false;
    line = std::string("ERROR ") + e.what();
  } catch (const c10::Error& e) {
    // LibTorch's what() carries a C++ stack trace: the user gets its first line.
    line = std::string("ERROR LibTorch: ") + one_line(e.what_without_backtrace());
  } catch (const std::exception& e) {
    line = std::string("ERROR ") + one_line(e.what());
  }
  const bool missed = mpi::deadline_misses() > 0;
  if (missed)  // said at once by this rank, in case the report below cannot finish
    std::cerr << "rank " << rank << ": " << line << "\n  case file: " << file
              << "\n  replay: mpiexec.mpich -n " << mpi::world_size() << " partita run " << file
              << std::endl;
  const auto lines = mpi::allgather_strings(line, report);
  if (rank == 0)
    for (size_t r = 0; r < lines.size(); ++r) std::cout << "rank " << r << ": " << lines[r] << "\n";
  std::cout << std::flush;
  // 2: the case file is wrong (not the implementation); 1: a failure.
  const bool case_files_ok = mpi::all_true(case_file_ok, report);
  const bool all_ok = mpi::all_true(ok && !missed, report);
  if (!mpi::all_true(!missed, report)) MPI_Abort(MPI_COMM_WORLD, 1);  // stale operations
  MPI_Comm_free(&report);
  if (!case_files_ok) return 2;
  return all_ok ? 0 : 1;
}

}  // namespace

void add_run(CLI::App& app, std::function<int()>& action, int* argc, char*** argv) {
  struct Given {
    std::string file, save_dir;
  };
  auto g = std::make_shared<Given>();
  CLI::App* c = app.add_subcommand(
      "run", "(under mpiexec) run one case file against the reference; one verdict line per rank "
             "(exit status 1 on a mismatch, 2 when the case file is wrong)");
  c->add_option("case", g->file, "the case file (JSON, docs/primitives.md)")->required();
  c->add_option("--save", g->save_dir, "write each rank's x, y and dx to DIR/rank<r>.pt");
  c->callback([g, &action, argc, argv] {
    action = [g, argc, argv] { return run(g->file, g->save_dir, argc, argv); };
  });
}

}  // namespace partita::tools
