// smp::step (seed 004): run a user's forward/backward once per microbatch
// and collect what it returns (docs/smp.md, "step").
//
//   auto train = smp::step([&](at::Tensor x, at::Tensor y) {
//     at::Tensor loss = torch::mse_loss(model->forward(x), y);
//     (loss / smp::num_microbatches()).backward();   // gradients accumulate
//     return loss;
//   });
//   smp::StepOutput losses = train(x, y);
//   at::Tensor loss = losses.reduce_mean();
//
// Inputs are split along their batch axis (0 unless input_split_axes says
// otherwise) into `microbatches` equal pieces: tensors, and std::vector,
// std::map, std::pair and std::tuple of them, recursively; a user type is
// split by its member `T smp_slice(int num_mb, int mb, int64_t axis) const`
// (the seed's CustomType) or by specialising smp::Slicer<T>. Anything else
// (numbers, strings, ...) is passed to every microbatch as it is, and so are
// the arguments named in non_split_inputs. A batch that the microbatches do
// not divide is an error (UsageError), not a silently shorter last piece.
//
// What the function returns comes back per microbatch: every at::Tensor as a
// StepOutput (inside vectors, maps, pairs and tuples too), any other value as
// a std::vector of the microbatches' values. detach_outputs (default true)
// detaches the returned tensors.
//
// The forwards run in microbatch order. When the function uses an
// smp::DistributedModel (partita/smp/pipeline.hpp), the microbatches'
// backward passes (model.backward) run where the pipeline schedule puts them
// and the returned tensors are the last stage's on every stage; without one,
// each call runs to its end as on one process (docs/pipeline.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "partita/smp.hpp"

namespace partita::smp {

// All versions of one returned tensor, one per microbatch.
class StepOutput {
 public:
  StepOutput() = default;
  explicit StepOutput(std::vector<at::Tensor> outputs) : outputs_(std::move(outputs)) {}
  const std::vector<at::Tensor>& outputs() const { return outputs_; }
  at::Tensor reduce_mean() const;  // elementwise mean over the microbatches
  at::Tensor reduce_sum() const;   // elementwise sum
  at::Tensor concat(int64_t dim = 0) const;  // torch.cat along the batch dimension
  at::Tensor stack() const;        // torch.stack: a new leading microbatch dimension

 private:
  std::vector<at::Tensor> outputs_;
};

// Set in LibTorch's style: StepOptions().arg_names({"x", "y"}).non_split_inputs({"y"}).
struct StepOptions {
  using SplitAxes = std::map<std::string, int64_t>;
  using PositionAxes = std::map<size_t, int64_t>;

  // Names of the step function's arguments, in order, so that the two
  // options below can name them (C++ has no parameter names at run time).
  PARTITA_ARG(std::vector<std::string>, arg_names);
  PARTITA_ARG(std::vector<std::string>, non_split_inputs);        // by name
  PARTITA_ARG(SplitAxes, input_split_axes);                       // by name; default axis 0
  PARTITA_ARG(std::set<size_t>, non_split_positions);             // the same by position
  PARTITA_ARG(PositionAxes, split_axes_by_position);
  PARTITA_ARG(bool, detach_outputs) = true;
  PARTITA_ARG(int, microbatches) = 0;  // 0: smp::config().microbatches()
};

// Inside a step: which microbatch runs, and how many there are. UsageError
// outside a step.
int microbatch();
int num_microbatches();

// --- splitting ----------------------------------------------------------------

namespace detail {
at::Tensor slice_tensor(const at::Tensor& t, int num_mb, int mb, int64_t axis, const std::string& what);

template <typename T, typename = void>
struct has_smp_slice : std::false_type {};
template <typename T>
struct has_smp_slice<T, std::void_t<decltype(std::declval<const T&>().smp_slice(0, 0, int64_t{0}))>>
    : std::true_type {};
}  // namespace detail

// The customisation point: specialise for a type that cannot have a member
// smp_slice. slice(x, num_mb, mb, axis, what) returns microbatch mb of x.
template <typename T, typename = void>
struct Slicer {
  static T slice(const T& x, int num_mb, int mb, int64_t axis, const std::string& what) {
    if constexpr (detail::has_smp_slice<T>::value) return x.smp_slice(num_mb, mb, axis);
    else return x;  // not splittable: every microbatch gets it as it is
  }
};
template <>
struct Slicer<at::Tensor> {
  static at::Tensor slice(const at::Tensor& x, int num_mb, int mb, int64_t axis, const std::string& what) {
    return detail::slice_tensor(x, num_mb, mb, axis, what);
  }
};
template <typename T, typename A>
struct Slicer<std::vector<T, A>> {
  static std::vector<T, A> slice(const std::vector<T, A>& x, int num_mb, int mb, int64_t axis, const std::string& what) {
    std::vector<T, A> out;
    out.reserve(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      out.push_back(Slicer<T>::slice(x[i], num_mb, mb, axis, what + "[" + std::to_string(i) + "]"));
    return out;
  }
};
template <typename K, typename V, typename C, typename A>
struct Slicer<std::map<K, V, C, A>> {
  static std::map<K, V, C, A> slice(const std::map<K, V, C, A>& x, int num_mb, int mb, int64_t axis,
                                    const std::string& what) {
    std::map<K, V, C, A> out;
    size_t i = 0;
    for (const auto& [k, v] : x) out.emplace(k, Slicer<V>::slice(v, num_mb, mb, axis, what + "{" + std::to_string(i++) + "}"));
    return out;
  }
};
template <typename A, typename B>
struct Slicer<std::pair<A, B>> {
  static std::pair<A, B> slice(const std::pair<A, B>& x, int num_mb, int mb, int64_t axis, const std::string& what) {
    return {Slicer<A>::slice(x.first, num_mb, mb, axis, what + ".first"),
            Slicer<B>::slice(x.second, num_mb, mb, axis, what + ".second")};
  }
};
template <typename... T>
struct Slicer<std::tuple<T...>> {
  static std::tuple<T...> slice(const std::tuple<T...>& x, int num_mb, int mb, int64_t axis, const std::string& what) {
    return slice_all(x, num_mb, mb, axis, what, std::index_sequence_for<T...>{});
  }
  template <size_t... I>
  static std::tuple<T...> slice_all(const std::tuple<T...>& x, int num_mb, int mb, int64_t axis,
                                    const std::string& what, std::index_sequence<I...>) {
    return std::tuple<T...>(
        Slicer<std::tuple_element_t<I, std::tuple<T...>>>::slice(std::get<I>(x), num_mb, mb, axis,
                                                                  what + "<" + std::to_string(I) + ">")...);
  }
};

// --- collecting ---------------------------------------------------------------

template <typename R, typename = void>
struct Collect {  // any other value: one per microbatch
  using type = std::vector<R>;
  static type make(std::vector<R> per_mb, bool detach) { return per_mb; }
};
template <>
struct Collect<at::Tensor> {
  using type = StepOutput;
  static type make(std::vector<at::Tensor> per_mb, bool detach) {
    if (detach)
      for (auto& t : per_mb)
        if (t.defined()) t = t.detach();
    return StepOutput(std::move(per_mb));
  }
};
namespace detail {
[[noreturn]] void collect_mismatch(const std::string& what, size_t first, size_t other, int mb);
}
template <typename T, typename A>
struct Collect<std::vector<T, A>> {
  using type = std::vector<typename Collect<T>::type>;
  static type make(std::vector<std::vector<T, A>> per_mb, bool detach) {
    type out;
    if (per_mb.empty()) return out;
    for (size_t m = 1; m < per_mb.size(); ++m)
      if (per_mb[m].size() != per_mb[0].size())
        detail::collect_mismatch("a returned vector", per_mb[0].size(), per_mb[m].size(), static_cast<int>(m));
    for (size_t i = 0; i < per_mb[0].size(); ++i) {
      std::vector<T> column;
      for (auto& v : per_mb) column.push_back(std::move(v[i]));
      out.push_back(Collect<T>::make(std::move(column), detach));
    }
    return out;
  }
};
template <typename K, typename V, typename C, typename A>
struct Collect<std::map<K, V, C, A>> {
  using type = std::map<K, typename Collect<V>::type, C>;
  static type make(std::vector<std::map<K, V, C, A>> per_mb, bool detach) {
    type out;
    if (per_mb.empty()) return out;
    for (const auto& [k, v0] : per_mb[0]) {
      std::vector<V> column;
      for (size_t m = 0; m < per_mb.size(); ++m) {
        auto it = per_mb[m].find(k);
        if (it == per_mb[m].end() || per_mb[m].size() != per_mb[0].size())
          detail::collect_mismatch("a returned map", per_mb[0].size(), per_mb[m].size(), static_cast<int>(m));
        column.push_back(it->second);
      }
      out.emplace(k, Collect<V>::make(std::move(column), detach));
    }
    return out;
  }
};
template <typename P, typename Q>
struct Collect<std::pair<P, Q>> {
  using type = std::pair<typename Collect<P>::type, typename Collect<Q>::type>;
  static type make(std::vector<std::pair<P, Q>> per_mb, bool detach) {
    std::vector<P> a;
    std::vector<Q> b;
    for (auto& p : per_mb) {
      a.push_back(std::move(p.first));
      b.push_back(std::move(p.second));
    }
    return {Collect<P>::make(std::move(a), detach), Collect<Q>::make(std::move(b), detach)};
  }
};
template <typename... T>
struct Collect<std::tuple<T...>> {
  using type = std::tuple<typename Collect<T>::type...>;
  static type make(std::vector<std::tuple<T...>> per_mb, bool detach) {
    return make_all(per_mb, detach, std::index_sequence_for<T...>{});
  }
  template <size_t... I>
  static type make_all(std::vector<std::tuple<T...>>& per_mb, bool detach, std::index_sequence<I...>) {
    return type(Collect<std::tuple_element_t<I, std::tuple<T...>>>::make(column<I>(per_mb), detach)...);
  }
  template <size_t I>
  static std::vector<std::tuple_element_t<I, std::tuple<T...>>> column(std::vector<std::tuple<T...>>& per_mb) {
    std::vector<std::tuple_element_t<I, std::tuple<T...>>> out;
    for (auto& t : per_mb) out.push_back(std::move(std::get<I>(t)));
    return out;
  }
};

// --- visiting the tensors of a value ------------------------------------------

// Calls f(at::Tensor&) on every tensor of x: itself, or inside std::vector,
// std::map (values), std::pair and std::tuple, recursively; nothing else.
template <typename T, typename = void>
struct EachTensor {
  template <typename F>
  static void visit(T&, F&) {}
};
template <>
struct EachTensor<at::Tensor> {
  template <typename F>
  static void visit(at::Tensor& t, F& f) { f(t); }
};
template <typename T, typename A>
struct EachTensor<std::vector<T, A>> {
  template <typename F>
  static void visit(std::vector<T, A>& v, F& f) {
    for (auto& x : v) EachTensor<T>::visit(x, f);
  }
};
template <typename K, typename V, typename C, typename A>
struct EachTensor<std::map<K, V, C, A>> {
  template <typename F>
  static void visit(std::map<K, V, C, A>& m, F& f) {
    for (auto& kv : m) EachTensor<V>::visit(kv.second, f);
  }
};
template <typename P, typename Q>
struct EachTensor<std::pair<P, Q>> {
  template <typename F>
  static void visit(std::pair<P, Q>& x, F& f) {
    EachTensor<P>::visit(x.first, f);
    EachTensor<Q>::visit(x.second, f);
  }
};
template <typename... T>
struct EachTensor<std::tuple<T...>> {
  template <typename F>
  static void visit(std::tuple<T...>& x, F& f) {
    std::apply([&f](auto&... e) { (EachTensor<std::decay_t<decltype(e)>>::visit(e, f), ...); }, x);
  }
};

// --- the step -----------------------------------------------------------------

namespace detail {
// Marks the microbatch running (for microbatch()/num_microbatches()) for
// the lifetime of the guard.
class MicrobatchScope {
 public:
  MicrobatchScope(int mb, int num_mb);
  ~MicrobatchScope();
  MicrobatchScope(const MicrobatchScope&) = delete;
  MicrobatchScope& operator=(const MicrobatchScope&) = delete;

 private:
  int saved_mb_, saved_num_;
};
// Checks the options against the argument count (names known, positions in
// range) and resolves the microbatch count; UsageError otherwise.
int resolve_microbatches(const StepOptions& o, size_t arg_count);
// Whether argument i is split, and along which axis.
bool is_split(const StepOptions& o, size_t i);
int64_t split_axis(const StepOptions& o, size_t i);
std::string arg_label(const StepOptions& o, size_t i);
// "[4, 3] Double" for the step's argument fingerprint.
std::string describe(const at::Tensor& t);

// One call of a step, run by the schedule of this rank's pipeline stage
// (pipeline.cpp). Without a DistributedModel in the step, backward() and
// share_outputs() do nothing and the step is the single-process loop.
class PipelineStep {
 public:
  // `fingerprint`: the shapes of the split arguments, compared across the
  // pipeline's stages at the model's first call.
  PipelineStep(int microbatches, std::string fingerprint);
  ~PipelineStep();  // a step that threw leaves no state behind
  PipelineStep(const PipelineStep&) = delete;
  PipelineStep& operator=(const PipelineStep&) = delete;

  // This rank's actions in order (the verified schedule's list, messages
  // included): >= 0, call the step function for that microbatch (its F);
  // -(i + 1), the executor's action i (run(i)).
  const std::vector<int>& actions() const { return actions_; }
  // After the step function returned for mb: checks that what it returned
  // depends on the model's output (seed 004), if the model ran.
  void after_forward(int mb, const std::vector<at::Tensor>& returned);
  void run(int index);
  // The last stage's returned tensors replace this stage's (every
  // microbatch's, in order); then the dp average of the gradients and the
  // step's end agreement. Every stage calls it.
  void finish(const std::vector<at::Tensor*>& returned);
  // What the step runs now (an index into actions(), or kFinish): named in
  // the message the other stages get if this rank fails.
  static constexpr int kFinish = std::numeric_limits<int>::min();
  void enter(int index);
  // The step threw on this rank: unless the error came from another rank's
  // failure, tell every other rank (docs/pipeline.md, "Errors"); leave
  // nothing posted that a later step could match. Never throws.
  void fail(std::exception_ptr error) noexcept;

 private:
  std::vector<int> actions_;
  int current_ = 0;
  bool finished_ = false;
  bool failed_ = false;
};
}  // namespace detail

template <typename F>
class Step {
 public:
  Step(F f, StepOptions options) : f_(std::move(f)), o_(std::move(options)) {}

  template <typename... Args>
  auto operator()(const Args&... args) {
    using R = std::invoke_result_t<F&, std::decay_t<Args>...>;
    const int n = detail::resolve_microbatches(o_, sizeof...(Args));
    auto piece = [&](const auto& arg, size_t i, int mb) {
      using T = std::decay_t<decltype(arg)>;
      if (!detail::is_split(o_, i)) return T(arg);
      return Slicer<T>::slice(arg, n, mb, detail::split_axis(o_, i), detail::arg_label(o_, i));
    };
    auto run = [&](int mb) -> R {
      detail::MicrobatchScope scope(mb, n);
      return call(piece, mb, std::index_sequence_for<Args...>{}, args...);
    };
    detail::PipelineStep pipe(n, fingerprint(std::index_sequence_for<Args...>{}, args...));
    auto tensors = [](auto& value) {
      std::vector<at::Tensor*> out;
      auto add = [&out](at::Tensor& t) { out.push_back(&t); };
      EachTensor<std::decay_t<decltype(value)>>::visit(value, add);
      return out;
    };
    // A rank that fails tells the others (pipe.fail), so that in a
    // pipeline every rank raises instead of waiting for it.
    try {
      if constexpr (std::is_void_v<R>) {
        for (size_t i = 0; i < pipe.actions().size(); ++i) {
          const int a = pipe.actions()[i];
          pipe.enter(static_cast<int>(i));
          if (a < 0) {
            pipe.run(-a - 1);
            continue;
          }
          run(a);
          pipe.after_forward(a, {});
        }
        pipe.enter(detail::PipelineStep::kFinish);
        pipe.finish({});
      } else {
        std::vector<std::optional<R>> slots(n);
        for (size_t i = 0; i < pipe.actions().size(); ++i) {
          const int a = pipe.actions()[i];
          pipe.enter(static_cast<int>(i));
          if (a < 0) {
            pipe.run(-a - 1);
            continue;
          }
          slots[a].emplace(run(a));
          std::vector<at::Tensor> returned;
          for (at::Tensor* t : tensors(*slots[a])) returned.push_back(*t);
          pipe.after_forward(a, returned);
        }
        pipe.enter(detail::PipelineStep::kFinish);
        std::vector<R> per_mb;
        per_mb.reserve(n);
        for (auto& s : slots) per_mb.push_back(std::move(*s));
        std::vector<at::Tensor*> all;
        for (auto& r : per_mb)
          for (at::Tensor* t : tensors(r)) all.push_back(t);
        pipe.finish(all);
        return Collect<R>::make(std::move(per_mb), o_.detach_outputs());
      }
    } catch (...) {
      pipe.fail(std::current_exception());
      throw;
    }
  }

 private:
  template <typename Piece, size_t... I, typename... Args>
  auto call(Piece& piece, int mb, std::index_sequence<I...>, const Args&... args) {
    return f_(piece(args, I, mb)...);
  }

  // The split arguments' tensors' shapes: the stages of a pipeline must
  // all be given the same batch.
  template <size_t... I, typename... Args>
  std::string fingerprint(std::index_sequence<I...>, const Args&... args) {
    std::string out;
    auto one = [&](const auto& arg, size_t i) {
      if (!detail::is_split(o_, i)) return;
      auto copy = arg;
      auto add = [&out, i](at::Tensor& t) { out += std::to_string(i) + ":" + detail::describe(t) + " "; };
      EachTensor<std::decay_t<decltype(arg)>>::visit(copy, add);
    };
    (one(args, I), ...);
    return out;
  }

  F f_;
  StepOptions o_;
};

template <typename F>
Step<F> step(F f, StepOptions options = {}) {
  return Step<F>(std::move(f), std::move(options));
}

}  // namespace partita::smp
