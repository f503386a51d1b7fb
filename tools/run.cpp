#include "run.hpp"

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "case_runner.hpp"
#include "partita/errors.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"

namespace partita::tools {

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

}  // namespace

int run(const std::vector<std::string>& args, int* argc, char*** argv) {
  std::string file, save_dir;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--save" && i + 1 < args.size()) save_dir = args[++i];
    else if (file.empty() && args[i].rfind("--", 0) != 0) file = args[i];
    else {
      std::cerr << "usage: mpiexec -n N partita run CASE.json [--save DIR]\n";
      return 2;
    }
  }
  if (file.empty()) {
    std::cerr << "usage: mpiexec -n N partita run CASE.json [--save DIR]\n";
    return 2;
  }
  mpi::Environment env(argc, argv);
  torch::set_num_threads(1);  // one rank per core: do not fight over them
  const int rank = mpi::world_rank();
  std::string line;
  bool ok = false;
  try {
    std::ifstream in(file);
    if (!in) throw Error("cannot read " + file);
    std::stringstream text;
    text << in.rdbuf();
    const Case c = Case::parse(text.str());
    const CaseOutcome o = run_case(c);
    if (!save_dir.empty()) save(save_dir, rank, o);
    ok = o.ok;
    line = std::string(o.ok ? "PASS " : "FAIL ") + c.primitive + ": " + o.summary;
  } catch (const std::exception& e) {
    line = std::string("ERROR ") + e.what();
  }
  const auto lines = mpi::Partition::world().allgather_data(line);
  if (rank == 0)
    for (size_t r = 0; r < lines.size(); ++r) std::cout << "rank " << r << ": " << lines[r] << "\n";
  std::cout << std::flush;
  return mpi::all_true(ok, mpi::world_comm()) ? 0 : 1;
}

}  // namespace partita::tools
