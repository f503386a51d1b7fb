// Internal: the header board (docs/mpi-runtime.md, "The header board").
// The layers' per-call header exchange (exchange_headers) and the
// communicator's record exchange (exchange_records) are allgathers of one
// to two hundred bytes per rank; when every rank of a communicator runs on one
// node it goes through a small shared-memory segment instead of MPI: each
// rank writes its header into its own slot and reads everyone else's, with
// no MPI call. MPICH's MPI_Allgather of the same bytes costs about 2,600
// instructions per call at 2 ranks, dominated by its layers (selection,
// request, progress); the board costs a few hundred.
//
// One board per communicator, made at the first exchange on it (a
// collective point: every rank of the communicator exchanges in the same
// order) and kept as an MPI attribute of the communicator, unmapped when the
// communicator is freed. Whether a communicator has a board is agreed at
// that first exchange, so every rank takes the same path.
#pragma once

#include <mpi.h>

#include <cstddef>

namespace partita::mpi::detail {

// The largest block the board carries per rank (a slot of four cache
// lines, less its call number): a layer's Header (104 bytes) and a
// communicator's Record (208 bytes) fit.
constexpr size_t kBoardBlockBytes = 248;

// Gathers every rank's `bytes` (at most kBoardBlockBytes) of `mine` into
// `all` (rank i's block at i * bytes), as MPI_Allgather would, and returns
// true; or returns false, having done nothing else, when `comm` has no
// board (then the caller uses MPI). Collective over `comm` in the sense of
// MPI: every rank must call it with the same `bytes`, in the same order as
// its other exchanges on `comm`. Waits under partita's waiting policy
// (mpi::wait_until: yield, deadline, watchdog, interrupts); a wait that is
// abandoned leaves this rank's block posted, and its next exchange first
// waits until the others have read it, as an abandoned MPI request
// finishes on its own.
bool board_allgather(MPI_Comm comm, const void* mine, size_t bytes, void* all, const char* what);

// Whether communicators that get their board from now on may have one on
// this rank (default: PARTITA_HEADER_BOARD, on unless "0"). A communicator
// has a board only if every rank allowed it when the board was made.
void set_header_board_allowed(bool allowed);
// Whether `comm` exchanges through a board (false before its first
// exchange).
bool has_header_board(MPI_Comm comm);

}  // namespace partita::mpi::detail
