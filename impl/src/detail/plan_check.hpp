// Internal: checked mode (issue 18, docs/mpi-runtime.md). Before a layer
// moves data, every rank states what it will exchange with each other
// member of the layer's union partition; one all-to-all of these claims
// shows every rank what its partners intend, and any disagreement (a send
// nobody receives, a wrong element count or dtype, a different member list
// for a shared team) raises a PartitionError on every rank of the union,
// naming the two workers and what they disagree on, before any data moves.
// A plan on which the ranks disagree would otherwise hang.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "partita/mpi/partition.hpp"
#include "partita/shape.hpp"

namespace partita::mpi::detail {

// What this rank will exchange with one partner (all zero: nothing).
struct PeerClaim {
  int64_t send = 0;      // elements this rank sends to the partner
  int64_t recv = 0;      // elements it expects from the partner
  int64_t messages = 0;  // messages (or collectives) it shares with the partner
  int64_t dtype = -1;    // element type of what moves, -1: nothing moves
  uint64_t team = 0;     // fingerprint of the member list they share, 0: none
};

// Checked mode: PARTITA_CHECKED=0|1 (default: on; docs/mpi-runtime.md).
bool checked_mode();
void set_checked_mode(bool on);

// One claim per member of `P` (indexed by rank in P). Collective over the
// active members of P; a no-op outside checked mode or when P is inactive.
void check_plan(const Partition& P, const std::string& what, const std::vector<PeerClaim>& claims);

// Issue 35 item 5: a count above INT_MAX (MPI's int) raises on every
// active member of P before anything of the call is posted. `largest` is
// the largest count this rank's plan will hand MPI (the elements of one
// message, or one extent of a subarray datatype). Runs whatever the checked
// mode: a rank whose own counts fit cannot know that a partner's do not
// (a rank posting a receive from a partner that has already thrown would
// wait forever, and a rank throwing after it posted a receive would free a
// buffer MPI may still write into). One allreduce per plan; plans are made
// once (detail/plan_cache.hpp), so not per call.
void check_counts(const Partition& P, const std::string& what, int64_t largest);

// Adds a shared team (a collective) to `claims`: every other member of
// `team` gets the team's fingerprint and one more message; send/recv
// counts are set by the caller.
uint64_t team_fingerprint(const Ranks& members);

// Rank of world rank `w` in P, -1 if not a member.
int rank_in(const Partition& P, int w);

// Adds this rank's part in one collective over `team` (world ranks, a
// subset of P) to `claims`: one message with every other member, the
// team's fingerprint, and send[i] / recv[i] elements to / from team member
// i (this rank's own entry is ignored).
void add_team_claims(std::vector<PeerClaim>& claims, const Partition& P, const Ranks& team,
                     const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                     int64_t dtype);

}  // namespace partita::mpi::detail

namespace partita::mpi::detail {

// Checked mode for partition constructors: every rank of `comm` computed
// `teams` (every team, world ranks, root first) on its own; unless all hold
// the same table, every rank throws a PartitionError naming two workers
// that differ and the first team on which they do.
void agree_on_teams(MPI_Comm comm, const std::string& what, const std::vector<Ranks>& teams);

}  // namespace partita::mpi::detail
