// A fresh directory every rank of the world knows (rank 0 makes it under
// $TMPDIR or /tmp), removed when the test ends.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "partita/mpi/runtime.hpp"

namespace partita::spec {

// Every rank of the world waits for every other (under partita's waiting
// policy and deadline, as a test's waits must be).
inline void barrier() { (void)mpi::all_true(true, mpi::world_comm()); }

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
    barrier();
    if (mpi::world_rank() == 0) std::filesystem::remove_all(path);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

}  // namespace partita::spec
