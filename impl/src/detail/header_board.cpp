#include "detail/header_board.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>

#include "partita/mpi/poll.hpp"
#include "partita/mpi/runtime.hpp"

namespace partita::mpi::detail {

namespace {

// One rank's block of one call. `seq` is the number of the call whose block
// it holds (0: none yet), written last, with release order, and read with
// acquire order: a reader that sees its call's number sees the block.
struct alignas(64) Slot {
  uint64_t seq;
  unsigned char block[kBoardBlockBytes];
};
static_assert(sizeof(Slot) == 256, "a slot is four cache lines");

// A communicator's board, as this rank sees it. Calls alternate between two
// rows of slots (call c uses row c % 2). A rank writes call c's block over
// call c-2's only when every other rank has read c-2's: each rank reads the
// blocks of call c-2 before it posts call c-1, and this rank has seen every
// c-1 (in its own call c-1, or, after an abandoned wait, first thing in
// call c). So a block is never overwritten while it is read, with no lock.
struct Board {
  Slot* slots = nullptr;
  size_t length = 0;
  int rank = 0, size = 0;
  uint64_t posted = 0;    // the last call whose block this rank wrote
  uint64_t complete = 0;  // the last call whose blocks it read from every rank
  bool on = false;
  // The setup (make_board, finish_setup): its two collectives, their
  // buffers and the request in flight live here, attached to the
  // communicator before the first wait, so that a wait given up (a
  // deadline) leaves them to MPI and the next exchange resumes the same
  // collective instead of starting another.
  enum Stage { kName, kMapped, kReady };
  Stage stage = kName;
  MPI_Request request = MPI_REQUEST_NULL;
  char name[96] = {0};
  int mapped = 0, all_mapped = 0;
  void* mapping = MAP_FAILED;
  bool allowed = false;
  Slot& slot(uint64_t call, int r) const { return slots[(call & 1) * static_cast<uint64_t>(size) + r]; }
};

// This thread's last communicator looked up and its board: the layers
// exchange on one communicator call after call, and MPI_Comm_get_attr costs
// about 110 instructions. Freeing any communicator with a board counts in
// g_frees, which makes every thread's entry stale before MPI can hand the
// freed handle to a new communicator.
std::atomic<uint64_t> g_frees{0};
struct Last {
  MPI_Comm comm = MPI_COMM_NULL;
  Board* board = nullptr;
  uint64_t frees = 0;
};
thread_local Last t_last;

int delete_board(MPI_Comm, int, void* value, void*) {
  g_frees.fetch_add(1, std::memory_order_acq_rel);
  auto* b = static_cast<Board*>(value);
  if (b->stage != Board::kReady) {
    if (b->rank == 0 && b->name[0]) shm_unlink(b->name);
    if (b->mapping != MAP_FAILED) munmap(b->mapping, b->length);
    b->mapping = MAP_FAILED;
    // A setup collective still in flight may write into the board: left
    // to MPI (a few hundred bytes, once per abandoned setup).
    if (b->request != MPI_REQUEST_NULL) return MPI_SUCCESS;
  }
  if (b->slots) munmap(b->slots, b->length);
  delete b;
  return MPI_SUCCESS;
}

std::once_flag g_once;
int g_keyval = MPI_KEYVAL_INVALID;
std::atomic<bool> g_allowed{true};

void init_once() {
  std::call_once(g_once, [] {
    const char* v = std::getenv("PARTITA_HEADER_BOARD");
    g_allowed = !(v && std::strcmp(v, "0") == 0);
    PARTITA_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_board, &g_keyval, nullptr));
  });
}

// A name no other board on this machine has: the creating process's pid, a
// count within it, and a random number.
void fresh_name(char* name, size_t size) {
  static std::atomic<unsigned long> count{0};
  std::random_device rd;
  std::snprintf(name, size, "/partita-board-%ld-%lu-%08x", static_cast<long>(getpid()),
                count.fetch_add(1), static_cast<unsigned>(rd()));
}

// The names a process left behind when it died between creating its
// segment and unlinking it (the watchdog's abort, a kill): a name carries
// its creator's pid, and a name whose process no longer exists (kill(pid,
// 0) fails with ESRCH) is unlinked. Run by every board's rank 0 before it
// makes its own. (Where /dev/shm is shared by processes in several pid
// namespaces, a live creator may look dead: its board's late members then
// find no segment and that communicator takes the MPI path.)
void sweep_names_of_dead_processes() {
  DIR* d = opendir("/dev/shm");
  if (!d) return;
  while (const dirent* e = readdir(d)) {
    long pid = 0;
    if (std::sscanf(e->d_name, "partita-board-%ld-", &pid) != 1 || pid <= 0) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    char name[300];
    std::snprintf(name, sizeof name, "/%s", e->d_name);
    shm_unlink(name);
  }
  closedir(d);
}

// Collective over `comm` (its first exchange): rank 0 makes the segment and
// names it to the others, which map it; the board is on only if every rank
// allows boards and mapped it. A rank on another node than rank 0 finds no
// segment of that name (each node has its own /dev/shm), so a communicator
// that spans nodes falls back to MPI with no test of its own. Rank 0
// unlinks the name once everyone has mapped it: nothing is left in
// /dev/shm, even if a process dies later. Two collectives under the
// waiting policy: blocking ones would spin in MPICH where ranks outnumber
// cores, which made the property suites at 16 ranks on 2 cores four times
// slower in a first version. make_board attaches the board and makes the
// segment; finish_setup runs the collectives, and runs again from where a
// given-up wait left it.
Board* make_board(MPI_Comm comm) {
  auto b = std::make_unique<Board>();
  MPI_Comm_rank(comm, &b->rank);
  MPI_Comm_size(comm, &b->size);
  b->allowed = g_allowed.load() && b->size >= 2;
  b->length = 2 * static_cast<size_t>(b->size) * sizeof(Slot);
  if (b->rank == 0 && b->allowed) {
    sweep_names_of_dead_processes();
    fresh_name(b->name, sizeof b->name);
    int fd = shm_open(b->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    // Zero-filled (seq 0), and its pages reserved now: in a full or small
    // /dev/shm ftruncate alone succeeds and the first write into the
    // mapping dies of SIGBUS, where posix_fallocate fails (ENOSPC) and the
    // communicator takes the MPI path instead.
    if (fd >= 0 && (ftruncate(fd, static_cast<off_t>(b->length)) != 0 ||
                    posix_fallocate(fd, 0, static_cast<off_t>(b->length)) != 0)) {
      close(fd);
      shm_unlink(b->name);
      fd = -1;
    }
    if (fd >= 0) {
      b->mapping = mmap(nullptr, b->length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
    }
    if (fd < 0 || b->mapping == MAP_FAILED) {
      if (fd >= 0) shm_unlink(b->name);
      b->name[0] = '\0';
    }
  }
  PARTITA_MPI_CHECK(MPI_Comm_set_attr(comm, g_keyval, b.get()));
  return b.release();
}

// One setup collective, resumable: posted once (its request kept in the
// board), then waited for; a wait given up throws and leaves the request
// for the next call to wait for again. Where waits block (no deadline)
// the blocking form runs, as mpi::call would.
template <typename Blocking, typename Post>
void setup_step(Board& b, const char* what, Blocking&& blocking, Post&& post) {
  if (b.request == MPI_REQUEST_NULL) {
    if (blocking_waits()) {
      const WatchedCall watched(what);
      blocking();
      return;
    }
    post(&b.request);
  }
  wait(b.request, what);
}

void finish_setup(Board& b, MPI_Comm comm, const char* what) {
  if (b.stage == Board::kName) {
    setup_step(
        b, what, [&] { PARTITA_MPI_CHECK(MPI_Bcast(b.name, sizeof b.name, MPI_CHAR, 0, comm)); },
        [&](MPI_Request* req) { PARTITA_MPI_CHECK(MPI_Ibcast(b.name, sizeof b.name, MPI_CHAR, 0, comm, req)); });
    if (b.rank != 0 && b.name[0] && b.allowed) {
      const int fd = shm_open(b.name, O_RDWR, 0);
      if (fd >= 0) {
        b.mapping = mmap(nullptr, b.length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
      }
    }
    b.mapped = b.mapping != MAP_FAILED ? 1 : 0;
    b.stage = Board::kMapped;
  }
  if (b.stage == Board::kMapped) {
    setup_step(
        b, what,
        [&] { PARTITA_MPI_CHECK(MPI_Allreduce(&b.mapped, &b.all_mapped, 1, MPI_INT, MPI_LAND, comm)); },
        [&](MPI_Request* req) {
          PARTITA_MPI_CHECK(MPI_Iallreduce(&b.mapped, &b.all_mapped, 1, MPI_INT, MPI_LAND, comm, req));
        });
    if (b.rank == 0 && b.name[0]) shm_unlink(b.name);
    if (b.all_mapped) {
      b.slots = static_cast<Slot*>(b.mapping);
      b.on = true;
    } else if (b.mapping != MAP_FAILED) {
      munmap(b.mapping, b.length);
    }
    b.mapping = MAP_FAILED;
    b.stage = Board::kReady;
  }
}

uint64_t seq_of(const Slot& s) { return __atomic_load_n(&s.seq, __ATOMIC_ACQUIRE); }

// Until rank r has posted `call` (or a later one). While it waits, MPI's
// progress engine is driven, as a waiting MPI call would drive it: an
// operation this rank posted earlier may need it before rank r can get here.
// A short spin first (a peer a few hundred nanoseconds behind), then
// partita's waiting loop with an MPI_Iprobe every 16 tests.
void await(const Board& b, MPI_Comm comm, uint64_t call, int r, const char* what) {
  const Slot& s = b.slot(call, r);
  for (int i = 0; i < 256; ++i) {
    if (seq_of(s) >= call) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  unsigned tests = 0;
  wait_until(
      [&] {
        if ((tests++ & 15u) == 0) {
          int flag = 0;
          MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, MPI_STATUS_IGNORE);
        }
        return seq_of(s) >= call;
      },
      what, /*abandons=*/true);  // counted: the world must be renewed after it
}

Board* board_of(MPI_Comm comm) {
  const uint64_t frees = g_frees.load(std::memory_order_acquire);
  if (comm == t_last.comm && frees == t_last.frees) return t_last.board;
  init_once();
  void* value = nullptr;
  int found = 0;
  PARTITA_MPI_CHECK(MPI_Comm_get_attr(comm, g_keyval, &value, &found));
  if (!found) return nullptr;
  t_last = Last{comm, static_cast<Board*>(value), frees};
  return t_last.board;
}

}  // namespace

bool board_allgather(MPI_Comm comm, const void* mine, size_t bytes, void* all, const char* what) {
  if (bytes > kBoardBlockBytes) return false;
  Board* b = board_of(comm);
  if (!b) b = make_board(comm);
  if (b->stage != Board::kReady) finish_setup(*b, comm, what);
  if (!b->on) return false;
  const uint64_t call = b->posted + 1;
  // This call's row holds call-2's blocks, which may be overwritten once
  // every rank has posted call-1 (having read them first). Seen already,
  // unless this rank's wait at call-1 was abandoned (a deadline, an
  // interrupt): then wait for them now.
  if (b->complete + 1 < call)
    for (int r = 0; r < b->size; ++r)
      if (r != b->rank) await(*b, comm, call - 1, r, what);
  Slot& own = b->slot(call, b->rank);
  std::memcpy(own.block, mine, bytes);
  __atomic_store_n(&own.seq, call, __ATOMIC_RELEASE);
  b->posted = call;
  auto* out = static_cast<unsigned char*>(all);
  for (int r = 0; r < b->size; ++r) {
    if (r == b->rank) {
      std::memcpy(out + r * bytes, mine, bytes);
      continue;
    }
    await(*b, comm, call, r, what);
    std::memcpy(out + r * bytes, b->slot(call, r).block, bytes);
  }
  b->complete = call;
  return true;
}

void set_header_board_allowed(bool allowed) {
  init_once();
  g_allowed = allowed;
}

bool has_header_board(MPI_Comm comm) {
  const Board* b = board_of(comm);
  return b && b->on;
}

}  // namespace partita::mpi::detail
