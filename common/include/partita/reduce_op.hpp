// Reduction operations of the differentiable communicator (seed 003,
// mpi4torch's MPI_SUM ... MPI_BXOR), shared by the reference and the MPI
// implementation. Header-only, no LibTorch and no MPI.
#pragma once

#include <string>

namespace partita {

enum class ReduceOp { kSum, kProd, kMax, kMin, kLand, kLor, kLxor, kBand, kBor, kBxor };

inline const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "SUM";
    case ReduceOp::kProd: return "PROD";
    case ReduceOp::kMax: return "MAX";
    case ReduceOp::kMin: return "MIN";
    case ReduceOp::kLand: return "LAND";
    case ReduceOp::kLor: return "LOR";
    case ReduceOp::kLxor: return "LXOR";
    case ReduceOp::kBand: return "BAND";
    case ReduceOp::kBor: return "BOR";
    case ReduceOp::kBxor: return "BXOR";
  }
  return "?";
}

// The logical and bitwise operations are defined on integer and boolean
// tensors only (as in MPI); SUM, PROD, MAX and MIN on every supported dtype.
inline bool op_needs_integers(ReduceOp op) {
  return op == ReduceOp::kLand || op == ReduceOp::kLor || op == ReduceOp::kLxor ||
         op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
}

// Only SUM has an adjoint (a sum's adjoint is a broadcast of the
// cotangent). MAX and MIN are not differentiable where ranks tie and PROD's
// adjoint needs the other ranks' factors; backward through them raises.
inline bool op_has_adjoint(ReduceOp op) { return op == ReduceOp::kSum; }

}  // namespace partita
