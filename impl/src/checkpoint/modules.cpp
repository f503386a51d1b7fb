// Modules and optimizers as checkpoint shards (checkpoint.hpp;
// docs/checkpoints.md, "What a module saves").
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <optional>
#include <set>

#include "partita/checkpoint.hpp"

#include "agree.hpp"
#include "partita/nn/dropout.hpp"
#include "partita/nn/layer_norm.hpp"
#include "partita/nn/linear.hpp"
#include "partita/nn/vocab_parallel.hpp"

namespace partita::checkpoint {

namespace {

std::string join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + "." + b;
}

// One parameter's shard: partita's distributed layers hold a block of the
// global tensor, every other module its whole tensor.
Shard parameter_shard(const std::string& name, const std::string& own, const at::Tensor& p,
                      const std::shared_ptr<torch::nn::Module>& m) {
  const Shape local(p.sizes().begin(), p.sizes().end());
  if (auto d = std::dynamic_pointer_cast<nn::DistributedLinearBase>(m)) {
    if (own == "weight" || own == "bias") {
      Shard s{name, p, {}, {}};
      if (own == "weight") {
        const auto [r0, rn, c0, cn] = d->weight_block();
        s.global = {d->out_features(), d->in_features()};
        s.start = {r0, c0};
        if (local != Shape{rn, cn})
          throw CheckpointError("\"" + name + "\" is " + shape_string(local) + ", not its block " +
                                shape_string({rn, cn}) + " of the global weight");
      } else {
        const auto [b0, bn] = d->bias_block();
        s.global = {d->out_features()};
        s.start = {b0};
        if (local != Shape{bn})
          throw CheckpointError("\"" + name + "\" is " + shape_string(local) + ", not its block " +
                                shape_string({bn}) + " of the global bias");
      }
      return s;
    }
  }
  if (auto e = std::dynamic_pointer_cast<nn::VocabParallelEmbeddingImpl>(m)) {
    if (own == "weight") return Shard{name, p, {e->vocab(), e->hidden()}, {e->vocab_start(), 0}};
  }
  return whole(name, p);
}

// A partita layer built on a partition this rank is not in: it holds
// nothing of the model (its parameters there are never trained, its
// dropout never draws), so its tensors and counters are neither saved nor
// loaded here.
bool outside_its_partition(const std::shared_ptr<torch::nn::Module>& m) {
  if (auto n = std::dynamic_pointer_cast<nn::SequenceParallelLayerNormImpl>(m)) return !n->partition().active();
  if (auto d = std::dynamic_pointer_cast<nn::SeededDropoutImpl>(m)) return !d->partition().active();
  if (auto e = std::dynamic_pointer_cast<nn::VocabParallelEmbeddingImpl>(m)) return !e->partition().active();
  return false;
}

// Every (name, module) under the roots, the roots' own names first.
void for_each_module(const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& roots,
                     const std::function<void(const std::string&, const std::shared_ptr<torch::nn::Module>&)>& f) {
  for (const auto& [root, m] : roots)
    for (const auto& item : m->named_modules(/*name_prefix=*/"", /*include_self=*/true)) f(join(root, item.key()), item.value());
}

// The optimizer's per-parameter state, as shards of the parameter's block.
// `finish` runs after a load succeeded: a load reads into staging tensors
// and only then changes the optimizer's state, so a refused load leaves
// the state as it was.
struct OptimizerShards {
  std::vector<Shard> shards;
  std::vector<std::function<void()>> finish;
};

template <typename State>
at::Tensor field_of(State& s, const std::string& f) {
  if constexpr (std::is_same_v<State, torch::optim::SGDParamState>) {
    return f == "momentum_buffer" ? s.momentum_buffer() : at::Tensor();
  } else {
    if (f == "exp_avg") return s.exp_avg();
    if (f == "exp_avg_sq") return s.exp_avg_sq();
    if (f == "max_exp_avg_sq") return s.max_exp_avg_sq();
    return {};
  }
}

template <typename State>
void set_field(State& s, const std::string& f, const at::Tensor& t) {
  if constexpr (std::is_same_v<State, torch::optim::SGDParamState>) {
    if (f == "momentum_buffer") s.momentum_buffer(t);
  } else {
    if (f == "exp_avg") s.exp_avg(t);
    if (f == "exp_avg_sq") s.exp_avg_sq(t);
    if (f == "max_exp_avg_sq") s.max_exp_avg_sq(t);
  }
}

// Whether `param`'s group in an Adam or AdamW keeps a maximum of the second
// moments (amsgrad).
template <typename Options>
bool amsgrad_of(torch::optim::Optimizer& opt, const at::Tensor& param) {
  for (auto& group : opt.param_groups())
    for (const auto& q : group.params())
      if (q.unsafeGetTensorImpl() == param.unsafeGetTensorImpl())
        return static_cast<const Options&>(group.options()).amsgrad();
  return false;
}

template <typename State>
void state_shards(torch::optim::Optimizer& opt, const std::vector<Shard>& params, const std::set<std::string>* in_file,
                  OptimizerShards& out, const std::vector<std::string>& fields) {
  constexpr bool kHasStep = !std::is_same_v<State, torch::optim::SGDParamState>;
  constexpr bool kAdam = std::is_same_v<State, torch::optim::AdamParamState>;
  constexpr bool kAdamW = std::is_same_v<State, torch::optim::AdamWParamState>;
  auto& states = opt.state();
  for (const Shard& p : params) {
    if (!p.local.defined() || p.local.numel() == 0) continue;
    const std::string key = c10::guts::to_string(p.local.unsafeGetTensorImpl());
    const std::string prefix = "optimizer." + p.name + ".";
    if (!in_file) {  // saving: the state as it is
      const auto it = states.find(key);
      if (it == states.end()) continue;
      auto& s = static_cast<State&>(*it->second);
      for (const std::string& f : fields) {
        const at::Tensor t = field_of(s, f);
        if (t.defined()) out.shards.push_back(Shard{prefix + f, t, p.global, p.start});
      }
      if constexpr (kHasStep)
        out.shards.push_back(whole(prefix + "step", at::scalar_tensor(static_cast<int64_t>(s.step()), at::kLong)));
      continue;
    }
    // Loading: the checkpoint says whether this parameter has state.
    if (!in_file->count(prefix + fields[0])) {
      out.finish.push_back([&states, key] { states.erase(key); });
      continue;
    }
    std::vector<std::pair<std::string, at::Tensor>> staged;
    for (const std::string& f : fields)
      if (in_file->count(prefix + f)) {
        staged.emplace_back(f, at::empty(p.local.sizes(), p.local.options().requires_grad(false)));
        out.shards.push_back(Shard{prefix + f, staged.back().second, p.global, p.start});
      }
    const at::Tensor step = at::zeros({}, at::kLong);
    if constexpr (kHasStep) out.shards.push_back(whole(prefix + "step", step));
    // An amsgrad group loading a checkpoint saved without amsgrad starts
    // its maximum afresh (zeros, as LibTorch's first step makes it), not
    // from whatever this optimizer held: LibTorch's step needs the tensor.
    bool fresh_max = false;
    if constexpr (kAdam) fresh_max = amsgrad_of<torch::optim::AdamOptions>(opt, p.local);
    if constexpr (kAdamW) fresh_max = amsgrad_of<torch::optim::AdamWOptions>(opt, p.local);
    fresh_max = fresh_max && !in_file->count(prefix + "max_exp_avg_sq");
    out.finish.push_back([&states, key, staged, step, fresh_max] {
      auto it = states.find(key);
      if (it == states.end()) it = states.emplace(key, std::make_unique<State>()).first;
      auto& s = static_cast<State&>(*it->second);
      for (const auto& [f, t] : staged) set_field(s, f, t);
      if constexpr (kHasStep) s.step(step.item<int64_t>());
      if constexpr (kAdam || kAdamW)
        if (fresh_max && s.exp_avg_sq().defined()) s.max_exp_avg_sq(at::zeros_like(s.exp_avg_sq()));
    });
  }
}

OptimizerShards optimizer_shards(torch::optim::Optimizer* opt, const std::vector<Shard>& params,
                                 const std::set<std::string>* in_file) {
  OptimizerShards out;
  if (!opt) return out;
  if (dynamic_cast<torch::optim::Adam*>(opt))
    state_shards<torch::optim::AdamParamState>(*opt, params, in_file, out, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"});
  else if (dynamic_cast<torch::optim::AdamW*>(opt))
    state_shards<torch::optim::AdamWParamState>(*opt, params, in_file, out, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"});
  else if (dynamic_cast<torch::optim::SGD*>(opt))
    state_shards<torch::optim::SGDParamState>(*opt, params, in_file, out, {"momentum_buffer"});
  else
    throw CheckpointError("the optimizer is not one partita checkpoints (torch::optim::SGD, Adam or AdamW)");
  return out;
}

std::string dropout_counter(const std::string& name) { return "rng." + name + ".calls"; }
std::string dropout_seed(const std::string& name) { return "rng." + name + ".seed"; }

}  // namespace

std::vector<Shard> module_shards(const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& roots) {
  std::vector<Shard> out;
  std::set<const void*> seen;  // a tensor shared by two modules (tied weights) is saved once, under its first name
  for_each_module(roots, [&](const std::string& path, const std::shared_ptr<torch::nn::Module>& m) {
    if (outside_its_partition(m)) return;
    for (const auto& item : m->named_parameters(/*recurse=*/false))
      if (seen.insert(item.value().unsafeGetTensorImpl()).second)
        out.push_back(parameter_shard(join(path, item.key()), item.key(), item.value(), m));
    for (const auto& item : m->named_buffers(/*recurse=*/false))
      if (item.value().defined() && seen.insert(item.value().unsafeGetTensorImpl()).second)
        out.push_back(whole(join(path, item.key()), item.value()));
  });
  return out;
}

void save_modules(const std::string& dir, const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& roots,
                  torch::optim::Optimizer* optimizer, Info info) {
  std::vector<Shard> shards;
  std::string error;
  try {
    shards = module_shards(roots);
    OptimizerShards o = optimizer_shards(optimizer, shards, nullptr);
    shards.insert(shards.end(), o.shards.begin(), o.shards.end());
    for_each_module(roots, [&](const std::string& path, const std::shared_ptr<torch::nn::Module>& m) {
      auto d = std::dynamic_pointer_cast<nn::SeededDropoutImpl>(m);
      if (d && !outside_its_partition(m)) {
        info.counters[dropout_counter(path)] = static_cast<int64_t>(d->calls());
        info.counters[dropout_seed(path)] = static_cast<int64_t>(d->seed());  // (the bits of a uint64)
      }
    });
  } catch (const std::exception& e) {
    error = e.what();
  }
  detail::agree(error, dir);
  save(dir, shards, info);
}

Info load_modules(const std::string& dir, const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& roots,
                  torch::optim::Optimizer* optimizer) {
  const Contents c = contents(dir);
  std::set<std::string> in_file;
  for (const auto& t : c.tensors) in_file.insert(t.name);
  std::vector<Shard> shards;
  OptimizerShards o;
  struct Drawn {
    std::shared_ptr<nn::SeededDropoutImpl> layer;
    int64_t calls;
    std::optional<int64_t> seed;  // (a checkpoint written before seeds were saved has none)
  };
  std::vector<Drawn> dropouts;
  std::string error;
  try {
    shards = module_shards(roots);
    o = optimizer_shards(optimizer, shards, &in_file);
    shards.insert(shards.end(), o.shards.begin(), o.shards.end());
    for_each_module(roots, [&](const std::string& path, const std::shared_ptr<torch::nn::Module>& m) {
      auto d = std::dynamic_pointer_cast<nn::SeededDropoutImpl>(m);
      if (d && !outside_its_partition(m)) {
        const auto it = c.info.counters.find(dropout_counter(path));
        if (it == c.info.counters.end())
          throw CheckpointError("no dropout count \"" + dropout_counter(path) + "\" for the SeededDropout \"" + path + "\"");
        const auto seed = c.info.counters.find(dropout_seed(path));
        dropouts.push_back({d, it->second, seed == c.info.counters.end() ? std::nullopt
                                                                           : std::optional<int64_t>(seed->second)});
      }
    });
  } catch (const std::exception& e) {
    error = e.what();
  }
  detail::agree(error, dir);
  LoadOptions options;
  // Without an optimizer, its state in the file is left unread.
  if (!optimizer) options.unread_prefix = "optimizer.";
  Info info = load(dir, shards, options);
  for (auto& f : o.finish) f();
  for (auto& d : dropouts) {
    if (d.seed) d.layer->reseed(static_cast<uint64_t>(*d.seed));
    d.layer->set_calls(static_cast<uint64_t>(d.calls));
  }
  return info;
}

void save(const std::string& dir, const std::shared_ptr<torch::nn::Module>& module, torch::optim::Optimizer* optimizer,
          const Info& info) {
  save_modules(dir, {{"", module}}, optimizer, info);
}

Info load(const std::string& dir, const std::shared_ptr<torch::nn::Module>& module, torch::optim::Optimizer* optimizer) {
  return load_modules(dir, {{"", module}}, optimizer);
}

}  // namespace partita::checkpoint
