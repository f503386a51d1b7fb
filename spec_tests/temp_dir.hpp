// A fresh directory every rank of the world knows (rank 0 makes it under
// $TMPDIR or /tmp), removed when the test ends.
#pragma once

#include <mpi.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "partita/mpi/runtime.hpp"

namespace partita::spec {

struct TempDir {
  std::string path;
  TempDir() {
    std::string mine;
    if (mpi::world_rank() == 0) {
      const char* base = std::getenv("TMPDIR");
      std::string pattern = std::string(base && *base ? base : "/tmp") + "/partita-test-XXXXXX";
      if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
      mine = pattern;
    }
    path = mpi::allgather_strings(mine, mpi::world_comm())[0];
  }
  ~TempDir() {
    MPI_Barrier(mpi::world_comm());
    if (mpi::world_rank() == 0) std::filesystem::remove_all(path);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

}  // namespace partita::spec
