// The peer check (docs/mpi-runtime.md, "A lost node"): when the world spans
// nodes, a thread of each rank answers small UDP probes from the others, and
// a rank that has waited in one operation for PARTITA_PEER_CHECK seconds
// probes every rank on another node; one that answers nothing for
// kPeerLostAfter seconds is taken as lost (its node down or cut off), and
// the waiting rank ends with a line naming it, instead of waiting for MPI
// over TCP, which can take many minutes to notice.
#pragma once

#include <mpi.h>

namespace partita::mpi::detail {

// Collective over `world` (at start-up, from Environment): gathers every
// rank's host, address and port and starts the thread where the check is on.
void peer_check_start(MPI_Comm world);
// This rank ends (Environment's destructor, before MPI_Finalize): the other
// nodes' ranks are told, and stop probing it; the thread answers on until
// peer_check_stop (after MPI_Finalize).
void peer_check_finishing();
void peer_check_stop();

// True while the check runs (read by the waits; set only at start-up).
extern bool g_peer_check_on;
// A wait begins or ends on this thread (nested waits count once).
void peer_wait_begin(const char* what);
void peer_wait_end();

}  // namespace partita::mpi::detail
