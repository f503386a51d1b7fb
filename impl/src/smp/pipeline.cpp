// smp::DistributedModel and the pipeline schedules (issue 14,
// docs/pipeline.md): the stages of a model (a torch::nn::Sequential or any
// module of ordered one-tensor children) on the mp group,
// activations forward and gradients back through the differentiable
// communicator, and smp::step's per-call state (detail::PipelineStep).
//
// Messages (docs/pipeline.md has the table; every tag carries the step's
// number, see TagKind), mostly between neighbouring stages on the mp group's
// communicator:
//   kHeader   a fixed-size int64 header before every activation: the
//             microbatch, the activation's dtype and shape and the shape of
//             the x stage 0 was given;
//   kAct      the activation, Communicator::isend/irecv (the gradient comes
//             back on kAct + max_tag, the communicator's adjoint);
//   kShape    the last stage tells every other stage the output's shape and
//             dtype, once per model input shape (their stand-in);
//   kAbort    a rank whose step failed tells every other (smp's world), and
//             every wait inside the step listens for it.
// A stage's forward send is not waited on until its backward: with
// rendezvous-sized activations a 1F1B stage would otherwise block in F(i+w)
// while its successor blocks sending it the gradient of B(i).
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
#include <sstream>
#include <unordered_set>

#include "partita/mpi/communicator.hpp"
#include "partita/mpi/poll.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/smp/communicators.hpp"
#include "partita/smp/message.hpp"
#include "partita/smp/step.hpp"

namespace partita::smp {

// --- schedules (pure) -----------------------------------------------------------

Pipeline pipeline_from_name(const std::string& name) {
  if (name == "simple") return Pipeline::kSimple;
  if (name == "interleaved") return Pipeline::kInterleaved;
  throw ConfigError("smp pipeline: expected \"interleaved\" or \"simple\", got \"" + name + "\"");
}

const char* name(Pipeline p) { return p == Pipeline::kSimple ? "simple" : "interleaved"; }

std::vector<PipelineAction> schedule(Pipeline p, int stage, int stages, int microbatches) {
  if (stages < 1 || stage < 0 || stage >= stages || microbatches < 1)
    throw UsageError("smp::schedule: stage " + std::to_string(stage) + " of " + std::to_string(stages) +
                     " with " + std::to_string(microbatches) + " microbatches");
  using A = PipelineAction;
  std::vector<A> out;
  if (p == Pipeline::kSimple) {
    for (int i = 0; i < microbatches; ++i) out.push_back({A::kForward, i});
    for (int i = 0; i < microbatches; ++i) out.push_back({A::kBackward, i});
    return out;
  }
  // 1F1B: stage s runs (stages - 1 - s) forwards ahead (warm-up), then
  // alternates one forward and one backward, then drains the backwards. The
  // last stage runs every backward right after its forward.
  const int warm = std::min(stages - 1 - stage, microbatches);
  for (int i = 0; i < warm; ++i) out.push_back({A::kForward, i});
  for (int i = warm; i < microbatches; ++i) {
    out.push_back({A::kForward, i});
    out.push_back({A::kBackward, i - warm});
  }
  for (int i = microbatches - warm; i < microbatches; ++i) out.push_back({A::kBackward, i});
  return out;
}

int peak_live(const std::vector<PipelineAction>& actions) {
  int live = 0, peak = 0;
  for (const auto& a : actions) {
    live += a.kind == PipelineAction::kForward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

std::vector<int> balance_by_parameters(const std::vector<int64_t>& params, int stages) {
  const int n = static_cast<int>(params.size());
  if (stages < 1 || n < stages)
    throw UsageError("smp::DistributedModel: the model has " + std::to_string(n) + " layers, fewer than the " +
                     std::to_string(stages) +
                     " pipeline stages (partitions); every stage needs at least one layer");
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + params[i];
  // best[k][i]: the smallest possible largest stage of the first i layers in
  // k stages; cut[k][i] the start of the last of them (the earliest on ties).
  const int64_t inf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(stages + 1, std::vector<int64_t>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int i = k; i <= n - (stages - k); ++i)
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == inf) continue;
        const int64_t v = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (v < best[k][i]) {
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
  std::vector<int> bounds(stages + 1, 0);
  bounds[stages] = n;
  for (int k = stages, i = n; k > 0; --k) {
    i = cut[k][i];
    bounds[k - 1] = i;
  }
  return bounds;
}

// --- the step's state -----------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Every message of a step has a tag of its step's number (the epoch, agreed
// at smp::init, the same on every rank) and its kind, so that what a
// failed step left unreceived never matches a later step's receive.
// kAbort and kDone travel on smp's world communicator, beside smp's object
// messages (tag 4004 = 4 mod 8, a kind that never goes there); kGrads on the
// dp group's; the others on the mp group's.
enum TagKind { kAct = 0, kHeader = 1, kShape = 2, kAbort = 3, kReturned = 4, kFingerprint = 5, kGrads = 6, kDone = 7 };
constexpr int kTagBase = 1400;
constexpr long kMaxEpochs = 1 << 20;
constexpr int64_t kMagic = 0x45504950;  // "PIPE"
constexpr int kMaxDims = 12;
constexpr int kHeaderWords = 6 + 2 * kMaxDims;  // magic, status, mb, dtype, ndim, dims, xndim, xdims

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
  InFlight inflight;
  std::function<void()> check;     // check_abort, for ScopedWaitInterrupt
  std::unique_ptr<mpi::ScopedWaitInterrupt> interrupt;
};
StepState* g_step = nullptr;

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

// Things a failed step leaves to MPI: never freed.
std::vector<std::shared_ptr<void>>& abandoned() {
  static auto* v = new std::vector<std::shared_ptr<void>>();
  return *v;
}
template <typename T>
void abandon(T&& x) {
  abandoned().push_back(std::make_shared<std::decay_t<T>>(std::forward<T>(x)));
}
void abandon_in_flight(InFlight& f) {
  for (auto& r : f.requests)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  f.requests.clear();
  abandon(std::move(f));
  f = InFlight{};
}

void post_bytes(std::string bytes, MPI_Datatype type, int count_divisor, int dest, int tag, MPI_Comm comm) {
  InFlight& f = g_step->inflight;
  f.bytes.push_back(std::move(bytes));
  MPI_Request r;
  PARTITA_MPI_CHECK(MPI_Isend(f.bytes.back().data(), static_cast<int>(f.bytes.back().size()) / count_divisor, type,
                              dest, tag, comm, &r));
  f.requests.push_back(r);
}

std::string who() {
  return "stage " + std::to_string(mp_rank()) + " of " + std::to_string(mp_size()) + ", world rank " +
         std::to_string(rank());
}

// Another rank's notice that it failed in this step: raise it here.
// 'U' (its error was an smp::UsageError) raises smp::UsageError, anything
// else smp::PipelineError; the text names the failed stage and its error.
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
  g_step->aborted = true;
  const char code = text.empty() ? 'E' : text[0];
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
  std::vector<detail::LayerCall> layers;                    // this stage's
  std::vector<int> bounds;
  int stage = 0, stages = 1;
  mpi::Communicator comm;  // the mp group
  MPI_Comm raw = MPI_COMM_NULL;
  // The output's dtype and shape for a model input of a given dtype and
  // shape (the stand-in on stages before the last).
  std::map<std::vector<int64_t>, std::vector<int64_t>> out_shapes;

  struct Mb {
    bool forwarded = false, backward_requested = false, done = false;
    mpi::WaitHandle send;        // stages before the last: the activation's isend
    at::Tensor input;            // stages after the first: the received activation
    at::Tensor loss;             // the last stage: loss / microbatches
    at::Tensor target_tensor;    // the output (or stand-in) returned to the step
    std::shared_ptr<torch::autograd::Node> target;  // its node in the graph
    int64_t bytes = 0;
    Clock::time_point input_grad_at{};  // when the backward reached this stage's input
  };
  std::vector<Mb> mbs;
  bool training = false;
  long steps_begun = 0;
  PipelineStats stats;
  Clock::time_point step_start;
  bool step_started = false;

  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }

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
    training = false;
    stats = PipelineStats{};
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

  std::vector<int64_t> header(int64_t status, int mb, const at::Tensor& act, const at::Tensor& x) const {
    std::vector<int64_t> h(kHeaderWords, 0);
    h[0] = kMagic;
    h[1] = status;
    h[2] = mb;
    if (status != 0) return h;
    h[3] = static_cast<int64_t>(act.scalar_type());
    h[4] = act.dim();
    for (int64_t i = 0; i < act.dim(); ++i) h[5 + i] = act.size(i);
    h[5 + kMaxDims] = x.dim();
    for (int64_t i = 0; i < x.dim(); ++i) h[6 + kMaxDims + i] = x.size(i);
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

  // Stages after the first: the header and the activation from the previous
  // stage, checked against what this stage expects.
  at::Tensor receive(int mb, const at::Tensor& x) {
    const std::string what = where(mb) + ": receiving the activation from stage " + std::to_string(stage - 1);
    std::vector<int64_t> h = receive_words(kHeaderWords, stage - 1, kHeader, what);
    if (h[0] != kMagic) throw UsageError(what + ": not a pipeline header");
    if (h[1] != 0) throw UsageError(what + ": a header of unknown status " + std::to_string(h[1]));
    if (h[2] != mb)
      throw UsageError(what + ": stage " + std::to_string(stage - 1) + " sent microbatch " + std::to_string(h[2]) +
                       " where this stage runs microbatch " + std::to_string(mb) +
                       " (the stages' schedules disagree)");
    const std::vector<int64_t> xs(h.begin() + 6 + kMaxDims, h.begin() + 6 + kMaxDims + h[5 + kMaxDims]);
    if (at::IntArrayRef(xs) != x.sizes())
      throw UsageError(what + ": mismatched microbatch shapes: stage 0 ran the model on an input of shape " +
                       shape_text(xs) + ", this stage was given " + shape_text(x.sizes()));
    const std::vector<int64_t> shape(h.begin() + 5, h.begin() + 5 + h[4]);
    const auto dtype = static_cast<at::ScalarType>(h[3]);
    at::Tensor buffer = at::empty(shape, at::TensorOptions().dtype(dtype));
    if (at::isFloatingType(dtype)) buffer.requires_grad_(true);
    // The activation follows its header at once: wait for it even if
    // another stage fails meanwhile (an abandoned receive would write into
    // freed memory); the deadline still bounds it.
    mpi::ScopedWaitInterrupt deaf(nullptr);
    return comm.recv(buffer, stage - 1, tag_of(kAct));
  }

  // Stages before the last: the output's dtype and shape for this input.
  std::vector<int64_t> output_shape(int mb, const at::Tensor& x) {
    const auto key = key_of(x);
    auto it = out_shapes.find(key);
    if (it != out_shapes.end()) return it->second;
    std::vector<int64_t> words = receive_words(2 + kMaxDims, stages - 1, kShape,
                                               where(mb) + ": receiving the output's shape from the last stage");
    words.resize(2 + words[1]);
    out_shapes.emplace(key, words);
    return words;
  }

  at::Tensor forward(int mb, const at::Tensor& x) {
    touch();
    Mb& m = mbs[mb];
    const auto t0 = Clock::now();
    at::Tensor h = first() ? x : receive(mb, x);
    if (!first()) m.input = h;
    const auto t1 = Clock::now();
    if (!first() && h.requires_grad()) {
      // When the gradient of the received activation is ready, the stage's
      // work for this backward is done; what follows is sending it back,
      // which waits for the previous stage to receive (rendezvous).
      h.register_hook([self = weak_from_this(), step = steps_begun, mb](const at::Tensor& g) {
        if (auto m = self.lock(); m && m->steps_begun == step && mb < static_cast<int>(m->mbs.size()))
          m->mbs[mb].input_grad_at = Clock::now();
        return g;
      });
    }
    stats.wait_seconds += std::chrono::duration<double>(t1 - t0).count();
    int64_t bytes = 0;
    for (auto& layer : layers) {
      h = layer(h);
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
    if (last()) {
      if (stages > 1 && !out_shapes.count(key_of(x))) {
        std::vector<int64_t> words{static_cast<int64_t>(h.scalar_type()), h.dim()};
        for (int64_t s : h.sizes()) words.push_back(s);
        words.resize(2 + kMaxDims, 0);
        for (int s = 0; s + 1 < stages; ++s) post(words, s, kShape);
        out_shapes.emplace(key_of(x), std::vector<int64_t>(words.begin(), words.begin() + 2 + h.dim()));
      }
      m.target_tensor = h;
      m.target = h.grad_fn();
      return h;
    }
    if (h.dim() > kMaxDims) throw UsageError(where(mb) + ": an activation of more than 12 dimensions");
    // The gradient must come back even through a stage without parameters.
    if (!h.requires_grad() && at::isFloatingType(h.scalar_type())) h = h.detach().requires_grad_(true);
    post(header(0, mb, h, x), stage + 1, kHeader);
    m.send = comm.isend(h, stage + 1, tag_of(kAct));
    const std::vector<int64_t> o = output_shape(mb, x);
    at::Tensor stand_in = at::zeros(std::vector<int64_t>(o.begin() + 2, o.end()),
                                    at::TensorOptions().dtype(static_cast<at::ScalarType>(o[0])));
    if (at::isFloatingType(stand_in.scalar_type())) {
      stand_in.requires_grad_(true);
      m.target = torch::autograd::impl::grad_accumulator(stand_in);
    }
    m.target_tensor = stand_in;
    return stand_in;
  }

  void request_backward(int mb, const at::Tensor& loss) {
    Mb& m = mbs[mb];
    const std::string what = "smp::DistributedModel::backward in microbatch " + std::to_string(mb);
    if (!m.forwarded) throw UsageError(what + ": the model has not run in this microbatch");
    if (m.backward_requested) throw UsageError(what + ": called twice in one microbatch");
    if (!loss.defined() || loss.numel() != 1)
      throw UsageError(what + ": the loss must be a tensor of one element, got " +
                       (loss.defined() ? shape_text(loss.sizes()) : std::string("an undefined tensor")));
    if (m.target_tensor.requires_grad() && !depends_on(loss, m.target.get(), m.target_tensor))
      throw UsageError(what + ": the loss does not depend on the model's output");
    if (mb > 0 && !mbs[0].backward_requested)
      throw UsageError(what + ": microbatch 0 did not call model.backward (every microbatch of a training step "
                              "must, or none)");
    m.backward_requested = true;
    if (last()) m.loss = loss.reshape({}) / static_cast<double>(mbs.size());
  }

  void backward(int mb) {
    Mb& m = mbs[mb];
    if (!m.forwarded) return;  // checked in after_forward
    if (mb == 0) training = m.backward_requested;
    if (training && !m.backward_requested)
      throw UsageError(where(mb) + ": the step function did not call model.backward in this microbatch (it did in "
                                   "microbatch 0)");
    touch();
    if (training) {
      // The work ends when the gradient reaches the stage's input (stage 0:
      // when backward returns); sending it back is waiting.
      auto account = [&](Clock::time_point start) {
        const auto end = Clock::now();
        const auto work_end = first() || m.input_grad_at == Clock::time_point{} ? end : m.input_grad_at;
        stats.busy_seconds += std::chrono::duration<double>(work_end - start).count();
        stats.wait_seconds += std::chrono::duration<double>(end - work_end).count();
      };
      if (last()) {
        const auto t = Clock::now();
        torch::autograd::backward({m.loss});
        account(t);
      } else {
        // Wait for the next stage's gradient first, so that the time spent
        // waiting is not counted as work.
        const auto t0 = Clock::now();
        const int tag = tag_of(kAct) + comm.max_tag();
        const int peer = stage + 1;
        wait_for_neighbour(
            [&] {
              int flag = 0;
              PARTITA_MPI_CHECK(MPI_Iprobe(peer, tag, raw, &flag, MPI_STATUS_IGNORE));
              return flag != 0;
            },
            where(mb) + ": waiting for the gradient from stage " + std::to_string(peer));
        const auto t1 = Clock::now();
        stats.wait_seconds += std::chrono::duration<double>(t1 - t0).count();
        at::Tensor sent = comm.wait(m.send);
        torch::autograd::backward({sent}, {at::zeros_like(sent)});
        account(t1);
      }
      ++stats.backwards;
    } else if (!last()) {
      comm.wait(m.send);  // forward only: the send must still finish
    }
    m.done = true;
    m.send = mpi::WaitHandle();
    m.input = at::Tensor();
    m.loss = at::Tensor();
    m.target_tensor = at::Tensor();
    m.target.reset();
    --stats.live;
    stats.live_bytes -= m.bytes;
    stats.step_seconds = seconds_since(step_start);
  }

  void all_reduce_gradients() {
    const int dp = dp_size();
    if (dp == 1) return;
    std::vector<at::Tensor> local;
    for (int i = bounds[stage]; i < bounds[stage + 1]; ++i)
      for (auto& p : children[i]->parameters())
        if (p.requires_grad()) local.push_back(p);
    std::map<at::ScalarType, std::vector<at::Tensor>> groups;
    for (auto& p : local) groups[p.scalar_type()].push_back(p);
    for (auto& [type, params] : groups) {
      std::vector<at::Tensor> flat;
      for (auto& p : params) flat.push_back(p.grad().defined() ? p.grad().reshape(-1) : at::zeros({p.numel()}, p.options()));
      at::Tensor buf = at::cat(flat).contiguous();
      // Point to point, tagged with the step (a collective left behind by a
      // failed step would match the next step's): every replica sends its
      // gradients to every other and each adds them in dp-rank order, so
      // all replicas get the same bits.
      const MPI_Comm dpc = communicator(DP_GROUP);
      const int me = dp_rank(), tag = tag_of(kGrads);
      const int count = static_cast<int>(buf.numel());
      InFlight& f = g_step->inflight;
      std::vector<MPI_Request> requests;
      std::vector<at::Tensor> got(dp);
      for (int r = 0; r < dp; ++r) {
        if (r == me) continue;
        got[r] = at::empty_like(buf);
        f.tensors.push_back(got[r]);
        MPI_Request q;
        PARTITA_MPI_CHECK(MPI_Irecv(got[r].data_ptr(), count, grad_datatype(type), r, tag, dpc, &q));
        requests.push_back(q);
      }
      f.tensors.push_back(buf);
      for (int r = 0; r < dp; ++r) {
        if (r == me) continue;
        MPI_Request q;
        PARTITA_MPI_CHECK(MPI_Isend(buf.data_ptr(), count, grad_datatype(type), r, tag, dpc, &q));
        requests.push_back(q);
      }
      try {
        wait_requests(requests, where(0) + ": the dp average of the gradients");
      } catch (...) {
        f.requests.insert(f.requests.end(), requests.begin(), requests.end());  // abandoned with the step
        throw;
      }
      got[me] = buf;
      at::Tensor sum = got[0].clone();
      for (int r = 1; r < dp; ++r) sum.add_(got[r]);
      sum.div_(static_cast<double>(dp));
      int64_t at_ = 0;
      for (auto& p : params) {
        at::Tensor g = sum.narrow(0, at_, p.numel()).view(p.sizes());
        at_ += p.numel();
        if (p.grad().defined()) p.mutable_grad().copy_(g);
        else p.mutable_grad() = g.clone();
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
        const std::string bytes = message::encode_ivalue(c10::IValue(c10::List<at::Tensor>(mine)));
        for (int s = 0; s + 1 < stages; ++s) post_bytes(bytes, MPI_BYTE, 1, s, tag, raw);
      } else {
        const std::string bytes = receive_bytes(stages - 1, tag, raw, where(0) + ": receiving the returned values from the last stage");
        const auto list = message::decode_ivalue(bytes.data(), bytes.size()).toTensorVector();
        if (list.size() != returned.size())
          throw UsageError("smp::step: the last stage returned " + std::to_string(list.size()) +
                           " tensors, stage " + std::to_string(stage) + " " + std::to_string(returned.size()) +
                           " (the step function must return the same structure on every stage)");
        for (size_t i = 0; i < list.size(); ++i) *returned[i] = list[i];
      }
    }
    if (training) all_reduce_gradients();
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

namespace {

std::vector<detail::LayerAdapter>& layer_adapters() {
  static std::vector<detail::LayerAdapter> v;
  return v;
}

template <typename Impl>
detail::LayerCall call_as(const std::shared_ptr<torch::nn::Module>& m) {
  auto p = std::dynamic_pointer_cast<Impl>(m);
  if (!p) return {};
  return [p](const at::Tensor& x) -> at::Tensor { return p->forward(x); };
}

// How to call a child of a model that is not a Sequential: a Sequential,
// one of torch::nn's one-tensor modules, or a registered type.
detail::LayerCall layer_call(const std::shared_ptr<torch::nn::Module>& m) {
  if (auto seq = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(m))
    return [seq](const at::Tensor& x) -> at::Tensor { return seq->forward(x); };
  using namespace torch::nn;
  for (auto f : {&call_as<LinearImpl>, &call_as<Conv1dImpl>, &call_as<Conv2dImpl>, &call_as<EmbeddingImpl>,
                 &call_as<LayerNormImpl>, &call_as<BatchNorm1dImpl>, &call_as<BatchNorm2dImpl>, &call_as<DropoutImpl>,
                 &call_as<GELUImpl>, &call_as<ReLUImpl>, &call_as<SiLUImpl>, &call_as<TanhImpl>, &call_as<SigmoidImpl>,
                 &call_as<IdentityImpl>, &call_as<FlattenImpl>})
    if (auto c = f(m)) return c;
  for (const auto& adapter : layer_adapters())
    if (auto c = adapter(m)) return c;
  return {};
}

}  // namespace

void detail::add_layer_adapter(LayerAdapter adapter) { layer_adapters().push_back(std::move(adapter)); }

DistributedModel::DistributedModel(torch::nn::Sequential model, std::vector<int> split_points)
    : DistributedModel(std::static_pointer_cast<torch::nn::Module>(model.ptr()), std::move(split_points)) {}

DistributedModel::DistributedModel(std::shared_ptr<torch::nn::Module> model, std::vector<int> split_points)
    : impl_(std::make_shared<Impl>()) {
  Impl& m = *impl_;
  if (!model) throw UsageError("smp::DistributedModel: the model is a null module");
  m.root = model;
  m.stage = mp_rank();
  m.stages = mp_size();
  // The layers and how to call them; a model the pipeline cannot run is an
  // error on every rank (agreed below with the layer counts).
  std::vector<detail::LayerCall> calls;
  std::string problem;
  if (auto seq = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model)) {
    size_t i = 0;
    for (const auto& layer : *seq) {
      m.names.push_back(std::to_string(i++));
      m.children.push_back(layer.ptr());
      calls.push_back([any = torch::nn::AnyModule(layer)](const at::Tensor& x) mutable -> at::Tensor {
        return any.forward<at::Tensor>(x);
      });
    }
  } else {
    for (const auto& item : model->named_children()) {
      m.names.push_back(item.key());
      m.children.push_back(item.value());
      calls.push_back(layer_call(item.value()));
      if (!calls.back() && problem.empty())
        problem = "child " + std::to_string(m.names.size() - 1) + " ('" + item.key() + "', a " +
                  item.value()->name() +
                  ") is not a layer the pipeline can call: a child must be a torch::nn::Sequential, one of "
                  "torch::nn's one-tensor modules (Linear, Conv1d, Conv2d, Embedding, LayerNorm, BatchNorm1d, "
                  "BatchNorm2d, Dropout, GELU, ReLU, SiLU, Tanh, Sigmoid, Identity, Flatten) or a type given to "
                  "smp::register_layer<T>() (T with at::Tensor forward(at::Tensor)); or put the layers in a "
                  "torch::nn::Sequential";
    }
    const auto own = model->named_parameters(/*recurse=*/false);
    if (problem.empty() && own.size() > 0)
      problem = "the model (a " + model->name() + ") has parameters of its own ('" + own.begin()->key() +
                "'), outside its children; the pipeline runs only the children, so they would not be trained: "
                "move them into a child";
  }
  const int n = static_cast<int>(m.children.size());
  // Every rank of the replica must have built the same number of layers.
  const auto counts = allgather(problem.empty() ? std::to_string(n) : "!" + problem, MP_GROUP);
  for (int s = 0; s < m.stages; ++s)
    if (!counts[s].empty() && counts[s][0] == '!')
      throw UsageError("smp::DistributedModel: on stage " + std::to_string(s) + ", " + counts[s].substr(1));
  for (int s = 0; s < m.stages; ++s)
    if (counts[s] != counts[0])
      throw UsageError("smp::DistributedModel: the stages built different models: stage 0 has " + counts[0] +
                       " layers, stage " + std::to_string(s) + " has " + counts[s]);
  if (split_points.empty()) {
    std::vector<int64_t> params;
    for (const auto& child : m.children) {
      int64_t c = 0;
      for (const auto& p : child->parameters()) c += p.numel();
      params.push_back(c);
    }
    m.bounds = balance_by_parameters(params, m.stages);
  } else {
    if (static_cast<int>(split_points.size()) != m.stages - 1)
      throw UsageError("smp::DistributedModel: " + std::to_string(split_points.size()) +
                       " split points for " + std::to_string(m.stages) + " stages (it needs " +
                       std::to_string(m.stages - 1) + ")");
    if (n < m.stages) balance_by_parameters(std::vector<int64_t>(n, 0), m.stages);  // raises
    m.bounds = {0};
    for (int p : split_points) {
      if (p <= m.bounds.back() || p >= n)
        throw UsageError("smp::DistributedModel: split points must increase within (0, " + std::to_string(n) +
                         "), every stage holding at least one layer; got " + std::to_string(p) + " after " +
                         std::to_string(m.bounds.back()));
      m.bounds.push_back(p);
    }
    m.bounds.push_back(n);
  }
  for (int i = m.bounds[m.stage]; i < m.bounds[m.stage + 1]; ++i) m.layers.push_back(calls[i]);
  m.raw = communicator(MP_GROUP);
  m.comm = mpi::Communicator::wrap(m.raw);
}

at::Tensor DistributedModel::operator()(const at::Tensor& x) {
  if (!g_step) throw UsageError("smp::DistributedModel: call the model inside an smp::step function");
  const int mb = microbatch();
  if (g_step->model && g_step->model != impl_.get())
    throw UsageError("smp::DistributedModel: one smp::step runs one DistributedModel; this step already ran another");
  if (!g_step->model) {
    if (mb != 0)
      throw UsageError("smp::DistributedModel: the step function must call the model in every microbatch; "
                       "microbatch 0 did not");
    impl_->begin_step(*g_step);
    g_step->model = impl_.get();
  }
  if (impl_->mbs[mb].forwarded)
    throw UsageError("smp::DistributedModel: called twice in microbatch " + std::to_string(mb) +
                     " (once per microbatch)");
  if (!x.defined()) throw UsageError("smp::DistributedModel: the input is an undefined tensor");
  return impl_->forward(mb, x);  // a failure reaches the other stages through PipelineStep::fail
}

void DistributedModel::backward(const at::Tensor& loss) {
  if (!g_step || g_step->model != impl_.get())
    throw UsageError("smp::DistributedModel::backward: call it inside an smp::step function, after the model");
  impl_->request_backward(microbatch(), loss);
}

int DistributedModel::stage() const { return impl_->stage; }
int DistributedModel::stages() const { return impl_->stages; }
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
  for (int i = first_layer(); i < end_layer(); ++i)
    for (const auto& item : impl_->children[i]->named_parameters())
      out.emplace_back(impl_->names[i] + "." + item.key(), item.value());
  return out;
}

// --- smp::step's side -----------------------------------------------------------

namespace detail {

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return shape_text(t.sizes()) + " " + c10::toString(t.scalar_type());
}

PipelineStep::PipelineStep(int microbatches, std::string fingerprint) {
  if (g_step) throw UsageError("smp::step: a step cannot run inside another step");
  const bool pipelined = initialized();
  const auto order = schedule(pipelined ? pipeline_from_name(config().pipeline) : Pipeline::kSimple,
                              pipelined ? mp_rank() : 0, pipelined ? mp_size() : 1, microbatches);
  for (const auto& a : order) actions_.push_back(a.kind == PipelineAction::kForward ? a.microbatch : -a.microbatch - 1);
  g_step = new StepState{microbatches, std::move(fingerprint), nullptr};
  if (pipelined && size() > 1) {
    g_step->epoch = next_step_number();
    g_step->world = communicator(WORLD);
    g_step->epochs = epochs_for(g_step->world);
    g_step->listening = true;
    g_step->check = [] { check_abort(); };
    g_step->interrupt = std::make_unique<mpi::ScopedWaitInterrupt>(&g_step->check);
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
      std::string phase = current_ == kFinish ? std::string("the end of the step")
                          : current_ >= 0     ? "the forward of microbatch " + std::to_string(current_)
                                              : "the backward of microbatch " + std::to_string(-current_ - 1);
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
      m->mbs.clear();
      m->out_shapes.clear();
    }
  } catch (...) {
  }
}

void PipelineStep::after_forward(int mb, const std::vector<at::Tensor>& returned) {
  DistributedModel::Impl* m = g_step->model;
  if (!m) return;
  const auto& state = m->mbs[mb];
  if (!state.forwarded)
    throw UsageError("smp::step: the step function called the DistributedModel in microbatch 0 but not in "
                     "microbatch " + std::to_string(mb));
  if (!state.target_tensor.defined() || !state.target_tensor.requires_grad()) return;  // nothing to trace
  for (const auto& t : returned)
    if (depends_on(t, state.target.get(), state.target_tensor)) return;
  throw UsageError("smp::step: in microbatch " + std::to_string(mb) +
                   ", the step function's return value does not depend on the output of the "
                   "smp::DistributedModel (seed 004: it must; return the loss or the output)");
}

void PipelineStep::backward(int mb) {
  if (g_step->model) {
    MicrobatchScope scope(mb, g_step->microbatches);
    g_step->model->backward(mb);
  }
}

void PipelineStep::finish(const std::vector<at::Tensor*>& returned) {
  if (g_step->model) g_step->model->finish(returned);
  finished_ = true;
}

}  // namespace detail

}  // namespace partita::smp
