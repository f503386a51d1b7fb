// Options of the broadcast and reduction layers (seed 001), with its
// defaults. Shared vocabulary of the reference and the MPI implementation.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "partita/arg.hpp"

namespace partita {

// Static shapes (docs/static-shapes.md): when the ranks of a layer agree
// on their inputs' shapes. kPerCall (the default): on every call, one small
// collective exchange of every rank's shape, dtype and requires_grad before
// the data moves, so that bad input raises on every rank. kStatic: the
// caller promises that every later call passes, on every rank, a tensor of
// the shape, dtype and requires_grad of its first call; the first call
// agrees and checks as kPerCall does, later calls skip the exchange and
// reuse the first call's plan. Each rank still compares its own input with
// its own first one (no communication): a broken promise raises ShapeError
// (rule input.static_shapes) on the ranks whose input changed, before
// anything is posted; the other ranks are then left waiting in the data's
// collective (deadline mode or the launcher's timeout ends it). With
// PARTITA_CHECK_STATIC_SHAPES=1 every call exchanges again and a broken
// promise raises on every rank. Every rank must construct the layer with
// the same choice (the first call raises PartitionError on every rank
// otherwise).
enum class Shapes { kPerCall, kStatic };

// Set in LibTorch's style: Options().preserve_batch(false).shapes(Shapes::kStatic).
struct Options {
  // Reverse P_x's shape before applying the rules (the tensor is unchanged).
  PARTITA_ARG(bool, transpose_src) = false;
  // Reverse P_y's shape before padding it (seed 001, note to example 8).
  PARTITA_ARG(bool, transpose_dest) = false;
  // Zero-volume outputs keep the input's first dimension: {batch, 0}.
  PARTITA_ARG(bool, preserve_batch) = true;
  // Per-call agreement or static shapes (above).
  PARTITA_ARG(Shapes, shapes) = Shapes::kPerCall;
};

// DistDL's parameters of AllGather and ReduceScatter: the
// partition dimensions acted on (`axes`: DistDL's axes_all_gather or
// axes_reduce_scatter) or their complement (`axes_keep`), exactly one of the
// two; the tensor dimension gathered or scattered along partition dimension
// d is d. `scale_backward` (AllGather only): partition dimensions whose
// extents divide the gradient in backward (the product of P_x's extents
// along them; empty: no scaling). partita's general form, one partition
// dimension `axis` with any tensor dimension `dim`, is the other constructor.
// Set in LibTorch's style: GatherAxes().axes({0}), GatherAxes().axes_keep({1}).
struct GatherAxes {
  // The dimensions acted on, or (axes_keep) their complement: set means
  // given, so each setter takes the list itself.
  GatherAxes& axes(std::vector<int> dims) {
    axes_ = std::move(dims);
    return *this;
  }
  const std::optional<std::vector<int>>& axes() const noexcept { return axes_; }
  GatherAxes& axes_keep(std::vector<int> dims) {
    axes_keep_ = std::move(dims);
    return *this;
  }
  const std::optional<std::vector<int>>& axes_keep() const noexcept { return axes_keep_; }
  PARTITA_ARG(std::vector<int>, scale_backward);

 private:
  std::optional<std::vector<int>> axes_, axes_keep_;
};

}  // namespace partita
