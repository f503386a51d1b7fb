// One entry per primitive and layer a Case can name: what the case runner
// runs on each side (the reference on every worker's input, the MPI layer
// on this rank's), how its results compare, and what `partita explain` and
// the benchmarks say about it. Adding a primitive to partita is adding an
// entry (testing/src/primitive_table.cpp).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "partita/testing/case.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/reference/linear.hpp"
#include "partita/reference/partition.hpp"
#include "partita/reference/tensors.hpp"

namespace partita::nn {
class DistributedLinearBase;
}

namespace partita::testing {

// What one case gives its entry: the case, partitions made from its specs
// on either side, and for the Linear layers the global parameters (drawn
// once, the same on every rank).
struct CaseContext {
  using RefParts = std::function<reference::Partition(const PartitionSpec&)>;
  using MpiParts = std::function<mpi::Partition(const PartitionSpec&)>;
  CaseContext(const Case& c, RefParts rpart, MpiParts mpart)
      : c(c), rpart(std::move(rpart)), mpart(std::move(mpart)) {}
  const Case& c;
  RefParts rpart;
  MpiParts mpart;
  // The Linear layers: in features, W and b as drawn (W0, b0), the
  // reference's leaves (Wr, br, whose gradients the reference computes)
  // and the reference layer (its parameter blocks are checked).
  int64_t in = 0;
  at::Tensor W0, b0, Wr, br;
  reference::LinearLayer rlayer;
};

// An MPI layer built for one case (collectively, on every rank).
struct MpiLayer {
  std::function<at::Tensor(const at::Tensor&)> call;
  // The in-place forms: the tensor the last call filled (its output must be
  // that storage).
  std::shared_ptr<at::Tensor> written;
  // The Linear layers: the module (its stored blocks are checked).
  std::shared_ptr<nn::DistributedLinearBase> linear;
};

// How a forward result is compared with the reference's. Copies are
// bit-identical in any dtype; sums are bit-identical for integer fills and
// within the dtype's precision for normal ones (MPI adds in another order).
enum class Moves { kCopies, kSums };

// What `partita explain <command>` shows for a primitive.
enum class ExplainView {
  kNone,          // no view yet
  kTeams,         // seed 000's P_send/P_recv tables (broadcast, sum-reduce)
  kAllReduction,  // the sub-partitions reduced over
  kRepartition,   // who sends what to whom
};

struct PrimitiveEntry {
  std::string name;     // Case::primitive
  std::string adjoint;  // the primitive its backward is ("" for the layers)
  Moves forward = Moves::kCopies;
  // The backward compared bit for bit even for normal fills (the adjoint
  // only moves values); otherwise as `forward == kSums` is.
  bool exact_backward = false;
  bool linear = false;  // one of seed 002's layers (W and b are checked too)
  // partita explain: its subcommand and what the help says of it.
  std::string explain_command;
  ExplainView explain = ExplainView::kNone;
  std::string explain_help;
  // The benchmarks: the raw MPI calls that move the same bytes as the
  // forward (`<name>_fwd`) and as forward then backward (`<name>_fwdbwd`).
  std::string twin_fwd, twin_fwdbwd;
  // The reference forward: every worker's output from every worker's input.
  std::function<reference::Tensors(CaseContext&, const reference::Tensors&)> reference;
  // The MPI layer, built on every rank.
  std::function<MpiLayer(CaseContext&)> mpi;
};

// Every entry, in the order the Case documents them.
const std::vector<PrimitiveEntry>& primitive_table();
// The entry of Case::primitive `name`; throws partita::Error when none.
const PrimitiveEntry& primitive_entry(const std::string& name);

}  // namespace partita::testing
