// smp::DistributedModel and the pipeline schedules (issue 14,
// docs/pipeline.md): the stages of a torch::nn::Sequential on the mp group,
// activations forward and gradients back through the differentiable
// communicator, and smp::step's per-call state (detail::PipelineStep).
//
// Messages between neighbouring stages, all on the mp group's communicator:
//   kHeaderTag  a fixed-size int64 header before every activation: the
//               microbatch, the activation's dtype and shape and the shape
//               of the x stage 0 was given, or a "poison" status when the
//               sender failed in its forward (so downstream stages raise
//               instead of waiting);
//   kActTag     the activation, Communicator::isend/irecv (the gradient
//               comes back on kActTag + max_tag, the communicator's adjoint);
//   kShapeTag   the last stage tells every other stage the output's shape
//               and dtype, once per model input shape (their stand-in).
// A stage's forward send is not waited on until its backward: with
// rendezvous-sized activations a 1F1B stage would otherwise block in F(i+w)
// while its successor blocks sending it the gradient of B(i).
#include "partita/smp/pipeline.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <ctime>
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

constexpr int kActTag = 1400;
constexpr int kHeaderTag = 1401;
constexpr int kShapeTag = 1402;
constexpr int64_t kMagic = 0x45504950;  // "PIPE"
constexpr int kMaxDims = 12;
constexpr int kHeaderWords = 6 + 2 * kMaxDims;  // magic, status, mb, dtype, ndim, dims, xndim, xdims

struct StepState {
  int microbatches = 0;
  std::string fingerprint;
  DistributedModel::Impl* model = nullptr;
};
StepState* g_step = nullptr;

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

// Waits until `ready()` under partita's deadline and watchdog. A stage
// waiting for its neighbour often waits for a whole forward or backward of
// it; when ranks outnumber cores (the yield policy) a waiting rank that only
// yields still takes a good share of the core its neighbour computes on, so
// after a short while it sleeps between tests (20 us, growing to 200 us).
void wait_for_neighbour(const std::function<bool()>& ready, const std::string& what) {
  const bool sleepy = mpi::wait_policy() == mpi::WaitPolicy::Yield;
  int polls = 0;
  long nap = 20000;  // ns
  mpi::wait_until(
      [&] {
        if (ready()) return true;
        if (sleepy && ++polls > 64) {
          const timespec t{0, nap};
          nanosleep(&t, nullptr);
          nap = std::min(nap * 2, 200000L);
        }
        return false;
      },
      what.c_str());
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
  torch::nn::Sequential seq;
  std::vector<torch::nn::AnyModule> layers;  // this stage's
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
    at::Tensor loss;             // the last stage: loss / microbatches
    at::Tensor target_tensor;    // the output (or stand-in) returned to the step
    std::shared_ptr<torch::autograd::Node> target;  // its node in the graph
    int64_t bytes = 0;
    Clock::time_point input_grad_at{};  // when the backward reached this stage's input
  };
  std::vector<Mb> mbs;
  std::deque<std::vector<int64_t>> sent_buffers;  // headers and shapes in flight
  std::vector<MPI_Request> sent_requests;
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
    const std::string mine = "microbatches " + std::to_string(n) + ", split arguments " +
                             (st.fingerprint.empty() ? "none" : st.fingerprint);
    const auto all = allgather(mine, MP_GROUP);
    for (int s = 0; s < stages; ++s)
      if (all[s] != all[0]) {
        std::string text = "smp::step: the pipeline's stages were given different batches (mismatched "
                           "microbatch shapes); every stage of a model replica must get the same inputs:";
        for (int r = 0; r < stages; ++r) text += "\n  stage " + std::to_string(r) + ": " + all[r];
        throw UsageError(text);
      }
  }

  void post(std::vector<int64_t> words, int dest, int tag) {
    sent_buffers.push_back(std::move(words));
    MPI_Request r;
    PARTITA_MPI_CHECK(MPI_Isend(sent_buffers.back().data(), static_cast<int>(sent_buffers.back().size()),
                                MPI_INT64_T, dest, tag, raw, &r));
    sent_requests.push_back(r);
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
  std::vector<int64_t> receive_words(int count, int source, int tag, const std::string& what) {
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
    std::vector<int64_t> h = receive_words(kHeaderWords, stage - 1, kHeaderTag, what);
    if (h[0] != kMagic) throw UsageError(what + ": not a pipeline header");
    if (h[1] != 0)
      throw UsageError(what + ": stage " + std::to_string(stage - 1) +
                       " failed in its forward (its error says why); this stage stops too");
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
    return comm.recv(buffer, stage - 1, kActTag);
  }

  // Stages before the last: the output's dtype and shape for this input.
  std::vector<int64_t> output_shape(int mb, const at::Tensor& x) {
    const auto key = key_of(x);
    auto it = out_shapes.find(key);
    if (it != out_shapes.end()) return it->second;
    std::vector<int64_t> words = receive_words(2 + kMaxDims, stages - 1, kShapeTag,
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
      h = layer.forward<at::Tensor>(h);
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
        for (int s = 0; s + 1 < stages; ++s) post(words, s, kShapeTag);
        out_shapes.emplace(key_of(x), std::vector<int64_t>(words.begin(), words.begin() + 2 + h.dim()));
      }
      m.target_tensor = h;
      m.target = h.grad_fn();
      return h;
    }
    if (h.dim() > kMaxDims) throw UsageError(where(mb) + ": an activation of more than 12 dimensions");
    // The gradient must come back even through a stage without parameters.
    if (!h.requires_grad() && at::isFloatingType(h.scalar_type())) h = h.detach().requires_grad_(true);
    post(header(0, mb, h, x), stage + 1, kHeaderTag);
    m.send = comm.isend(h, stage + 1, kActTag);
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
        const int tag = kActTag + comm.max_tag();
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
      for (auto& p : seq->children()[i]->parameters())
        if (p.requires_grad()) local.push_back(p);
    std::map<at::ScalarType, std::vector<at::Tensor>> groups;
    for (auto& p : local) groups[p.scalar_type()].push_back(p);
    for (auto& [type, params] : groups) {
      std::vector<at::Tensor> flat;
      for (auto& p : params) flat.push_back(p.grad().defined() ? p.grad().reshape(-1) : at::zeros({p.numel()}, p.options()));
      at::Tensor buf = at::cat(flat).contiguous();
      MPI_Request r;
      PARTITA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf.data_ptr(), static_cast<int>(buf.numel()),
                                       grad_datatype(type), MPI_SUM, communicator(DP_GROUP), &r));
      mpi::wait(r, "smp::DistributedModel: the dp all-reduce of the gradients");
      buf.div_(static_cast<double>(dp));
      int64_t at_ = 0;
      for (auto& p : params) {
        at::Tensor g = buf.narrow(0, at_, p.numel()).view(p.sizes());
        at_ += p.numel();
        if (p.grad().defined()) p.mutable_grad().copy_(g);
        else p.mutable_grad() = g.clone();
      }
    }
  }

  void finish(const std::vector<at::Tensor*>& returned) {
    mpi::wait_all(sent_requests, "smp::DistributedModel: headers to the neighbouring stages");
    sent_requests.clear();
    sent_buffers.clear();
    if (stages > 1) {
      // The last stage's returned tensors, every microbatch's in order.
      if (last()) {
        std::vector<at::Tensor> mine;
        for (at::Tensor* t : returned) mine.push_back(t->defined() ? t->detach() : *t);
        broadcast(c10::IValue(c10::List<at::Tensor>(mine)), MP_GROUP);
      } else {
        const c10::IValue got = recv_from(stages - 1, MP_RANK);
        const auto list = got.toTensorVector();
        if (list.size() != returned.size())
          throw UsageError("smp::step: the last stage returned " + std::to_string(list.size()) +
                           " tensors, stage " + std::to_string(stage) + " " + std::to_string(returned.size()) +
                           " (the step function must return the same structure on every stage)");
        for (size_t i = 0; i < list.size(); ++i) *returned[i] = list[i];
      }
    }
    if (training) all_reduce_gradients();
  }
};

DistributedModel::DistributedModel(torch::nn::Sequential model, std::vector<int> split_points)
    : impl_(std::make_shared<Impl>()) {
  Impl& m = *impl_;
  m.seq = model;
  m.stage = mp_rank();
  m.stages = mp_size();
  const int n = static_cast<int>(model->size());
  // Every rank of the replica must have built the same number of layers.
  const auto counts = allgather(n, MP_GROUP);
  for (int s = 0; s < m.stages; ++s)
    if (counts[s] != n)
      throw UsageError("smp::DistributedModel: the stages built different models: stage 0 has " +
                       std::to_string(counts[0]) + " layers, stage " + std::to_string(s) + " has " +
                       std::to_string(counts[s]));
  if (split_points.empty()) {
    std::vector<int64_t> params;
    for (const auto& child : model->children()) {
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
  auto it = model->begin();
  for (int i = m.bounds[m.stage]; i < m.bounds[m.stage + 1]; ++i) m.layers.push_back(*(it + i));
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
  try {
    return impl_->forward(mb, x);
  } catch (...) {
    // Downstream stages would wait for this activation: tell them.
    if (!impl_->last()) {
      try {
        impl_->post(impl_->header(1, mb, at::Tensor(), at::Tensor()), impl_->stage + 1, kHeaderTag);
      } catch (...) {
      }
    }
    throw;
  }
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
  for (const auto& item : impl_->seq->named_parameters()) {
    const int layer = std::stoi(item.key().substr(0, item.key().find('.')));
    if (layer >= first_layer() && layer < end_layer()) out.emplace_back(item.key(), item.value());
  }
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
}

PipelineStep::~PipelineStep() {
  if (g_step && g_step->model && !finished_) {
    // A step that threw: drop the microbatches' graphs and handles.
    g_step->model->mbs.clear();
    g_step->model->sent_buffers.clear();
    g_step->model->sent_requests.clear();
  }
  delete g_step;
  g_step = nullptr;
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
