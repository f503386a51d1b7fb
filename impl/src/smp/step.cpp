// smp::step's non-template parts: StepOutput's reductions, tensor slicing,
// option checks and the current microbatch.
#include "partita/smp/step.hpp"

#include <ATen/ATen.h>

#include <algorithm>

namespace partita::smp {

namespace {
int g_microbatch = -1;
int g_num_microbatches = 0;

void need_outputs(const std::vector<at::Tensor>& v, const char* what) {
  if (v.empty()) throw UsageError(std::string("smp::StepOutput::") + what + ": no microbatch outputs");
  for (size_t i = 0; i < v.size(); ++i)
    if (!v[i].defined())
      throw UsageError(std::string("smp::StepOutput::") + what + ": microbatch " + std::to_string(i) +
                       " returned an undefined tensor");
}
}  // namespace

at::Tensor StepOutput::reduce_mean() const {
  need_outputs(outputs_, "reduce_mean");
  return at::stack(outputs_).mean(0);
}

at::Tensor StepOutput::reduce_sum() const {
  need_outputs(outputs_, "reduce_sum");
  return at::stack(outputs_).sum(0);
}

at::Tensor StepOutput::concat(int64_t dim) const {
  need_outputs(outputs_, "concat");
  return at::cat(outputs_, dim);
}

at::Tensor StepOutput::stack() const {
  need_outputs(outputs_, "stack");
  return at::stack(outputs_);
}

int microbatch() {
  if (g_microbatch < 0) throw UsageError("smp::microbatch: not inside an smp::step");
  return g_microbatch;
}

int num_microbatches() {
  if (g_microbatch < 0) throw UsageError("smp::num_microbatches: not inside an smp::step");
  return g_num_microbatches;
}

namespace detail {

at::Tensor slice_tensor(const at::Tensor& t, int num_mb, int mb, int64_t axis, const std::string& what) {
  if (!t.defined()) return t;
  const int64_t dims = t.dim();
  if (dims == 0 || axis < -dims || axis >= dims)
    throw UsageError("smp::step: " + what + " has " + std::to_string(dims) +
                     " dimensions, it cannot be split along axis " + std::to_string(axis));
  const int64_t a = axis < 0 ? axis + dims : axis;
  const int64_t n = t.size(a);
  if (n % num_mb != 0)
    throw UsageError("smp::step: " + what + " has batch size " + std::to_string(n) + " along axis " +
                     std::to_string(a) + ", which " + std::to_string(num_mb) +
                     " microbatches do not divide (docs/smp.md: uneven batches are an error)");
  const int64_t len = n / num_mb;
  return t.narrow(a, mb * len, len);
}

void collect_mismatch(const std::string& what, size_t first, size_t other, int mb) {
  throw UsageError("smp::step: " + what + " has " + std::to_string(first) + " entries in microbatch 0 and " +
                   std::to_string(other) + " in microbatch " + std::to_string(mb));
}

MicrobatchScope::MicrobatchScope(int mb, int num_mb) : saved_mb_(g_microbatch), saved_num_(g_num_microbatches) {
  g_microbatch = mb;
  g_num_microbatches = num_mb;
}

MicrobatchScope::~MicrobatchScope() {
  g_microbatch = saved_mb_;
  g_num_microbatches = saved_num_;
}

int resolve_microbatches(const StepOptions& o, size_t arg_count) {
  if (!o.arg_names().empty() && o.arg_names().size() != arg_count)
    throw UsageError("smp::step: arg_names lists " + std::to_string(o.arg_names().size()) +
                     " names, the step was called with " + std::to_string(arg_count) + " arguments");
  auto known = [&](const std::string& name, const char* option) {
    if (std::find(o.arg_names().begin(), o.arg_names().end(), name) == o.arg_names().end())
      throw UsageError(std::string("smp::step: ") + option + " names \"" + name +
                       "\", which is not in arg_names");
  };
  for (const auto& n : o.non_split_inputs()) known(n, "non_split_inputs");
  for (const auto& [n, axis] : o.input_split_axes()) known(n, "input_split_axes");
  for (size_t p : o.non_split_positions())
    if (p >= arg_count)
      throw UsageError("smp::step: non_split_positions holds " + std::to_string(p) + ", the step has " +
                       std::to_string(arg_count) + " arguments");
  for (const auto& [p, axis] : o.split_axes_by_position())
    if (p >= arg_count)
      throw UsageError("smp::step: split_axes_by_position holds " + std::to_string(p) + ", the step has " +
                       std::to_string(arg_count) + " arguments");
  if (o.microbatches() < 0) throw UsageError("smp::step: microbatches must be positive");
  return o.microbatches() > 0 ? o.microbatches() : config().microbatches();
}

bool is_split(const StepOptions& o, size_t i) {
  if (o.non_split_positions().count(i)) return false;
  if (i < o.arg_names().size() &&
      std::find(o.non_split_inputs().begin(), o.non_split_inputs().end(), o.arg_names()[i]) != o.non_split_inputs().end())
    return false;
  return true;
}

int64_t split_axis(const StepOptions& o, size_t i) {
  if (auto it = o.split_axes_by_position().find(i); it != o.split_axes_by_position().end()) return it->second;
  if (i < o.arg_names().size())
    if (auto it = o.input_split_axes().find(o.arg_names()[i]); it != o.input_split_axes().end()) return it->second;
  return 0;
}

std::string arg_label(const StepOptions& o, size_t i) {
  return i < o.arg_names().size() ? "argument \"" + o.arg_names()[i] + "\"" : "argument " + std::to_string(i);
}

}  // namespace detail

}  // namespace partita::smp
