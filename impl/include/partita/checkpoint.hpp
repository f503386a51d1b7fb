// Checkpoints of global tensors held in pieces (docs/checkpoints.md).
//
// A checkpoint is a directory: one safetensors file of *global* tensors
// (model.safetensors), written by every rank in parallel through MPI-IO,
// and a JSON manifest (manifest.json). Each rank passes its pieces as
// Shards: a name, the global shape, and where its block sits in it. Saving
// writes each block once (ranks holding the same block: the lowest writes
// it); loading reads each rank's own blocks, whatever layout saved them.
//
//   auto P = mpi::Partition::world().create_cartesian_topology_partition({2, 1});
//   at::Tensor mine = partita::distribute(global, P);
//   checkpoint::save("ckpt/step-10", {checkpoint::block("w", mine, {8, 3}, P)});
//   checkpoint::load("ckpt/step-10", {checkpoint::block("w", mine, {8, 3}, P)});
//
// Both are collective over the world (every rank calls, with its own
// shards, possibly none) and raise the same CheckpointError on every rank
// when anything is wrong; a save is atomic (the directory appears complete
// or not at all) and a load checks every name, shape, dtype and size before
// it reads any data into the caller's tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "partita/errors.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/shape.hpp"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace partita {

// A checkpoint that cannot be written or read as asked: the message names
// the directory and the first problem; the same on every rank.
struct CheckpointError : Error {
  using Error::Error;
};

namespace checkpoint {

// One rank's piece of a global tensor: `local` is the box of the global
// tensor of shape `global` that starts at `start` and has local's sizes
// (as many dimensions as `global`). A zero-volume or undefined `local`
// holds nothing. On load, `local` receives the box in place: it must have
// the checkpoint's dtype.
struct Shard {
  std::string name;
  at::Tensor local;
  Shape global;
  Shape start;
};

// The whole tensor, held the same by every rank that passes it.
Shard whole(std::string name, const at::Tensor& t);
// This worker's balanced block of a tensor of shape `global` partitioned
// over P (partita::distribute's block); a worker outside P holds nothing.
Shard block(std::string name, const at::Tensor& local, const Shape& global, const mpi::Partition& P);

// What a checkpoint carries besides its tensors.
struct Info {
  // Named integers: the step, the position in the data, RNG counters.
  std::map<std::string, int64_t> counters;
  // How the run was laid out when it saved (free text, for people).
  std::string layout;
};

// The format version this build writes and the only one it reads.
inline constexpr int kFormatVersion = 1;

// Writes `dir`, which must not exist: first as `dir`.partial-HOST-PID (one
// that a killed save of this host left is removed once its process is
// gone), then, after every rank's data is on disk, renamed to `dir` in one
// step that replaces nothing there (RENAME_NOREPLACE; where the file
// system lacks it, rename(2), which would replace an empty directory).
// Every name's pieces must agree on dtype and global shape, lie inside it,
// and cover it exactly (identical blocks on several ranks are written
// once; blocks that overlap otherwise are refused). Collective over the
// world.
void save(const std::string& dir, const std::vector<Shard>& shards, const Info& info = {});

struct LoadOptions {
  // Allow names in the checkpoint that no rank asks for: any (`partial`),
  // or those that begin with `unread_prefix` (a model's parameters without
  // its "optimizer." state).
  bool partial = false;
  std::string unread_prefix;
};

// Reads each shard's box of its tensor into `local`. Raises before writing
// anything when a name is missing from the checkpoint (or, unless
// `partial`, the checkpoint has a name no rank asked for), a dtype or a
// global shape differs (never a cast), a box is outside the tensor, or the
// directory, manifest or file is missing, truncated or inconsistent.
// Returns the checkpoint's Info. Collective over the world.
Info load(const std::string& dir, const std::vector<Shard>& shards, const LoadOptions& options = {});

// A checkpoint's tensors: name, safetensors dtype ("F64") and global
// shape, in file order; with its Info. Collective over the world (rank 0
// reads), the same on every rank.
struct Contents {
  struct Tensor {
    std::string name, dtype;
    Shape shape;
  };
  std::vector<Tensor> tensors;
  Info info;
  int saved_by = 0;  // the world size that saved it
};
Contents contents(const std::string& dir);

// Modules (docs/checkpoints.md, "What a module saves"). Each parameter and
// buffer under its name in the module (prefixed with its root's name): the
// global tensor, of which partita's distributed Linear layers and
// vocabulary-parallel embeddings hold their blocks and every other module
// its whole tensor (the same on every rank that holds it). A tensor shared
// by two modules is saved once, under its first name.
using NamedModules = std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>;
std::vector<Shard> module_shards(const NamedModules& roots);
// save() of module_shards(roots), and, with an optimizer (LibTorch's SGD,
// Adam or AdamW), its state of those parameters: "optimizer." + name +
// ".exp_avg", ".exp_avg_sq" (".max_exp_avg_sq" with amsgrad) and ".step",
// or ".momentum_buffer", blocks of the parameter's global shape. Each
// nn::SeededDropout's count of calls is the counter "rng." + name +
// ".calls", its seed "rng." + name + ".seed" (the 64 bits as an int64;
// a checkpoint without it leaves the seed as built). Counters are merged over the ranks (a name with two values is
// refused).
void save_modules(const std::string& dir, const NamedModules& roots, torch::optim::Optimizer* optimizer = nullptr,
                  Info info = {});
// The inverse: every parameter, the optimizer's state where the checkpoint
// has some (a parameter without state in the checkpoint has none after
// the load), the dropout counts. Without an optimizer the checkpoint's
// optimizer state is left unread.
Info load_modules(const std::string& dir, const NamedModules& roots, torch::optim::Optimizer* optimizer = nullptr);
// One module, its names unprefixed (a plain torch::nn model or one of
// partita's layers on every rank).
void save(const std::string& dir, const std::shared_ptr<torch::nn::Module>& module,
          torch::optim::Optimizer* optimizer = nullptr, const Info& info = {});
Info load(const std::string& dir, const std::shared_ptr<torch::nn::Module>& module,
          torch::optim::Optimizer* optimizer = nullptr);

}  // namespace checkpoint
}  // namespace partita
