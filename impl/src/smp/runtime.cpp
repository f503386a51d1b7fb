// smp's runtime: init (agreed by every rank), the group communicators, the
// rank queries, and the transport of frames. No LibTorch here: objects.cpp
// turns IValues into frames.
//
// Transport (docs/smp.md): every object message goes over smp's own
// duplicate of MPI_COMM_WORLD with one tag, addressed by world rank, so a
// recv_from matches a send or a broadcast whatever rank type either side
// named the other by. send and broadcast use MPI_Issend, complete only once
// the receiver has matched the message: the seed's synchronous semantics.
// recv_from probes (MPI_Improbe) under the waiting policy, learns the size,
// and receives exactly that message (MPI_Imrecv).
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "partita/mpi/poll.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/smp.hpp"
#include "partita/smp/communicators.hpp"

namespace partita::smp {

namespace {

struct State {
  bool initialized = false;
  Config config;
  std::unique_ptr<Layout> layout;
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  MPI_Comm world = MPI_COMM_NULL, mp = MPI_COMM_NULL, dp = MPI_COMM_NULL, tp = MPI_COMM_NULL, pp = MPI_COMM_NULL;
  long steps = 0;  // next_step_number()
};

State& state() {
  static State s;
  return s;
}

const State& ready(const char* call) {
  const State& s = state();
  if (!s.initialized)
    throw UsageError(std::string("smp::") + call + ": smp is not initialised; call smp::init first");
  return s;
}

void free_comm(MPI_Comm& c) {
  if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
  c = MPI_COMM_NULL;
}

// Every communicator smp made, freed: before a new init and at finalize.
void free_comms(State& s) {
  for (MPI_Comm* c : {&s.mp, &s.dp, &s.tp, &s.pp, &s.world}) free_comm(*c);
  s.initialized = false;
}

std::string on_this_rank() { return "on world rank " + std::to_string(state().rank); }

// smp's communicators are freed when MPI finalizes (issue 35 item 1: until
// then the last init's three were still allocated at exit, and
// LeakSanitizer reported MPICH's communicator objects made by
// MPI_Comm_split in init). MPI_Finalize frees MPI_COMM_SELF first, calling
// the delete callbacks of its attributes: the standard's hook for a
// library's clean-up at finalize.
int free_at_finalize(MPI_Comm, int, void*, void*) {
  free_comms(state());
  return MPI_SUCCESS;
}

void free_at_finalize_once() {
  static bool registered = false;  // MPI is initialised once per process
  if (registered) return;
  int key = MPI_KEYVAL_INVALID;
  PARTITA_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, free_at_finalize, &key, nullptr));
  PARTITA_MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr));
  MPI_Comm_free_keyval(&key);  // the attribute keeps it until MPI_COMM_SELF is freed
  registered = true;
}

// A deadline left these sends unmatched: take them back so that a later
// recv_from cannot receive a message its sender gave up on.
void cancel_sends(std::vector<MPI_Request>& requests) {
  for (auto& r : requests) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
}

void issend_all(const detail::Frame& frame, const std::vector<int>& dests, const std::string& what) {
  const State& s = state();
  std::vector<MPI_Request> requests;
  for (int d : dests) {
    MPI_Request r;
    PARTITA_MPI_CHECK(MPI_Issend(frame.data(), static_cast<int>(frame.size()), MPI_BYTE, d, kObjectTag,
                                 s.world, &r));
    requests.push_back(r);
  }
  try {
    mpi::wait_all(requests, what.c_str());
  } catch (const DeadlineError&) {
    cancel_sends(requests);
    throw;
  }
}

}  // namespace

void init(const Config& config) {
  int mpi_ready = 0;
  MPI_Initialized(&mpi_ready);
  if (!mpi_ready)
    throw UsageError("smp::init: MPI is not initialised; create a partita::mpi::Environment first");
  const MPI_Comm agree = mpi::world_comm();
  int rank = 0, size = 1;
  MPI_Comm_rank(agree, &rank);
  MPI_Comm_size(agree, &size);

  // Every rank checks its own configuration, then all compare: a bad or
  // differing configuration raises on every rank, never on one alone.
  std::string mine;
  try {
    config.validate(size);
    mine = "ok " + config.to_json();
  } catch (const ConfigError& e) {
    mine = std::string("error ") + e.what();
  }
  const auto all = mpi::allgather_strings(mine, agree);
  for (int r = 0; r < size; ++r)
    if (all[r].rfind("error ", 0) == 0)
      throw ConfigError("smp::init: rank " + std::to_string(r) + ": " + all[r].substr(6));
  for (int r = 1; r < size; ++r)
    if (all[r] != all[0])
      throw ConfigError("smp::init: the ranks disagree about the configuration: rank 0 has " + all[0].substr(3) +
                        ", rank " + std::to_string(r) + " has " + all[r].substr(3));

  State& s = state();
  free_at_finalize_once();
  free_comms(s);
  s.config = config;
  s.layout = std::make_unique<Layout>(size, config.partitions(), config.tensor_parallel_degree());
  s.rank = rank;
  s.size = size;
  // Communicator creation blocks inside MPICH (no yielding variant of
  // MPI_Comm_split): done once here, never per call.
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &s.world, &req));
  mpi::wait(req, "smp::init (duplicating MPI_COMM_WORLD)");
  MPI_Comm_set_errhandler(s.world, MPI_ERRORS_RETURN);
  const RankPlace p = s.layout->place(rank);
  // Blocking inside MPICH: under the watchdog, so that a rank stuck here is
  // named for what it waits in.
  auto split = [&](int color, int key, MPI_Comm* out) {
    const mpi::WatchedCall watched("smp::init (MPI_Comm_split of the groups)");
    PARTITA_MPI_CHECK(MPI_Comm_split(s.world, color, key, out));
  };
  split(p.dp_rank, p.mp_rank, &s.mp);
  split(p.mp_rank, p.dp_rank, &s.dp);
  // tp and pp groups: with tp_size 1 they are the rank alone and the mp
  // group; duplicated then (MPI_Comm_idup yields) rather than split.
  if (s.layout->tp_size() == 1) {
    PARTITA_MPI_CHECK(MPI_Comm_idup(MPI_COMM_SELF, &s.tp, &req));
    mpi::wait(req, "smp::init (the tp group)");
    PARTITA_MPI_CHECK(MPI_Comm_idup(s.mp, &s.pp, &req));
    mpi::wait(req, "smp::init (the pp group)");
  } else {
    split(rank / s.layout->tp_size(), p.tp_rank, &s.tp);
    split(p.dp_rank * s.layout->tp_size() + p.tp_rank, p.pp_rank, &s.pp);
  }
  MPI_Comm local = MPI_COMM_NULL;
  PARTITA_MPI_CHECK(MPI_Comm_split_type(s.world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local));
  MPI_Comm_rank(local, &s.local_rank);
  MPI_Comm_size(local, &s.local_size);
  MPI_Comm_free(&local);
  MPI_Comm_set_errhandler(s.mp, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(s.dp, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(s.tp, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(s.pp, MPI_ERRORS_RETURN);
  PARTITA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, &s.steps, 1, MPI_LONG, MPI_MAX, s.world, &req));
  mpi::wait(req, "smp::init (agreeing on the pipeline's step number)");
  s.initialized = true;
}

void init_from_file(const std::string& path) {
  // A file one rank cannot read is an error on every rank: read, then agree.
  Config c;
  std::string error;
  try {
    c = Config::from_json_file(path);
  } catch (const ConfigError& e) {
    error = e.what();
  }
  const auto all = mpi::allgather_strings(error, mpi::world_comm());
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) throw ConfigError("smp::init: rank " + std::to_string(r) + ": " + all[r]);
  init(c);
}

void init() {
  Config c;
  std::string error;
  try {
    c = Config::from_environment();
  } catch (const ConfigError& e) {
    error = e.what();
  }
  const auto all = mpi::allgather_strings(error, mpi::world_comm());
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) throw ConfigError("smp::init: rank " + std::to_string(r) + ": " + all[r]);
  init(c);
}

bool initialized() { return state().initialized; }
const Config& config() { return ready("config").config; }
const Layout& layout() { return *ready("layout").layout; }

int rank() { return ready("rank").rank; }
int size() { return ready("size").size; }
int mp_rank() { return ready("mp_rank").rank % state().layout->mp_size(); }
int mp_size() { return ready("mp_size").layout->mp_size(); }
int dp_rank() { return ready("dp_rank").rank / state().layout->mp_size(); }
int dp_size() { return ready("dp_size").layout->dp_size(); }
int tp_rank() { return ready("tp_rank").rank % state().layout->tp_size(); }
int tp_size() { return ready("tp_size").layout->tp_size(); }
int pp_rank() { return ready("pp_rank").rank % state().layout->mp_size() / state().layout->tp_size(); }
int pp_size() { return ready("pp_size").layout->pp_size(); }
int local_rank() { return ready("local_rank").local_rank; }
int local_size() { return ready("local_size").local_size; }
std::vector<int> get_mp_group() { return ready("get_mp_group").layout->members(state().rank, CommGroup::MP_GROUP); }
std::vector<int> get_dp_group() { return ready("get_dp_group").layout->members(state().rank, CommGroup::DP_GROUP); }
std::vector<int> get_tp_group() { return ready("get_tp_group").layout->members(state().rank, CommGroup::TP_GROUP); }
std::vector<int> get_pp_group() { return ready("get_pp_group").layout->members(state().rank, CommGroup::PP_GROUP); }

MPI_Comm communicator(CommGroup group) {
  const State& s = ready("communicator");
  switch (group) {
    case CommGroup::WORLD: return s.world;
    case CommGroup::MP_GROUP: return s.mp;
    case CommGroup::DP_GROUP: return s.dp;
    case CommGroup::TP_GROUP: return s.tp;
    case CommGroup::PP_GROUP: return s.pp;
  }
  throw UsageError("smp::communicator: unknown CommGroup " + std::to_string(static_cast<int>(group)));
}

long next_step_number() { return state().steps++; }

void barrier(CommGroup group) {
  const MPI_Comm comm = communicator(group);
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Ibarrier(comm, &req));
  const std::string what = std::string("smp::barrier(") + name(group) + ") " + on_this_rank();
  mpi::wait(req, what.c_str());
}
void mp_barrier() { barrier(CommGroup::MP_GROUP); }
void dp_barrier() { barrier(CommGroup::DP_GROUP); }
void tp_barrier() { barrier(CommGroup::TP_GROUP); }
void pp_barrier() { barrier(CommGroup::PP_GROUP); }

namespace detail {

void broadcast_frame(const Frame& frame, CommGroup group) {
  const State& s = ready("broadcast");
  std::vector<int> dests;
  for (int r : s.layout->members(s.rank, group))
    if (r != s.rank) dests.push_back(r);
  issend_all(frame, dests,
             std::string("smp::broadcast(") + name(group) + ") " + on_this_rank() + ", waiting for the recv_from of world ranks " +
                 [&] {
                   std::string l;
                   for (int d : dests) l += (l.empty() ? "" : ",") + std::to_string(d);
                   return l;
                 }());
}

void send_frame(const Frame& frame, int dest_rank, RankType rank_type) {
  const State& s = ready("send");
  const int dest = s.layout->world_rank(s.rank, dest_rank, rank_type);
  const std::string call = "smp::send(dest " + std::to_string(dest_rank) + ", " + name(rank_type) + ") " + on_this_rank();
  if (dest == s.rank)
    throw UsageError(call + ": the destination is this rank itself (a synchronous send to oneself never returns)");
  issend_all(frame, {dest}, call + ", waiting for the recv_from of world rank " + std::to_string(dest));
}

Frame recv_frame(int src_rank, RankType rank_type, std::string* context) {
  const State& s = ready("recv_from");
  const int src = s.layout->world_rank(s.rank, src_rank, rank_type);
  const std::string call = "smp::recv_from(src " + std::to_string(src_rank) + ", " + name(rank_type) + ") " + on_this_rank();
  if (context) *context = call + " from world rank " + std::to_string(src);
  if (src == s.rank)
    throw UsageError(call + ": the source is this rank itself (nothing can be sent to oneself)");
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status;
  const std::string what = call + ", waiting for a send or broadcast from world rank " + std::to_string(src);
  mpi::wait_until(
      [&] {
        int found = 0;
        PARTITA_MPI_CHECK(MPI_Improbe(src, kObjectTag, s.world, &found, &message, &status));
        return found != 0;
      },
      what.c_str());
  int count = 0;
  PARTITA_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &count));
  // On the heap, kept where the wait gives the receive up.
  const auto frame = std::make_shared<Frame>(static_cast<size_t>(count), '\0');
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Imrecv(frame->data(), count, MPI_BYTE, &message, &req));
  mpi::wait_holding(req, what.c_str(), frame);
  return std::move(*frame);
}

std::vector<Frame> allgather_frames(const Frame& frame, CommGroup group, std::string* context) {
  const State& s = ready("allgather");
  const MPI_Comm comm = communicator(group);
  const std::string call = std::string("smp::allgather(") + name(group) + ") " + on_this_rank();
  if (context) *context = call;
  int n = 0;
  MPI_Comm_size(comm, &n);
  // Every buffer on the heap, kept where a wait gives its operation up.
  struct Held {
    int len = 0;
    std::vector<int> lens, offsets;
    Frame sent;
    std::string all;
  };
  const auto h = std::make_shared<Held>();
  h->len = static_cast<int>(frame.size());
  h->lens.assign(n, 0);
  h->offsets.assign(n, 0);
  std::vector<int>& lens = h->lens;
  std::vector<int>& offsets = h->offsets;
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Iallgather(&h->len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm, &req));
  mpi::wait_holding(req, call.c_str(), h);
  long long total = 0;
  for (int r = 0; r < n; ++r) {
    if (r) offsets[r] = offsets[r - 1] + lens[r - 1];
    total += lens[r];
    if (total > 0x7fffffffLL)  // every member sees the same lengths: all raise
      throw MessageError(call + ": the members' objects add up to more than 2 GiB");
  }
  h->sent = frame;
  h->all.assign(static_cast<size_t>(total), '\0');
  PARTITA_MPI_CHECK(MPI_Iallgatherv(h->sent.data(), h->len, MPI_BYTE, h->all.data(), lens.data(), offsets.data(),
                                    MPI_BYTE, comm, &req));
  mpi::wait_holding(req, call.c_str(), h);
  std::vector<Frame> out;
  for (int r = 0; r < n; ++r) out.push_back(h->all.substr(offsets[r], lens[r]));
  (void)s;
  return out;
}

}  // namespace detail

}  // namespace partita::smp
