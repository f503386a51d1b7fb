// Error types shared by the reference and the MPI implementation.
//
// Every error partita raises derives from partita::Error, so a caller can
// catch one type. The message always names the operation and the inputs
// that were wrong, because in a distributed run the same exception is raised
// on every rank involved and the first line of the log must be enough.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace partita {

// The rule an error reports as broken: a short, stable code that
// the reference and the MPI implementation attach on their own, so that a
// test can check that both reject a case for the same reason and not only
// with the same class. docs/testing.md lists them. An empty code: no rule
// of a layer or partition (an MPI failure, a missed deadline, a bad file).
namespace rule_code {
// PartitionError: partitions and arguments.
inline constexpr const char* kWorkerRange = "partition.worker_range";  // worker or rank outside
inline constexpr const char* kWorkerRepeated = "partition.worker_repeated";
inline constexpr const char* kEmptyTeam = "partition.empty";
inline constexpr const char* kShapeVolume = "partition.shape_volume";  // shape does not fit the team
inline constexpr const char* kAxisRange = "partition.axis_range";      // axes / remain flags
inline constexpr const char* kRootRange = "partition.root_range";      // broadcast_data's root
inline constexpr const char* kNullPartition = "partition.null";
inline constexpr const char* kArgumentsDiffer = "partition.arguments_differ";  // ranks disagree
inline constexpr const char* kPlanDiffers = "partition.plan_differs";  // checked mode
inline constexpr const char* kBroadcastDims = "broadcast.dims";    // dim(P_x) > dim(P_y)
inline constexpr const char* kBroadcastShape = "broadcast.shape";  // P_x neither 1 nor P_y's
inline constexpr const char* kReductionDims = "reduction.dims";    // dim(P_y) > dim(P_x)
inline constexpr const char* kReductionShape = "reduction.shape";  // P_y neither 1 nor P_x's
inline constexpr const char* kGatherAxesChoice = "gather.axes_choice";  // not exactly one given
inline constexpr const char* kGatherAxesRange = "gather.axes_range";    // out of range or repeated
inline constexpr const char* kGatherNegativeDim = "gather.negative_dim";
inline constexpr const char* kScaleBackward = "reduce_scatter.scale_backward";
inline constexpr const char* kHaloWidths = "halo.widths";  // negative, or left/right lengths differ
inline constexpr const char* kLinearLayout = "linear.layout";
// ShapeError: tensors that disagree with the partitions.
inline constexpr const char* kTooManyDims = "input.too_many_dims";
inline constexpr const char* kOutsideNotEmpty = "input.outside_not_empty";
inline constexpr const char* kDtypeUnsupported = "input.dtype_unsupported";
inline constexpr const char* kDtypeMismatch = "input.dtype_mismatch";
inline constexpr const char* kTeamShapes = "team.shapes";  // a team's inputs may not differ so
inline constexpr const char* kMissingDim = "input.missing_dim";  // no tensor dimension `dim`
inline constexpr const char* kTilingDims = "tiling.dims";  // too few or mismatched dimensions
inline constexpr const char* kTilingUneven = "tiling.uneven";  // the pieces do not tile a tensor
inline constexpr const char* kHaloWidthCount = "halo.width_count";  // widths vs tensor dims
inline constexpr const char* kHaloWindowSmall = "halo.window_small";
inline constexpr const char* kHaloGhostWider = "halo.ghost_wider";  // than the neighbour's bulk
inline constexpr const char* kLinearInput = "linear.input";
inline constexpr const char* kLinearParameters = "linear.parameters";
inline constexpr const char* kCountOverflow = "input.count_overflow";  // more than INT_MAX
inline constexpr const char* kStaticShapes = "input.static_shapes";  // a static-shapes promise broken
inline constexpr const char* kMessageSize = "input.message_size";  // a receive's tensor vs its message
inline constexpr const char* kInPlaceLeaf = "input.in_place_leaf";  // in-place call on a leaf requiring grad
// an in-place call on an inference tensor outside InferenceMode, or on a
// view autograd cannot rebase
inline constexpr const char* kInPlaceRefused = "input.in_place_refused";
inline constexpr const char* kOutTensor = "input.out_tensor";  // an out= call's out refused
inline constexpr const char* kGradMode = "input.grad_mode";  // grad wanted on one rank, grad mode off on another
}  // namespace rule_code

struct Error : std::runtime_error {
  explicit Error(const std::string& what, std::string rule = {})
      : std::runtime_error(what), rule_(std::move(rule)) {}
  // The broken rule's code (partita::rule_code), empty when there is none.
  const std::string& rule() const { return rule_; }

 private:
  std::string rule_;
};

// Partitions that break the broadcast/reduction rules, bad worker lists,
// shapes whose volume does not match the team, inconsistent arguments.
struct PartitionError : Error {
  using Error::Error;
};

// Tensors or shapes that disagree with the partitions.
struct ShapeError : Error {
  using Error::Error;
};

// A wait did not finish within the deadline (PARTITA_DEADLINE):
// the ranks disagree about a plan or one of them is stuck. Only raised in
// deadline mode; the world communicator must be renewed before partita
// communicates again (mpi::renew_world, done by the test harness).
struct DeadlineError : Error {
  using Error::Error;
};

// A case file (or case JSON) that is not valid JSON, or whose fields have the
// wrong type or value. The message names the file, the field and what was
// expected; `partita run` exits 2 for it (a conformance failure exits 1).
struct CaseError : Error {
  using Error::Error;
};

// An MPI call returned an error code.
struct MpiError : Error {
  MpiError(const std::string& what, int code) : Error(what), code(code) {}
  int code;
};

}  // namespace partita
