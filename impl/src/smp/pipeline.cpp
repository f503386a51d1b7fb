// smp::DistributedModel and the pipeline executor (issues 14 and 31,
// docs/pipeline.md): the stages of a model (a torch::nn::Sequential or any
// module of ordered one-tensor children) on the pp group, and smp::step's
// per-call state (detail::PipelineStep), which runs this rank's list of a
// schedule that schedule.cpp built and verified (pure, no MPI).
//
// Messages (docs/pipeline.md has the table; every tag carries the step's
// number, see TagKind), mostly between neighbouring stages on the pp group's
// communicator:
//   kHeader   a fixed-size int64 header before every activation: the
//             microbatch, the activation's dtype and shape and the shape of
//             the x stage 0 was given;
//   kAct      the activation (SEND_F / RECV_F); its gradient comes back on
//             kAct + max_tag (SEND_B / RECV_B);
//   kShape    the last stage tells every other stage the output's shape and
//             dtype, once per model input shape (their stand-in);
//   kAbort    a rank whose step failed tells every other (smp's world), and
//             every wait inside the step listens for it; also a rank whose
//             step function called no model ('N').
// Sends are MPI_Isend completed at the end of the step, receives wait: the
// semantics under which the verifier proved the schedule free of deadlock.
#include "partita/smp/pipeline.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "partita/mpi/communicator.hpp"
#include "partita/mpi/poll.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/traffic.hpp"
#include "partita/smp/communicators.hpp"
#include "partita/smp/message.hpp"
#include "partita/smp/step.hpp"
#include "split_backward.hpp"
#include "stages.hpp"
#include "partita/nn/linear.hpp"

namespace partita::smp {

// --- the step's state -----------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Every message of a step has a tag of its step's number (the epoch, agreed
// at smp::init, the same on every rank) and its kind, so that what a
// failed step left unreceived never matches a later step's receive.
// kAbort and kDone travel on smp's world communicator, beside smp's object
// messages (tag 4004 = 4 mod 8, a kind that never goes there); kGrads on the
// dp group's; the others on the pp group's.
enum TagKind { kAct = 0, kHeader = 1, kShape = 2, kAbort = 3, kReturned = 4, kFingerprint = 5, kGrads = 6, kDone = 7 };
constexpr int kTagBase = 1400;
constexpr long kMaxEpochs = 1 << 20;
constexpr int64_t kMagic = 0x45504950;  // "PIPE"
constexpr int kMaxDims = 12;
constexpr int kHeaderWords = 7 + 2 * kMaxDims;  // magic, status, mb, dtype, ndim, dims, xndim, xdims, stage
constexpr int kStageWord = 6 + 2 * kMaxDims;     // the (virtual) stage whose output the activation is

// What a step has posted and not yet finished: the buffers must outlive
// the requests. A failed step's are abandoned (kept for ever, requests
// freed): MPI may still read or write them.
struct InFlight {
  std::deque<std::string> bytes;
  std::deque<std::vector<int64_t>> words;
  std::deque<at::Tensor> tensors;
  std::vector<MPI_Request> requests;
};

struct StepState {
  int microbatches = 0;
  std::string fingerprint;
  DistributedModel::Impl* model = nullptr;
  long epoch = 0;
  long epochs = kMaxEpochs;        // step numbers are taken modulo this
  MPI_Comm world = MPI_COMM_NULL;  // smp's, for kAbort and kDone
  bool listening = false;          // pipelined: more than one rank
  bool aborted = false;            // this rank raised because another failed
  int no_model_heard = 0;          // 'N' notices heard: ranks whose step function called no model
  std::string no_model_text;       // the first of them
  bool model_called = false;       // the step function called a model (set before its first wait)
  InFlight inflight;
  std::function<void()> check;     // check_abort, for ScopedWaitInterrupt
  std::unique_ptr<mpi::ScopedWaitInterrupt> interrupt;
  std::vector<Action> list;        // this rank's actions, messages included
  size_t current = 0;              // the one running
  std::vector<size_t> pending;     // actions before the model's first call (its RECV_F): run then
  int chunks = 1;                  // the schedule's stages per rank (virtual stages)
};
StepState* g_step = nullptr;
// PipelineStep's current_ while its schedule is refused (beside kFinish).
constexpr int kStartOfStep = std::numeric_limits<int>::min() + 1;
// Pipelined steps that failed on this rank. Every rank of a failed step
// counts it, also one that failed before it called the model (which then
// does not know it): a model forgets its cached output shapes when the
// count moved since it last ran.
int64_t g_failed_steps = 0;

int tag_of(int kind) { return kTagBase + kind + 8 * static_cast<int>(g_step->epoch % g_step->epochs); }

// As many step numbers as fit below the Communicator's largest tag (half of
// MPI_TAG_UB: the adjoint messages use the upper half), at most 2^20.
long epochs_for(MPI_Comm comm) {
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm, MPI_TAG_UB, &ub, &flag);
  const long max_tag = (flag && ub ? *ub : 32767) / 2;
  return std::max(1L, std::min(kMaxEpochs, (max_tag - kTagBase - 8) / 8));
}

// Things a failed step leaves to MPI: kept for the rest of the process
// (mpi::keep_forever, as every other given-up operation's buffers).
template <typename T>
void abandon(T&& x) {
  mpi::keep_forever(std::forward<T>(x));
}
void abandon_in_flight(InFlight& f) {
  for (auto& r : f.requests)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  f.requests.clear();
  abandon(std::move(f));
  f = InFlight{};
}

// MPI counts are ints (issue 35 item 5): a message of more units than that
// raises a ShapeError here, before anything of it is copied or posted; the
// stage's error reaches the other ranks as a PipelineError.
int mpi_units(int64_t n, const char* unit, const std::string& what) {
  if (n > std::numeric_limits<int>::max())
    throw ShapeError(what + ": a message of " + std::to_string(n) + " " + unit +
                         ", above the MPI count limit (INT_MAX = 2147483647); nothing was sent",
                     rule_code::kCountOverflow);
  return static_cast<int>(n);
}
int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

void post_bytes(std::string bytes, MPI_Datatype type, int count_divisor, int dest, int tag, MPI_Comm comm) {
  InFlight& f = g_step->inflight;
  const int count = mpi_units(static_cast<int64_t>(bytes.size()) / count_divisor, "units",
                              "smp::step: a control message");
  f.bytes.push_back(std::move(bytes));
  MPI_Request r;
  PARTITA_MPI_CHECK(MPI_Isend(f.bytes.back().data(), count, type, dest, tag, comm, &r));
  f.requests.push_back(r);
}

std::string who() {
  return "stage " + std::to_string(pp_rank()) + " of " + std::to_string(pp_size()) + ", world rank " +
         std::to_string(rank());
}

// Another rank's notice that it failed in this step: raise it here.
// 'U' (its error was an smp::UsageError) raises smp::UsageError, anything
// else smp::PipelineError; the text names the failed stage and its error.
// This rank's step function called the model, another's did not (its 'N'
// notice's text).
[[noreturn]] void throw_model_called_elsewhere(const std::string& text) {
  throw UsageError(text + ", and the step function on " + who() +
                   " called it: every rank's step function must call the model, or none");
}

void check_abort() {
  if (!g_step || !g_step->listening) return;
  int found = 0;
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status;
  PARTITA_MPI_CHECK(MPI_Improbe(MPI_ANY_SOURCE, tag_of(kAbort), g_step->world, &found, &message, &status));
  if (!found) return;
  int n = 0;
  PARTITA_MPI_CHECK(MPI_Get_count(&status, MPI_CHAR, &n));
  std::string text(static_cast<size_t>(n), '\0');
  PARTITA_MPI_CHECK(MPI_Mrecv(text.data(), n, MPI_CHAR, &message, MPI_STATUS_IGNORE));
  const char code = text.empty() ? 'E' : text[0];
  if (code == 'N') {
    // Another rank's step function called no model. Fine where this one
    // called none either (PipelineStep::finish counts them); else this
    // rank fails, and its notice tells every rank, that one included.
    if (!g_step->model_called) {
      if (g_step->no_model_heard++ == 0) g_step->no_model_text = text.substr(1);
      return;
    }
    throw_model_called_elsewhere(text.substr(1));
  }
  g_step->aborted = true;
  const std::string full = (text.empty() ? std::string() : text.substr(1)) + "; this rank (" + who() + ") stops too";
  if (code == 'U') throw UsageError(full);
  throw PipelineError(full);
}

std::string shape_text(at::IntArrayRef s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

// Whether t's value depends on `target` (a node of its graph) or is the
// tensor `target_tensor` itself: a breadth-first walk of t's graph.
bool depends_on(const at::Tensor& t, const torch::autograd::Node* target, const at::Tensor& target_tensor) {
  if (!t.defined()) return false;
  if (target_tensor.defined() && t.is_same(target_tensor)) return true;
  const auto root = t.grad_fn();
  if (!root || !target) return false;
  std::deque<torch::autograd::Node*> todo{root.get()};
  std::unordered_set<torch::autograd::Node*> seen{root.get()};
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.front();
    todo.pop_front();
    if (n == target) return true;
    for (const auto& e : n->next_edges()) {
      torch::autograd::Node* next = e.function.get();
      if (next && seen.insert(next).second) todo.push_back(next);
    }
  }
  return false;
}

// Waits until `ready()` under partita's deadline and watchdog, listening for
// failure notices. A stage often waits for a whole forward or backward of its
// neighbour; under the yield policy partita's waiting loop sleeps between
// tests once such a wait lasts (docs/mpi-runtime.md), so the waiting stage
// leaves the core to the computing one.
void wait_for_neighbour(const std::function<bool()>& ready, const std::string& what) {
  mpi::wait_until(
      [&] {
        if (ready()) return true;
        check_abort();
        return false;
      },
      what.c_str());
}

void wait_requests(std::vector<MPI_Request>& requests, const std::string& what) {
  if (requests.empty()) return;
  wait_for_neighbour(
      [&] {
        int done = 0;
        PARTITA_MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE));
        return done != 0;
      },
      what);
}

// A message of unknown size from `source`: probed for (listening), then
// received.
std::string receive_bytes(int source, int tag, MPI_Comm comm, const std::string& what) {
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status;
  wait_for_neighbour(
      [&] {
        int found = 0;
        PARTITA_MPI_CHECK(MPI_Improbe(source, tag, comm, &found, &message, &status));
        return found != 0;
      },
      what);
  int n = 0;
  PARTITA_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &n));
  std::string bytes(static_cast<size_t>(n), '\0');
  PARTITA_MPI_CHECK(MPI_Mrecv(bytes.data(), n, MPI_BYTE, &message, MPI_STATUS_IGNORE));
  return bytes;
}

MPI_Datatype grad_datatype(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return MPI_DOUBLE;
    case at::kFloat: return MPI_FLOAT;
    default:
      throw UsageError(std::string("smp::DistributedModel: the dp all-reduce of gradients supports float32 and "
                                   "float64 parameters, not ") +
                       c10::toString(t));
  }
}

}  // namespace

// --- the model ------------------------------------------------------------------

struct DistributedModel::Impl : std::enable_shared_from_this<DistributedModel::Impl> {
  std::shared_ptr<torch::nn::Module> root;                  // the whole model
  std::vector<std::string> names;                           // every layer's
  std::vector<std::shared_ptr<torch::nn::Module>> children;  // every layer
  std::vector<detail::LayerCall> calls;                     // every layer's (the stand-in's probe)
  std::vector<std::vector<detail::LayerCall>> layers;       // this rank's, per chunk
  // The same layers' Linear modules (null for another type): I and W split
  // there (split_backward.hpp).
  std::vector<std::vector<std::shared_ptr<torch::nn::LinearImpl>>> linears;
  // Per chunk: the parameters of its Linear layers that another module of
  // the chunk holds too (a head tied to an embedding): W takes them by
  // autograd for that other use as well as from what I left.
  std::vector<std::unordered_set<const c10::TensorImpl*>> linear_params_shared;
  std::vector<int> bounds;                                  // every stage's: stages * v + 1 numbers
  // This rank's place: pp rank `stage` of `stages` (docs/3d.md; mp rank
  // without tensor parallelism). With v chunks (virtual
  // stages, Megatron's interleaved schedule) it holds the model's stages
  // stage, stage + stages, ..., stage + (v - 1) stages; chunk c is the c-th.
  int stage = 0, stages = 1, v = 1;
  bool distributed = false;  // this rank's chunks hold partita's distributed layers (docs/3d.md)
  mpi::Communicator comm;  // the pp group
  MPI_Comm raw = MPI_COMM_NULL;
  // The output's dtype and shape for a model input of a given dtype and
  // shape (the stand-in on stages before the last).
  std::map<std::vector<int64_t>, std::vector<int64_t>> out_shapes;
  int64_t failed_steps_seen = 0;  // g_failed_steps when out_shapes was last known good

  // One microbatch on one of this rank's chunks: what its actions leave
  // for the next ones.
  struct Part {
    bool forwarded = false, done = false;
    bool sent = false;           // SEND_F ran (or the forward sent early, see call)
    at::Tensor input;            // stages after the first: the received activation (a leaf)
    std::vector<int64_t> x_shape;  // the shape of stage 0's x, from the header
    at::Tensor output;           // stages before the last: this stage's output, sent on
    at::Tensor grad_out;         // RECV_B: the gradient of `output` from the next stage
    at::Tensor grad_in;          // I or B: the gradient of `input`, for SEND_B
    int64_t bytes = 0;
    bool split = false;          // the schedule runs I and W for it (not B)
    std::shared_ptr<detail::WeightGradWork> work;  // split: what I leaves for W
    bool linear_unsplit = false;  // split, but a Linear layer ran whole (its node reaches its weight)
  };
  // One microbatch: the step function's call (the model's call in it).
  struct Mb {
    bool called = false, backward_requested = false;
    at::Tensor loss;             // the rank of the last stage: loss / microbatches
    at::Tensor target_tensor;    // the output (or stand-in) returned to the step
    std::shared_ptr<torch::autograd::Node> target;  // its node in the graph
  };
  std::vector<Mb> mbs;
  std::vector<std::vector<Part>> parts;  // [chunk][microbatch]
  bool grad_mode = true;  // at the model's first call: for the forwards the executor runs outside it
  bool training = false;
  int first_called = -1;  // the microbatch whose step function ran first: it decides `training`
  long steps_begun = 0;
  PipelineStats stats;
  nn::LayerTraffic traffic_at_begin;  // the layers' counters when the step began
  // The gradients partita's distributed layers on this rank held when the
  // step began (dp > 1): the step's own part is divided by dp at its end.
  std::vector<std::pair<at::Tensor, at::Tensor>> distributed_grads_before;
  // The dp average's buffers per dtype (all_reduce_gradients): the
  // gradients' flat buffer, what the other replicas sent, the sum.
  struct GradBuffer {
    at::Tensor flat;
    std::vector<at::Tensor> got;
    at::Tensor sum;
    at::Tensor defined;  // post_defined's table (uint8): row r, which of replica r's gradients are defined
  };
  std::map<at::ScalarType, GradBuffer> grad_buffers;
  Clock::time_point step_start;
  bool step_started = false;

  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
  // The model's stage of chunk c, and the chunks holding the model's first
  // and last stage.
  int global(int c) const { return stage + c * stages; }
  bool first_stage(int c) const { return first() && c == 0; }
  bool last_stage(int c) const { return last() && c == v - 1; }
  // The chunk whose forward runs in the model's call: the first stage's on
  // pp rank 0 (it needs x), the last stage's on the last rank (it returns
  // the output), chunk 0 elsewhere (docs/pipeline.md, "Virtual stages").
  int call_chunk() const { return last() ? v - 1 : 0; }
  // The pp group's rank of pipeline rank s, and this rank's neighbours: the
  // previous stage of any chunk is on prev_rank(), the next on next_rank().
  int peer(int s) const { return s; }
  int prev_rank() const { return peer((stage + stages - 1) % stages); }
  int next_rank() const { return peer((stage + 1) % stages); }
  int chunk_of(const Action& a) const {
    const int c = (a.stage - stage) / stages;
    if (a.stage < stage || (a.stage - stage) % stages != 0 || c >= v)
      throw UsageError("smp::DistributedModel on pp rank " + std::to_string(stage) + ": the schedule's action " +
                       to_string(a) + " is for a stage this rank does not hold");
    return c;
  }

  void touch() {  // the first action of a step starts its clock
    if (!step_started) {
      step_started = true;
      step_start = Clock::now();
    }
  }

  void begin_step(const StepState& st) {
    ++steps_begun;
    const int n = st.microbatches;
    mbs.assign(n, Mb{});
    parts.assign(v, std::vector<Part>(n));
    for (const Action& a : g_step->list)
      if (a.kind == ActionKind::kBackwardInput) parts[chunk_of(a)][a.microbatch].split = true;
    training = false;
    first_called = -1;
    stats = PipelineStats{};
    traffic_at_begin = nn::layer_traffic();
    distributed_grads_before.clear();
    if (failed_steps_seen != g_failed_steps) {
      out_shapes.clear();
      failed_steps_seen = g_failed_steps;
    }
    if (dp_size() > 1)
      for (auto& p : stage_parameters(detail::distributed_parameters))
        distributed_grads_before.emplace_back(p, p.grad().defined() ? p.grad().clone() : at::Tensor());
    step_started = false;
    if (stages == 1) return;
    // Every stage must be running the same step on the same batch.
    // Stage 0 compares every stage's with its own, every other stage its
    // own with stage 0's; a stage that matched stage 0 hears of another's
    // mismatch from its notice (docs/pipeline.md). Point to point, tagged
    // with the step: a collective left behind by a failed step would match
    // the next step's.
    const std::string mine = "microbatches " + std::to_string(n) + ", split arguments " +
                             (st.fingerprint.empty() ? "none" : st.fingerprint);
    const int tag = tag_of(kFingerprint);
    const std::string what = where(0) + ": comparing the step's arguments with stage 0's";
    std::vector<std::pair<int, std::string>> differ;  // stage, its arguments
    if (first()) {
      for (int s = 1; s < stages; ++s) post_bytes(mine, MPI_BYTE, 1, s, tag, raw);
      for (int s = 1; s < stages; ++s) {
        std::string theirs = receive_bytes(s, tag, raw, what);
        if (theirs != mine) differ.emplace_back(s, std::move(theirs));
      }
    } else {
      post_bytes(mine, MPI_BYTE, 1, 0, tag, raw);
      const std::string zero = receive_bytes(0, tag, raw, what);
      if (zero != mine) {
        differ.emplace_back(stage, mine);
        differ.insert(differ.begin(), {0, zero});
      }
    }
    if (!differ.empty()) {
      std::string text = "smp::step: the pipeline's stages were given different batches (mismatched "
                         "microbatch shapes); every stage of a model replica must get the same inputs:";
      if (first()) text += "\n  stage 0: " + mine;
      for (const auto& [s, a] : differ) text += "\n  stage " + std::to_string(s) + ": " + a;
      throw UsageError(text);
    }
  }

  void post(std::vector<int64_t> words, int dest, int kind) {
    InFlight& f = g_step->inflight;
    f.words.push_back(std::move(words));
    MPI_Request r;
    PARTITA_MPI_CHECK(MPI_Isend(f.words.back().data(), static_cast<int>(f.words.back().size()), MPI_INT64_T, dest,
                                tag_of(kind), raw, &r));
    f.requests.push_back(r);
  }

  std::vector<int64_t> header(int64_t status, int mb, const at::Tensor& act, at::IntArrayRef x, int from) const {
    std::vector<int64_t> h(kHeaderWords, 0);
    h[0] = kMagic;
    h[1] = status;
    h[2] = mb;
    h[kStageWord] = from;
    if (status != 0) return h;
    h[3] = static_cast<int64_t>(act.scalar_type());
    h[4] = act.dim();
    for (int64_t i = 0; i < act.dim(); ++i) h[5 + i] = act.size(i);
    h[5 + kMaxDims] = static_cast<int64_t>(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[6 + kMaxDims + i] = x[i];
    return h;
  }

  static std::vector<int64_t> key_of(const at::Tensor& x) {
    std::vector<int64_t> k{static_cast<int64_t>(x.scalar_type())};
    for (int64_t s : x.sizes()) k.push_back(s);
    return k;
  }

  std::string where(int mb) const {
    return "smp::DistributedModel stage " + std::to_string(stage) + " of " + std::to_string(stages) +
           ", microbatch " + std::to_string(mb);
  }
  std::string where(int c, int mb) const {
    if (v == 1) return where(mb);
    return "smp::DistributedModel stage " + std::to_string(global(c)) + " of " + std::to_string(stages * v) +
           " (chunk " + std::to_string(c) + " of pp rank " + std::to_string(stage) + "), microbatch " +
           std::to_string(mb);
  }

  // A small message from a neighbour: probed for first (so that a wait
  // ending at the deadline leaves no receive posted), then received.
  std::vector<int64_t> receive_words(int count, int source, int kind, const std::string& what) {
    const int tag = tag_of(kind);
    wait_for_neighbour(
        [&] {
          int flag = 0;
          PARTITA_MPI_CHECK(MPI_Iprobe(source, tag, raw, &flag, MPI_STATUS_IGNORE));
          return flag != 0;
        },
        what);
    std::vector<int64_t> words(count, 0);
    PARTITA_MPI_CHECK(MPI_Recv(words.data(), count, MPI_INT64_T, source, tag, raw, MPI_STATUS_IGNORE));
    return words;
  }

  // A tensor's bytes from a neighbour, into `into` (its size is known):
  // probed for under the deadline, listening for failure notices, then
  // received by MPI_Mrecv of the matched message, so that a wait that ends
  // leaves no receive posted.
  void receive_into(at::Tensor& into, int source, int tag, const std::string& what) {
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    wait_for_neighbour(
        [&] {
          int found = 0;
          PARTITA_MPI_CHECK(MPI_Improbe(source, tag, raw, &found, &message, &status));
          return found != 0;
        },
        what);
    int n = 0;
    PARTITA_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &n));
    const int64_t want = into.numel() * static_cast<int64_t>(into.element_size());
    if (n != want) {
      std::vector<char> sink(static_cast<size_t>(n));
      PARTITA_MPI_CHECK(MPI_Mrecv(sink.data(), n, MPI_BYTE, &message, MPI_STATUS_IGNORE));
      throw UsageError(what + ": " + std::to_string(n) + " bytes arrived where " + std::to_string(want) +
                       " were expected (the stages' schedules disagree)");
    }
    PARTITA_MPI_CHECK(MPI_Mrecv(into.data_ptr(), n, MPI_BYTE, &message, MPI_STATUS_IGNORE));
  }

  // A tensor's bytes to a neighbour: MPI_Isend of a contiguous copy kept
  // with the step's messages, completed at the end of the step. Sends never
  // wait, which is what the verifier assumes (docs/pipeline.md).
  void send_tensor(const at::Tensor& t, int dest, int tag, const std::string& what) {
    const int n = mpi_units(bytes_of(t), "bytes", what);
    InFlight& f = g_step->inflight;
    f.tensors.push_back(t.detach().contiguous());
    const at::Tensor& b = f.tensors.back();
    MPI_Request r;
    PARTITA_MPI_CHECK(MPI_Isend(b.data_ptr(), n, MPI_BYTE, dest, tag, raw, &r));
    f.requests.push_back(r);
    stats.pipeline_bytes += b.numel() * static_cast<int64_t>(b.element_size());
  }

  int grad_tag() const { return tag_of(kAct) + comm.max_tag(); }

  // RECV_F: the header and the activation from the previous stage, checked
  // against what this stage expects.
  void receive_activation(int c, int mb) {
    Part& m = parts[c][mb];
    const auto t0 = Clock::now();
    const int from = global(c) - 1;
    const std::string what = where(c, mb) + ": receiving the activation from stage " + std::to_string(from);
    std::vector<int64_t> h = receive_words(kHeaderWords, prev_rank(), kHeader, what);
    if (h[0] != kMagic) throw UsageError(what + ": not a pipeline header");
    if (h[1] != 0) throw UsageError(what + ": a header of unknown status " + std::to_string(h[1]));
    if (h[2] != mb || h[kStageWord] != from)
      throw UsageError(what + ": stage " + std::to_string(h[kStageWord]) + " sent microbatch " +
                       std::to_string(h[2]) + " where this stage runs microbatch " + std::to_string(mb) +
                       " of stage " + std::to_string(from) + " (the stages' schedules disagree)");
    m.x_shape.assign(h.begin() + 6 + kMaxDims, h.begin() + 6 + kMaxDims + h[5 + kMaxDims]);
    const std::vector<int64_t> shape(h.begin() + 5, h.begin() + 5 + h[4]);
    const auto dtype = static_cast<at::ScalarType>(h[3]);
    at::Tensor buffer = at::empty(shape, at::TensorOptions().dtype(dtype));
    receive_into(buffer, prev_rank(), tag_of(kAct), what);
    if (at::isFloatingType(dtype)) buffer.requires_grad_(true);
    m.input = buffer;
    stats.wait_seconds += seconds_since(t0);
  }

  // SEND_F: the header, then the activation, to the next stage.
  void send_activation(int c, int mb) {
    Part& m = parts[c][mb];
    if (m.sent) return;
    if (!m.forwarded) throw UsageError(where(c, mb) + ": SEND_F before the forward");
    // Before the header: the next stage would allocate what it announces.
    const std::string what = where(c, mb) + ": SEND_F";
    mpi_units(bytes_of(m.output), "bytes", what);
    post(header(0, mb, m.output, m.x_shape, global(c)), next_rank(), kHeader);
    send_tensor(m.output, next_rank(), tag_of(kAct), what);
    m.sent = true;
  }

  // Ranks but the last: the output's dtype and shape for this input. One
  // stage per rank: the last stage sends it after its first forward of a
  // model input of this shape. With virtual stages that forward comes after
  // this rank's later chunks, which wait for this call: the rank finds the
  // shape itself, running its copy of the whole model on x once per input
  // shape, in eval mode and without gradients (so that BatchNorm's running
  // statistics and Dropout's random numbers are untouched).
  std::vector<int64_t> output_shape(int mb, const at::Tensor& x) {
    const auto key = key_of(x);
    auto it = out_shapes.find(key);
    if (it != out_shapes.end()) return it->second;
    std::vector<int64_t> words;
    if (v == 1) {
      words = receive_words(2 + kMaxDims, peer(stages - 1), kShape,
                            where(mb) + ": receiving the output's shape from the last stage");
      words.resize(2 + words[1]);
    } else {
      std::vector<std::pair<torch::nn::Module*, bool>> modes;
      for (const auto& mod : root->modules()) modes.emplace_back(mod.get(), mod->is_training());
      auto restore = [&] {
        for (auto& [mod, on] : modes) mod->train(on);  // pre-order: a parent, then its children
      };
      at::Tensor h = x;
      try {
        at::NoGradGuard no_grad;
        root->eval();
        for (auto& call : calls) h = call(h);
      } catch (...) {
        restore();
        throw;
      }
      restore();
      words = {static_cast<int64_t>(h.scalar_type()), h.dim()};
      for (int64_t s : h.sizes()) words.push_back(s);
    }
    out_shapes.emplace(key, words);
    return words;
  }

  // F of chunk c: in the model's call (x given) or run by the executor.
  at::Tensor run_chunk(int c, int mb, const at::Tensor& x) {
    Part& m = parts[c][mb];
    at::Tensor h;
    if (first_stage(c)) {
      if (!x.defined()) throw UsageError(where(c, mb) + ": the first stage's forward outside the model's call");
      m.x_shape = x.sizes().vec();
      h = x;
      // Split: the input-gradient pass must reach the first layer's node to
      // leave its dy for W, so x becomes a leaf that takes a gradient.
      if (m.split && at::GradMode::is_enabled() && at::isFloatingType(x.scalar_type()))
        h = m.input = x.detach().requires_grad_(true);
    } else {
      if (!m.input.defined())
        throw UsageError(where(c, mb) + ": the forward runs before its activation was received (RECV_F)");
      h = m.input;
    }
    const auto t1 = Clock::now();
    int64_t bytes = 0;
    for (size_t i = 0; i < layers[c].size(); ++i) {
      const auto& linear = linears[c][i];
      // (Not under grad mode off, an evaluation: a split layer's node would
      // record history where nothing else does.)
      if (m.split && detail::can_split(linear.get(), h) && at::GradMode::is_enabled()) {
        if (!m.work) m.work = std::make_shared<detail::WeightGradWork>();
        h = detail::split_linear(*linear, h, m.work);
      } else {
        if (linear) m.linear_unsplit = true;
        h = layers[c][i](h);
      }
      bytes += h.numel() * static_cast<int64_t>(h.element_size());
    }
    stats.busy_seconds += seconds_since(t1);
    m.forwarded = true;
    m.bytes = bytes;
    ++stats.forwards;
    ++stats.live;
    stats.live_bytes += bytes;
    stats.peak_live = std::max(stats.peak_live, stats.live);
    stats.peak_bytes = std::max(stats.peak_bytes, stats.live_bytes);
    if (!last_stage(c)) {
      if (h.dim() > kMaxDims) throw UsageError(where(c, mb) + ": an activation of more than 12 dimensions");
      // The gradient must come back even through a stage without parameters.
      if (!h.requires_grad() && at::isFloatingType(h.scalar_type())) h = h.detach().requires_grad_(true);
      m.output = h;
    }
    return h;
  }

  // The model's call, inside the step function for microbatch mb: the F of
  // call_chunk().
  at::Tensor call(int mb, const at::Tensor& x) {
    touch();
    const int c = call_chunk();
    Part& part = parts[c][mb];
    if (!first_stage(c)) {
      if (!part.input.defined())
        throw UsageError(where(c, mb) + ": the forward runs before its activation was received (RECV_F)");
      if (at::IntArrayRef(part.x_shape) != x.sizes())
        throw UsageError(where(c, mb) + ": receiving the activation from stage " + std::to_string(global(c) - 1) +
                         ": mismatched microbatch shapes: stage 0 ran the model on an input of shape " +
                         shape_text(part.x_shape) + ", this stage was given " + shape_text(x.sizes()));
    }
    if (x.dim() > kMaxDims) throw UsageError(where(c, mb) + ": a model input of more than 12 dimensions");
    at::Tensor h = run_chunk(c, mb, x);
    Mb& m = mbs[mb];
    m.called = true;
    if (last()) {
      if (v == 1 && stages > 1 && !out_shapes.count(key_of(x))) {
        std::vector<int64_t> words{static_cast<int64_t>(h.scalar_type()), h.dim()};
        for (int64_t s : h.sizes()) words.push_back(s);
        words.resize(2 + kMaxDims, 0);
        for (int s = 0; s + 1 < stages; ++s) post(words, peer(s), kShape);
        out_shapes.emplace(key_of(x), std::vector<int64_t>(words.begin(), words.begin() + 2 + h.dim()));
      }
      m.target_tensor = h;
      m.target = h.grad_fn();
      return h;
    }
    // One stage per rank: the stand-in needs the output's shape, which the
    // last stage sends after its first forward of a model input of this
    // shape: the activation must be on its way first. The built-in
    // schedules (and with_comms) put SEND_F right after F; it runs here, and
    // its action then finds it done.
    if (v == 1 && !out_shapes.count(key_of(x))) {
      const auto& list = g_step->list;
      const size_t next = g_step->current + 1;
      if (next < list.size() && list[next].kind == ActionKind::kSendF && list[next].microbatch == mb &&
          list[next].stage == global(c))
        send_activation(c, mb);
    }
    const std::vector<int64_t> o = output_shape(mb, x);
    at::Tensor stand_in = at::zeros(std::vector<int64_t>(o.begin() + 2, o.end()),
                                    at::TensorOptions().dtype(static_cast<at::ScalarType>(o[0])));
    // Under grad mode off (an evaluation step) the stand-in records
    // nothing, as the output it stands for would not.
    if (at::isFloatingType(stand_in.scalar_type()) && at::GradMode::is_enabled()) {
      stand_in.requires_grad_(true);
      m.target = torch::autograd::impl::grad_accumulator(stand_in);
    }
    m.target_tensor = stand_in;
    return stand_in;
  }

  void request_backward(int mb, const at::Tensor& loss) {
    Mb& m = mbs[mb];
    const std::string what = "smp::DistributedModel::backward in microbatch " + std::to_string(mb);
    if (!m.called) throw UsageError(what + ": the model has not run in this microbatch");
    if (m.backward_requested) throw UsageError(what + ": called twice in one microbatch");
    if (!loss.defined() || loss.numel() != 1)
      throw UsageError(what + ": the loss must be a tensor of one element, got " +
                       (loss.defined() ? shape_text(loss.sizes()) : std::string("an undefined tensor")));
    if (m.target_tensor.requires_grad() && !depends_on(loss, m.target.get(), m.target_tensor))
      throw UsageError(what + ": the loss does not depend on the model's output");
    if (first_called >= 0 && first_called != mb && !mbs[first_called].backward_requested)
      throw UsageError(what + ": microbatch " + std::to_string(first_called) +
                       " did not call model.backward (every microbatch of a training step must, or none)");
    m.backward_requested = true;
    if (last()) m.loss = loss.reshape({}) / static_cast<double>(mbs.size());
  }

  // After the step function returned for mb: the first call decides whether
  // the step trains; every later one must agree.
  void after_call(int mb) {
    if (first_called < 0) {
      first_called = mb;
      training = mbs[mb].backward_requested;
    } else if (training && !mbs[mb].backward_requested) {
      throw UsageError(where(mb) + ": the step function did not call model.backward in this microbatch (it did in "
                                   "microbatch " + std::to_string(first_called) + ")");
    }
  }

  // Chunk c holds a distributed layer of which this rank stores no block.
  bool lacks_distributed_blocks(int c) const {
    for (int i = bounds[global(c)]; i < bounds[global(c) + 1]; ++i)
      for (const auto& sub : children[i]->modules(/*include_self=*/true))
        if (std::dynamic_pointer_cast<nn::DistributedLinearBase>(sub) && sub->parameters().empty()) return true;
    return false;
  }

  // This rank's parameters of one kind (detail::replicated_parameters or
  // detail::distributed_parameters) over its chunks, each tensor once: a
  // module used twice on the stage, or a tie within it, is one parameter,
  // whose gradient is averaged (or rescaled) once.
  std::vector<at::Tensor> stage_parameters(std::vector<at::Tensor> (*of)(const std::shared_ptr<torch::nn::Module>&)) const {
    std::vector<at::Tensor> out;
    std::unordered_set<const void*> seen;
    for (int c = 0; c < v; ++c)
      for (int i = bounds[global(c)]; i < bounds[global(c) + 1]; ++i)
        for (auto& p : of(children[i]))
          if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
    return out;
  }

  // The parameters of chunk c that take gradients (W's inputs).
  std::vector<at::Tensor> trainable(int c) const {
    std::vector<at::Tensor> out;
    for (int i = bounds[global(c)]; i < bounds[global(c) + 1]; ++i)
      for (auto& p : children[i]->parameters())
        if (p.requires_grad()) out.push_back(p);
    return out;
  }

  // What a backward starts from: the loss on the last stage, else the
  // output with the gradient RECV_B brought.
  std::pair<at::Tensor, std::vector<at::Tensor>> backward_root(int c, int mb, const char* kind) {
    Part& m = parts[c][mb];
    if (!m.forwarded) throw UsageError(where(c, mb) + ": " + kind + " before the forward");
    if (last_stage(c)) return {mbs[mb].loss, {}};
    if (!m.grad_out.defined())
      throw UsageError(where(c, mb) + ": " + kind + " before the output's gradient was received (RECV_B)");
    return {m.output, {m.grad_out}};
  }

  // The gradient of the received activation, after backward() put it there.
  void keep_input_grad(int c, Part& m) {
    if (first_stage(c) || !m.input.defined()) return;
    m.grad_in = m.input.grad().defined() ? m.input.grad() : at::zeros_like(m.input);
  }

  void release(int c, int mb) {
    Part& m = parts[c][mb];
    m.done = true;
    m.input = m.output = m.grad_out = at::Tensor();
    m.work.reset();
    if (c == call_chunk()) {
      mbs[mb].loss = mbs[mb].target_tensor = at::Tensor();
      mbs[mb].target.reset();
    }
    --stats.live;
    stats.live_bytes -= m.bytes;
  }

  // One executor action: every kind but the F of the model's call (which
  // runs in the step function). Without training (an evaluation step) the
  // backward kinds do nothing.
  void run(const Action& a) {
    const int mb = a.microbatch;
    const int c = chunk_of(a);
    Part& m = parts[c][mb];
    touch();
    switch (a.kind) {
      case ActionKind::kRecvF: receive_activation(c, mb); break;
      case ActionKind::kSendF: send_activation(c, mb); break;
      case ActionKind::kRecvB: {
        if (!training) break;
        const auto t0 = Clock::now();
        at::Tensor g = at::empty_like(m.output, at::MemoryFormat::Contiguous);
        receive_into(g, next_rank(), grad_tag(),
                     where(c, mb) + ": waiting for the gradient from stage " + std::to_string(global(c) + 1));
        m.grad_out = g;
        stats.wait_seconds += seconds_since(t0);
        break;
      }
      case ActionKind::kFullBackward: {
        if (!training) break;
        auto [out, grads] = backward_root(c, mb, "B");
        const auto t0 = Clock::now();
        if (out.requires_grad()) torch::autograd::backward({out}, grads);
        keep_input_grad(c, m);
        stats.busy_seconds += seconds_since(t0);
        ++stats.backwards;
        release(c, mb);
        break;
      }
      case ActionKind::kBackwardInput: {
        if (!training) break;
        auto [out, grads] = backward_root(c, mb, "I");
        const auto t0 = Clock::now();
        // Only the input's gradient (the received activation's; on the
        // first stage, x's, made a leaf so that the pass reaches the first
        // layer); Linear layers' nodes keep their dy for W, and the graph
        // stays for W.
        if (m.input.defined() && m.input.requires_grad() && out.requires_grad())
          torch::autograd::backward({out}, grads, /*retain_graph=*/true, /*create_graph=*/false, {m.input});
        keep_input_grad(c, m);
        stats.busy_seconds += seconds_since(t0);
        ++stats.backwards;
        break;
      }
      case ActionKind::kBackwardWeight: {
        if (!training) break;
        auto [out, grads] = backward_root(c, mb, "W");
        const auto t0 = Clock::now();
        // Only this stage's parameters' gradients (accumulated as a full
        // backward accumulates them), then the graph goes. The Linear
        // layers' from what I left (dy, and x saved by the forward); the
        // other layers' parameters by autograd restricted to them, which
        // goes down the graph again (split_backward.hpp).
        // A split Linear's parameters are left out of autograd's unless
        // something else in the chunk reaches them too: another module
        // holding the same tensor, or a Linear layer that ran whole.
        std::unordered_set<const c10::TensorImpl*> split_params;
        if (m.work && !m.linear_unsplit)
          for (const auto& e : m.work->entries)
            for (const at::Tensor* t : {&e.weight, &e.bias})
              if (t->defined() && !linear_params_shared[c].count(t->unsafeGetTensorImpl()))
                split_params.insert(t->unsafeGetTensorImpl());
        std::vector<at::Tensor> params;
        for (auto& p : trainable(c))
          if (!split_params.count(p.unsafeGetTensorImpl())) params.push_back(p);
        // A data-parallel copy of partita's distributed layers that holds
        // no block of one of them still owes, through that layer's adjoint,
        // its share of the gradient to the copy that stores it (docs/3d.md):
        // it runs the whole rest of the graph, which also gives its other
        // parameters (a LayerNorm's) their gradients. The received
        // activation's gradient was taken by I; a fresh one is accumulated
        // and dropped.
        const bool whole_graph = distributed && out.requires_grad() && lacks_distributed_blocks(c);
        if (whole_graph) {
          if (m.input.defined()) m.input.mutable_grad() = at::Tensor();
          torch::autograd::backward({out}, grads, /*retain_graph=*/false, /*create_graph=*/false);
        } else if (!params.empty() && out.requires_grad()) {
          torch::autograd::backward({out}, grads, /*retain_graph=*/false, /*create_graph=*/false, params);
          ++stats.weight_autograd_passes;
        }
        // (The split Linear layers' nodes lead to their inputs only: their
        // weights take their gradients here in both cases, from the dy the
        // passes recorded.)
        if (m.work) stats.weight_gradients_split += detail::weight_gradients(*m.work);
        stats.busy_seconds += seconds_since(t0);
        release(c, mb);
        break;
      }
      case ActionKind::kSendB: {
        if (!training) break;
        if (!m.grad_in.defined()) throw UsageError(where(c, mb) + ": SEND_B before its backward");
        send_tensor(m.grad_in, prev_rank(), grad_tag(), where(c, mb) + ": SEND_B");
        m.grad_in = at::Tensor();
        break;
      }
      case ActionKind::kForward: {
        // A chunk's forward outside the model's call (virtual stages), with
        // the gradient mode the step function had at the model's first call.
        at::AutoGradMode mode(grad_mode);
        run_chunk(c, mb, at::Tensor());
        break;
      }
    }
    stats.step_seconds = seconds_since(step_start);
  }

  // Which gradients of `params` each replica holds defined (row r of the
  // returned table: replica r's), exchanged ahead of the gradients on the
  // same tag (MPI keeps the order of messages between two ranks): a
  // gradient undefined on every replica (a parameter the step did not use)
  // stays undefined, as one process leaves it, and LibTorch's optimizers
  // then skip it as they do there. Kept in `g` (an abandoned request may
  // still read or write it).
  const uint8_t* post_defined(const std::vector<at::Tensor>& params, GradBuffer& g, MPI_Comm dpc, int tag,
                              const std::string& what, std::vector<MPI_Request>& requests) {
    const int dp = dp_size(), me = dp_rank();
    const int64_t n = static_cast<int64_t>(params.size());
    const int count = mpi_units(n, "parameters", what);
    if (!g.defined.defined() || g.defined.numel() != dp * n)
      g.defined = at::empty({dp * n}, at::TensorOptions(at::kByte));
    uint8_t* table = g.defined.data_ptr<uint8_t>();
    for (int64_t i = 0; i < n; ++i) table[me * n + i] = params[i].grad().defined() ? 1 : 0;
    for (int r = 0; r < dp; ++r) {
      if (r == me) continue;
      MPI_Request q;
      PARTITA_MPI_CHECK(MPI_Irecv(table + r * n, count, MPI_UINT8_T, r, tag, dpc, &q));
      requests.push_back(q);
      PARTITA_MPI_CHECK(MPI_Isend(table + me * n, count, MPI_UINT8_T, r, tag, dpc, &q));
      requests.push_back(q);
    }
    return table;
  }
  static bool defined_anywhere(const uint8_t* table, int dp, size_t n, size_t i) {
    for (int r = 0; r < dp; ++r)
      if (table[r * n + i]) return true;
    return false;
  }

  // all_reduce_gradients at two replicas: each sends its gradients one
  // message per parameter, in the parameters' order (the same on both, as
  // is each message's count), and receives the other's into one flat
  // buffer; the mean is then made one parameter at a time (while it is in
  // cache). A gradient that is defined, contiguous, plain and of the
  // parameter's dtype (the common case) is sent as it is and averaged in
  // place: two passes over it where packing, summing, dividing and
  // unpacking a flat buffer take four. Others are sent from a copy in the
  // parameter's dtype (zeros where undefined) as the general path packs
  // them. The values are the general path's: a + b is b + a in IEEE
  // arithmetic, then the division by 2.
  void average_two_replicas(at::ScalarType type, const std::vector<at::Tensor>& params, int64_t total,
                            GradBuffer& g) {
    const int other = 1 - dp_rank();
    if (static_cast<int>(g.got.size()) != 2) g.got.assign(2, at::Tensor());
    if (!g.got[other].defined() || g.got[other].numel() != total)
      g.got[other] = at::empty({total}, params[0].options());
    const at::Tensor got = g.got[other];
    // What each parameter sends: its gradient itself, or a copy.
    std::vector<at::Tensor> sent;
    sent.reserve(params.size());
    {
      at::NoGradGuard no_grad;
      for (const auto& p : params) {
        const at::Tensor& gr = p.grad();
        if (gr.defined() && gr.is_contiguous() && gr.scalar_type() == type && !gr.is_conj() && !gr.is_neg() &&
            gr.sizes() == p.sizes())
          sent.push_back(gr);
        else if (gr.defined())
          sent.push_back(at::empty(p.sizes(), p.options()).copy_(gr));
        else
          sent.push_back(at::zeros(p.sizes(), p.options()));
      }
    }
    const MPI_Comm dpc = communicator(DP_GROUP);
    const int tag = tag_of(kGrads);
    const MPI_Datatype dt = grad_datatype(type);
    const std::string what = where(0) + ": the dp average of the gradients";
    std::vector<MPI_Request> requests;
    requests.reserve(2 * params.size() + 2);
    const uint8_t* defined = post_defined(params, g, dpc, tag, what, requests);
    int64_t at_ = 0;
    for (const auto& p : params) {
      // (Every replica holds the same parameters: all raise alike.)
      const int count = mpi_units(p.numel(), "elements", what);
      MPI_Request q;
      PARTITA_MPI_CHECK(
          MPI_Irecv(static_cast<char*>(got.data_ptr()) + at_ * got.element_size(), count, dt, other, tag, dpc, &q));
      requests.push_back(q);
      at_ += p.numel();
    }
    for (const auto& t : sent) {
      MPI_Request q;
      PARTITA_MPI_CHECK(MPI_Isend(t.data_ptr(), static_cast<int>(t.numel()), dt, other, tag, dpc, &q));
      requests.push_back(q);
    }
    stats.data_parallel_bytes += total * static_cast<int64_t>(got.element_size());
    try {
      wait_requests(requests, what);
    } catch (...) {
      // Abandoned with the step: MPI may still read what was sent and
      // write the buffer, so both stay alive; the next step allocates anew.
      InFlight& f = g_step->inflight;
      f.requests.insert(f.requests.end(), requests.begin(), requests.end());
      f.tensors.push_back(got);
      f.tensors.insert(f.tensors.end(), sent.begin(), sent.end());
      f.tensors.push_back(g.defined);
      grad_buffers.erase(type);
      throw;
    }
    at::NoGradGuard no_grad;
    at_ = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor& gr = params[i].mutable_grad();
      at::Tensor& mine = sent[i];
      if (!defined_anywhere(defined, 2, params.size(), i)) {  // unused on both: left undefined
        at_ += params[i].numel();
        continue;
      }
      mine.add_(got.narrow(0, at_, params[i].numel()).view(params[i].sizes())).div_(2.0);
      at_ += params[i].numel();
      if (!gr.defined()) gr = mine;
      else if (!gr.is_same(mine)) gr.copy_(mine);
    }
  }

  // The replicas start alike, as DistributedDataParallel makes them: every
  // parameter the replicas average (all but those of partita's layers that
  // sum their copies' gradients or hold other blocks per replica) takes dp
  // rank 0's values, one broadcast over the dp group each. Every replica
  // built the same model (agreed in split_into_stages), so every one posts
  // the same broadcasts.
  void start_replicas_alike() {
    if (dp_size() == 1) return;
    std::vector<at::Tensor> params = stage_parameters(detail::replicated_parameters);
    // partita's own broadcast: its shape agreement (checked mode), waits,
    // deadlines and 16-bit dtypes, written into p where p is contiguous.
    const mpi::Communicator dp = mpi::Communicator::wrap(communicator(DP_GROUP));
    at::NoGradGuard no_grad;
    for (auto& p : params) {
      const at::Tensor got = dp.bcast_(p, 0);
      if (got.data_ptr() != p.data_ptr()) p.copy_(got);
    }
  }

  void all_reduce_gradients() {
    const int dp = dp_size();
    if (dp == 1) return;
    // One rule for every parameter (docs/3d.md): the step trains the mean
    // over the replicas of each replica's loss. partita's distributed layers
    // sum their replicas' gradients onto the stored copy (the adjoint of the
    // broadcast, or ZeRO-3's reduce-scatter): this step's part of that sum
    // becomes the mean. The other parameters are averaged below.
    {
      at::NoGradGuard no_grad;
      for (auto& [p, before] : distributed_grads_before) {
        if (!p.grad().defined()) continue;
        if (before.defined()) p.mutable_grad().sub_(before).div_(static_cast<double>(dp)).add_(before);
        else p.mutable_grad().div_(static_cast<double>(dp));
      }
      distributed_grads_before.clear();
    }
    std::vector<at::Tensor> local;
    // Not the parameters of partita's distributed layers that sum their
    // copies' gradients themselves (a replicated Linear layer's are here).
    for (auto& p : stage_parameters(detail::replicated_parameters))
      if (p.requires_grad()) local.push_back(p);
    std::map<at::ScalarType, std::vector<at::Tensor>> groups;
    for (auto& p : local) groups[p.scalar_type()].push_back(p);
    for (auto& [type, params] : groups) {
      // The gradients packed into one flat buffer per dtype, kept from step
      // to step with the receive buffers (nothing is allocated in a step
      // after the first). Not handed out as the gradients' storage:
      // LibTorch's zero_grad detaches gradients in place, which a view
      // cannot be.
      GradBuffer& g = grad_buffers[type];
      int64_t total = 0;
      for (auto& p : params) total += p.numel();
      if (dp == 2) {
        average_two_replicas(type, params, total, g);
        continue;
      }
      if (!g.flat.defined() || g.flat.numel() != total) g = GradBuffer{at::empty({total}, params[0].options()), {}, {}};
      {
        at::NoGradGuard no_grad;
        int64_t at_ = 0;
        for (auto& p : params) {
          at::Tensor slice = g.flat.narrow(0, at_, p.numel()).view(p.sizes());
          at_ += p.numel();
          if (p.grad().defined()) slice.copy_(p.grad());
          else slice.zero_();
        }
      }
      at::Tensor& buf = g.flat;
      // Point to point, tagged with the step (a collective left behind by a
      // failed step would match the next step's): every replica sends its
      // gradients to every other and each adds them in dp-rank order, so
      // all replicas get the same bits.
      const MPI_Comm dpc = communicator(DP_GROUP);
      const int me = dp_rank(), tag = tag_of(kGrads);
      // (Every replica holds the same parameters: all raise alike.)
      const int count = mpi_units(buf.numel(), "elements", where(0) + ": the dp average of the gradients");
      if (static_cast<int>(g.got.size()) != dp) g.got.assign(dp, at::Tensor());
      std::vector<MPI_Request> requests;
      const uint8_t* defined =
          post_defined(params, g, dpc, tag, where(0) + ": the dp average of the gradients", requests);
      for (int r = 0; r < dp; ++r) {
        if (r == me) continue;
        if (!g.got[r].defined()) g.got[r] = at::empty_like(buf);
        MPI_Request q;
        PARTITA_MPI_CHECK(MPI_Irecv(g.got[r].data_ptr(), count, grad_datatype(type), r, tag, dpc, &q));
        requests.push_back(q);
      }
      for (int r = 0; r < dp; ++r) {
        if (r == me) continue;
        MPI_Request q;
        PARTITA_MPI_CHECK(MPI_Isend(buf.data_ptr(), count, grad_datatype(type), r, tag, dpc, &q));
        requests.push_back(q);
        stats.data_parallel_bytes += buf.numel() * static_cast<int64_t>(buf.element_size());
      }
      try {
        wait_requests(requests, where(0) + ": the dp average of the gradients");
      } catch (...) {
        // Abandoned with the step: the requests keep their buffers (MPI
        // may still read or write them), and the next step allocates new
        // ones.
        InFlight& f = g_step->inflight;
        f.requests.insert(f.requests.end(), requests.begin(), requests.end());
        f.tensors.push_back(buf);
        for (auto& t : g.got)
          if (t.defined()) f.tensors.push_back(t);
        f.tensors.push_back(g.defined);
        grad_buffers.erase(type);
        throw;
      }
      // The sum in dp-rank order, then the mean, copied into the gradients.
      at::NoGradGuard no_grad;
      const auto part = [&](int r) -> const at::Tensor& { return r == me ? buf : g.got[r]; };
      if (!g.sum.defined()) g.sum = at::empty_like(buf);
      at::add_out(g.sum, part(0), part(1));
      for (int r = 2; r < dp; ++r) g.sum.add_(part(r));
      buf.copy_(g.sum);
      buf.div_(static_cast<double>(dp));
      int64_t at_ = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& p = params[i];
        const at::Tensor mean = buf.narrow(0, at_, p.numel()).view(p.sizes());
        at_ += p.numel();
        if (p.grad().defined()) p.mutable_grad().copy_(mean);
        else if (defined_anywhere(defined, dp, params.size(), i)) p.mutable_grad() = mean.clone();
      }
    }
  }

  void finish(const std::vector<at::Tensor*>& returned) {
    if (stages > 1) {
      // The last stage's returned tensors, every microbatch's in order.
      const int tag = tag_of(kReturned);
      if (last()) {
        std::vector<at::Tensor> mine;
        for (at::Tensor* t : returned) mine.push_back(t->defined() ? t->detach() : *t);
        // Above MPI's count the other stages get an error frame instead,
        // which their decoding raises, as this stage does.
        const message::OneMessage m = message::one_message(
            message::encode_ivalue(c10::IValue(c10::List<at::Tensor>(mine))),
            "the last stage's returned values: ");
        for (int s = 0; s + 1 < stages; ++s) post_bytes(m.frame, MPI_BYTE, 1, peer(s), tag, raw);
        if (!m.error.empty()) throw MessageError(where(0) + ": " + m.error);
      } else {
        const std::string bytes = receive_bytes(peer(stages - 1), tag, raw, where(0) + ": receiving the returned values from the last stage");
        const auto list = message::decode_ivalue(bytes.data(), bytes.size()).toTensorVector();
        if (list.size() != returned.size())
          throw UsageError("smp::step: the last stage returned " + std::to_string(list.size()) +
                           " tensors, stage " + std::to_string(stage) + " " + std::to_string(returned.size()) +
                           " (the step function must return the same structure on every stage)");
        for (size_t i = 0; i < list.size(); ++i) *returned[i] = list[i];
      }
    }
    for (int c = 0; c < v; ++c)  // an evaluation step's
      for (int mb = 0; mb < static_cast<int>(mbs.size()); ++mb)
        if (parts[c][mb].forwarded && !parts[c][mb].done) release(c, mb);
    if (training) all_reduce_gradients();
    // The distributed layers' share of the step (their counters move only
    // inside their calls, all of which ran by now).
    const nn::LayerTraffic now = nn::layer_traffic();
    stats.tensor_parallel_bytes = now.model_parallel - traffic_at_begin.model_parallel;
    stats.data_parallel_bytes += now.data_parallel - traffic_at_begin.data_parallel;
    end_agreement();
    wait_requests(g_step->inflight.requests, where(0) + ": messages to the other stages");
    g_step->inflight = InFlight{};
  }

  // No rank returns from a pipelined step until every rank got this far:
  // world rank 0 collects an "ok" from every other and answers each. A
  // rank that failed sends its notice instead, which every rank waiting
  // here hears (docs/pipeline.md).
  void end_agreement() {
    if (!g_step->listening) return;
    const int n = size(), me = rank(), tag = tag_of(kDone);
    const std::string what = who() + ": the end of the step (every rank's agreement that it succeeded)";
    InFlight& f = g_step->inflight;
    const std::string ok(8, '\1');
    if (me == 0) {
      std::vector<MPI_Request> requests;
      for (int r = 1; r < n; ++r) {
        f.bytes.push_back(std::string(8, '\0'));
        MPI_Request q;
        PARTITA_MPI_CHECK(MPI_Irecv(f.bytes.back().data(), 8, MPI_BYTE, r, tag, g_step->world, &q));
        requests.push_back(q);
      }
      try {
        wait_requests(requests, what);
      } catch (...) {
        f.requests.insert(f.requests.end(), requests.begin(), requests.end());
        throw;
      }
      for (int r = 1; r < n; ++r) post_bytes(ok, MPI_BYTE, 1, r, tag, g_step->world);
    } else {
      post_bytes(ok, MPI_BYTE, 1, 0, tag, g_step->world);
      receive_bytes(0, tag, g_step->world, what);
    }
  }
};

DistributedModel::DistributedModel(torch::nn::Sequential model, std::vector<int> split_points)
    : DistributedModel(std::static_pointer_cast<torch::nn::Module>(model.ptr()), std::move(split_points)) {}

DistributedModel::DistributedModel(std::shared_ptr<torch::nn::Module> model, std::vector<int> split_points)
    : impl_(std::make_shared<Impl>()) {
  Impl& m = *impl_;
  if (!model) throw UsageError("smp::DistributedModel: the model is a null module");
  m.root = model;
  // Stage s runs on pp rank s: the peer in the pipeline group with this
  // rank's tp and dp index (docs/3d.md); with tp_size 1, mp rank s.
  m.stage = pp_rank();
  m.stages = pp_size();
  // One rank holds the whole model: nothing to interleave (docs/pipeline.md).
  m.v = m.stages > 1 ? config().virtual_pipeline_model_parallel_size() : 1;
  detail::Stages st = detail::split_into_stages(model, split_points, m.stages, m.v);
  m.names = std::move(st.names);
  m.children = std::move(st.children);
  m.bounds = std::move(st.bounds);
  m.layers.resize(m.v);
  m.linears.resize(m.v);
  m.linear_params_shared.resize(m.v);
  for (int c = 0; c < m.v; ++c) {
    // Which modules of the chunk hold each parameter tensor.
    std::unordered_map<const c10::TensorImpl*, std::unordered_set<const torch::nn::Module*>> holders;
    for (int i = m.bounds[m.global(c)]; i < m.bounds[m.global(c) + 1]; ++i) {
      m.layers[c].push_back(st.calls[i]);
      m.linears[c].push_back(std::dynamic_pointer_cast<torch::nn::LinearImpl>(m.children[i]));
      m.distributed = m.distributed || detail::holds_distributed_layers(m.children[i]);
      for (const auto& sub : m.children[i]->modules(/*include_self=*/true))
        for (const auto& p : sub->parameters(/*recurse=*/false)) holders[p.unsafeGetTensorImpl()].insert(sub.get());
    }
    for (const auto& linear : m.linears[c])
      if (linear)
        for (const at::Tensor* t : {&linear->weight, &linear->bias})
          if (t->defined() && holders[t->unsafeGetTensorImpl()].size() > 1)
            m.linear_params_shared[c].insert(t->unsafeGetTensorImpl());
  }
  m.calls = std::move(st.calls);
  m.raw = communicator(PP_GROUP);
  m.comm = mpi::Communicator::wrap(m.raw);
  m.start_replicas_alike();
}

at::Tensor DistributedModel::operator()(const at::Tensor& x) {
  if (!g_step) throw UsageError("smp::DistributedModel: call the model inside an smp::step function");
  const int mb = microbatch();
  if (g_step->model && g_step->model != impl_.get())
    throw UsageError("smp::DistributedModel: one smp::step runs one DistributedModel; this step already ran another");
  if (!g_step->model) {
    // (a rank without a model told this one while its step function ran)
    if (g_step->no_model_heard > 0) throw_model_called_elsewhere(g_step->no_model_text);
    g_step->model_called = true;
    if (mb != 0)
      throw UsageError("smp::DistributedModel: the step function must call the model in every microbatch; "
                       "microbatch 0 did not");
    if (g_step->chunks != impl_->v)
      throw UsageError("smp::DistributedModel: the model holds " + std::to_string(impl_->v) +
                       " chunk(s) per rank (virtual_pipeline_model_parallel_size when it was built), the step's "
                       "schedule " + std::to_string(g_step->chunks) +
                       " stage(s) per rank; build the model after smp::init, with the configuration the steps use");
    impl_->begin_step(*g_step);
    impl_->grad_mode = at::GradMode::is_enabled();
    g_step->model = impl_.get();
    const size_t now = g_step->current;
    for (size_t i : g_step->pending) {
      g_step->current = i;
      const Action& a = g_step->list[i];
      detail::MicrobatchScope scope(a.microbatch, g_step->microbatches);
      impl_->run(a);
    }
    g_step->pending.clear();
    g_step->current = now;
  }
  if (impl_->mbs[mb].called)
    throw UsageError("smp::DistributedModel: called twice in microbatch " + std::to_string(mb) +
                     " (once per microbatch)");
  if (!x.defined()) throw UsageError("smp::DistributedModel: the input is an undefined tensor");
  return impl_->call(mb, x);  // a failure reaches the other stages through PipelineStep::fail
}

void DistributedModel::backward(const at::Tensor& loss) {
  if (!g_step || g_step->model != impl_.get())
    throw UsageError("smp::DistributedModel::backward: call it inside an smp::step function, after the model");
  impl_->request_backward(microbatch(), loss);
}

int DistributedModel::stage() const { return impl_->stage; }
int DistributedModel::stages() const { return impl_->stages; }
int DistributedModel::virtual_stages() const { return impl_->v; }
std::vector<int> DistributedModel::local_stages() const {
  std::vector<int> out;
  for (int c = 0; c < impl_->v; ++c) out.push_back(impl_->global(c));
  return out;
}
int DistributedModel::first_layer() const { return impl_->bounds[impl_->stage]; }
int DistributedModel::end_layer() const { return impl_->bounds[impl_->stage + 1]; }
const std::vector<int>& DistributedModel::bounds() const { return impl_->bounds; }
const PipelineStats& DistributedModel::stats() const { return impl_->stats; }

std::vector<at::Tensor> DistributedModel::parameters() const {
  std::vector<at::Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> DistributedModel::named_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (int k : local_stages())
    for (int i = impl_->bounds[k]; i < impl_->bounds[k + 1]; ++i)
      for (const auto& item : impl_->children[i]->named_parameters())
        out.emplace_back(impl_->names[i] + "." + item.key(), item.value());
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> DistributedModel::named_layers() const {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> out;
  for (int k : local_stages())
    for (int i = impl_->bounds[k]; i < impl_->bounds[k + 1]; ++i) out.emplace_back(impl_->names[i], impl_->children[i]);
  return out;
}

// --- smp::step's side -----------------------------------------------------------

namespace {
std::optional<Schedule>& g_user_schedule() {
  static std::optional<Schedule> s;
  return s;
}

// The schedule of a step of `microbatches` on `ranks` pipeline ranks: the
// user's (set_schedule) or the configuration's (with v stages per rank).
// What this executor runs: stage k on pp rank k mod ranks (Megatron's
// placement of virtual stages; stage s on rank s when there is one per rank).
Schedule step_schedule(int ranks, int microbatches, const std::string& configured, int v) {
  const auto& user = g_user_schedule();
  Schedule s;
  if (user) {
    s = *user;
    if (s.ranks != ranks)
      throw ScheduleError("pipeline schedule: \"" + s.name + "\" is for " + std::to_string(s.ranks) +
                          " ranks, the pipeline has " + std::to_string(ranks) + " (pp_size)");
    if (s.microbatches != microbatches)
      throw ScheduleError("pipeline schedule: \"" + s.name + "\" is for " + std::to_string(s.microbatches) +
                          " microbatches, the step has " + std::to_string(microbatches));
  } else {
    s = build_schedule(configured, ranks, microbatches, v);
  }
  if (s.stages % s.ranks != 0)
    throw ScheduleError("pipeline schedule: \"" + s.name + "\" has " + std::to_string(s.stages) + " stages on " +
                        std::to_string(s.ranks) + " ranks; the executor runs the same number of stages on every "
                        "rank");
  const std::vector<int> owner = s.stage_ranks();
  for (int k = 0; k < s.stages; ++k)
    if (owner[k] != k % s.ranks)
      throw ScheduleError("pipeline schedule: \"" + s.name + "\" runs stage " + std::to_string(k) + " on rank " +
                          std::to_string(owner[k]) + "; the executor runs stage k on pp rank k mod " +
                          std::to_string(s.ranks));
  return s;
}
}  // namespace

void set_schedule(std::optional<Schedule> s) { g_user_schedule() = std::move(s); }
const std::optional<Schedule>& user_schedule() { return g_user_schedule(); }

namespace detail {

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return shape_text(t.sizes()) + " " + c10::toString(t.scalar_type());
}

PipelineStep::PipelineStep(int microbatches, std::string fingerprint) {
  if (g_step) throw UsageError("smp::step: a step cannot run inside another step");
  const bool pipelined = initialized();
  const int ranks = pipelined ? pp_size() : 1, me = pipelined ? pp_rank() : 0;
  // The whole schedule, verified on every rank before anything is sent: a
  // bad one raises the same ScheduleError everywhere (docs/pipeline.md).
  const int v = pipelined && ranks > 1 ? config().virtual_pipeline_model_parallel_size() : 1;
  // A schedule this rank refuses (its microbatch count differing from the
  // other ranks' is enough) is told to every rank below, as a failed step:
  // the others would otherwise wait for this rank's messages.
  std::exception_ptr refused;
  Schedule s;
  std::vector<Action> list;
  try {
    s = step_schedule(ranks, microbatches, pipelined ? config().pipeline() : std::string("simple"), v);
    verify(s);
    list = with_comms(s).actions[me];
  } catch (const UsageError&) {
    refused = std::current_exception();
    list.clear();
  }
  // The step function runs at the forward of the model's call: of the
  // rank's first stage, or of the model's last stage on the rank holding
  // it (one and the same with one stage per rank; docs/pipeline.md).
  const int call_stage = me == ranks - 1 ? s.stages - 1 : me;
  for (size_t i = 0; i < list.size(); ++i)
    actions_.push_back(list[i].kind == ActionKind::kForward && list[i].stage == call_stage
                           ? list[i].microbatch
                           : -static_cast<int>(i) - 1);
  g_step = new StepState();
  g_step->microbatches = microbatches;
  g_step->fingerprint = std::move(fingerprint);
  g_step->list = std::move(list);
  g_step->chunks = refused ? 1 : s.stages / s.ranks;
  if (pipelined && size() > 1) {
    g_step->epoch = next_step_number();
    g_step->world = communicator(WORLD);
    g_step->epochs = epochs_for(g_step->world);
    g_step->listening = true;
    g_step->check = [] { check_abort(); };
    g_step->interrupt = std::make_unique<mpi::ScopedWaitInterrupt>(&g_step->check);
  }
  if (refused) {
    current_ = kStartOfStep;
    fail(refused);
    g_step->interrupt.reset();
    delete g_step;
    g_step = nullptr;
    std::rethrow_exception(refused);
  }
}

PipelineStep::~PipelineStep() {
  if (!finished_ && !failed_) fail(nullptr);  // (an exception that bypassed Step's catch)
  g_step->interrupt.reset();
  delete g_step;
  g_step = nullptr;
}

void PipelineStep::fail(std::exception_ptr error) noexcept {
  if (failed_ || !g_step) return;
  failed_ = true;
  if (g_step->listening) ++g_failed_steps;
  try {
    if (g_step->listening && !g_step->aborted) {
      // The notice: 'U' when the error is an smp::UsageError (the others
      // raise one too), else 'E'; then what failed where.
      char code = 'E';
      std::string cause = "an error";
      try {
        if (error) std::rethrow_exception(error);
      } catch (const UsageError& e) {
        code = 'U';
        cause = e.what();
      } catch (const std::exception& e) {
        cause = e.what();
      } catch (...) {
        cause = "an exception that is not a std::exception";
      }
      if (cause.size() > 3000) cause = cause.substr(0, 3000) + "...";
      std::string phase = current_ == kStartOfStep ? "the start of the step (its schedule)" : "the end of the step";
      if (current_ != kFinish && current_ != kStartOfStep && current_ >= 0 && static_cast<size_t>(current_) < g_step->list.size()) {
        const Action& a = g_step->list[current_];
        const char* what = a.kind == ActionKind::kForward       ? "the forward"
                           : a.kind == ActionKind::kFullBackward  ? "the backward"
                           : a.kind == ActionKind::kBackwardInput ? "the input-gradient backward"
                           : a.kind == ActionKind::kBackwardWeight ? "the weight-gradient backward"
                                                                   : "the message";
        phase = std::string(what) + " of microbatch " + std::to_string(a.microbatch);
      }
      const std::string text =
          code + std::string("smp::step: ") + who() + " failed in " + phase + ": " + cause;
      const int n = size(), me = rank(), tag = tag_of(kAbort);
      for (int r = 0; r < n; ++r)
        if (r != me) post_bytes(text, MPI_CHAR, 1, r, tag, g_step->world);
    }
  } catch (...) {
  }
  // Leave nothing that a later step could match or that MPI may still use:
  // the step's messages are abandoned with their buffers, the model's
  // microbatches (their graphs hold the activations' sends and receives)
  // too, and the cached output shapes forgotten (the last stage may have
  // sent one that this stage never received; every stage of a failed step
  // forgets them alike).
  try {
    abandon_in_flight(g_step->inflight);
    if (DistributedModel::Impl* m = g_step->model) {
      abandon(std::move(m->mbs));
      abandon(std::move(m->parts));
      m->mbs.clear();
      m->parts.clear();
      m->out_shapes.clear();
    }
  } catch (...) {
  }
}

void PipelineStep::after_forward(int mb, const std::vector<at::Tensor>& returned) {
  DistributedModel::Impl* m = g_step->model;
  if (!m) return;
  const auto& state = m->mbs[mb];
  if (!state.called)
    throw UsageError("smp::step: the step function called the DistributedModel in microbatch 0 but not in "
                     "microbatch " + std::to_string(mb));
  m->after_call(mb);
  if (!state.target_tensor.defined() || !state.target_tensor.requires_grad()) return;  // nothing to trace
  for (const auto& t : returned)
    if (depends_on(t, state.target.get(), state.target_tensor)) return;
  throw UsageError("smp::step: in microbatch " + std::to_string(mb) +
                   ", the step function's return value does not depend on the output of the "
                   "smp::DistributedModel (seed 004: it must; return the loss or the output)");
}

void PipelineStep::enter(int index) {
  current_ = index;
  if (index >= 0) g_step->current = static_cast<size_t>(index);
}

void PipelineStep::run(int index) {
  if (!g_step->model) {
    // The model is known at its first call; what comes before it (a
    // RECV_F) runs then. A step function without a model runs nothing.
    g_step->pending.push_back(static_cast<size_t>(index));
    return;
  }
  const Action& a = g_step->list[index];
  MicrobatchScope scope(a.microbatch, g_step->microbatches);
  g_step->model->run(a);
}

void PipelineStep::finish(const std::vector<at::Tensor*>& returned) {
  if (g_step->model) {
    g_step->model->finish(returned);
  } else if (g_step->listening) {
    // A step without a model is fine on every rank at once; where another
    // rank called one, it would wait for this rank's activations or
    // gradients. This rank tells every other ('N'); a rank that called the
    // model fails on hearing it, and its notice ends this wait with its
    // error. Every rank without a model hears every other's 'N'.
    const std::string text = "Nsmp::step: the step function did not call an smp::DistributedModel on " + who();
    const int n = size(), me = rank(), tag = tag_of(kAbort);
    for (int r = 0; r < n; ++r)
      if (r != me) post_bytes(text, MPI_CHAR, 1, r, tag, g_step->world);
    wait_for_neighbour([] { return g_step->no_model_heard == size() - 1; },
                       who() + ": the step without a model (every other rank's statement that it ran none)");
    wait_requests(g_step->inflight.requests, who() + ": the step without a model");
    g_step->inflight = InFlight{};
  }
  finished_ = true;
}

}  // namespace detail

}  // namespace partita::smp
