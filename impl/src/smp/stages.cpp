// The model's layers and their split into the pipeline's stages
// (docs/pipeline.md, "The model and its stages"): which child is a layer
// and how to call it, and which layers each stage holds. Apart from the
// executor (pipeline.cpp) so that what a rank holds is decided in one place.
#include "stages.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "partita/mpi/poll.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/dropout.hpp"
#include "partita/nn/layer_norm.hpp"
#include "partita/nn/linear.hpp"
#include "partita/nn/vocab_parallel.hpp"
#include "partita/smp/communicators.hpp"
#include "partita/smp/schedule.hpp"
#include "partita/smp/tensor_parallel.hpp"

namespace partita::smp::detail {

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

std::string list_text(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// What every rank must have built alike, one layer: its type, the types
// inside it, the distributed layers' sizes and partitions, and the shapes
// and dtypes of the parameters every replica holds whole.
std::string describe_layer(const std::shared_ptr<torch::nn::Module>& m) {
  std::ostringstream os;
  os << m->name();
  for (const auto& sub : m->modules(/*include_self=*/true)) {
    if (sub != m) os << " " << sub->name();
    if (auto d = std::dynamic_pointer_cast<nn::DistributedLinearBase>(sub))
      os << "(" << d->in_features() << " -> " << d->out_features() << (d->replicated() ? ", replicated" : "")
         << " on " << (d->partition().is_null() ? std::string("none") : d->partition().describe()) << ")";
    if (auto e = std::dynamic_pointer_cast<nn::VocabParallelEmbeddingImpl>(sub))
      os << "(" << e->vocab() << " x " << e->hidden() << " on " << e->partition().describe() << ")";
  }
  // (A vocabulary-parallel table's rows, and a replicated Linear layer's
  // blocks, differ between tp ranks when the sizes do not divide: they are
  // described by their sizes above.)
  std::set<const void*> sharded;
  for (const auto& sub : m->modules(/*include_self=*/true))
    if (std::dynamic_pointer_cast<nn::VocabParallelEmbeddingImpl>(sub) ||
        std::dynamic_pointer_cast<nn::DistributedLinearBase>(sub))
      for (const auto& p : sub->parameters()) sharded.insert(p.unsafeGetTensorImpl());
  for (const auto& p : replicated_parameters(m)) {
    if (sharded.count(p.unsafeGetTensorImpl())) continue;
    os << " [";
    for (int64_t i = 0; i < p.dim(); ++i) os << (i ? "x" : "") << p.size(i);
    os << " " << c10::toString(p.scalar_type()) << "]";  // (the replicas' broadcast at construction sends them alike)
  }
  return os.str();
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  for (std::string line; std::getline(is, line);) out.push_back(line);
  return out;
}

// Every rank must have built the same model with the same split points (a
// rank whose model differs would run other layers, or wait for messages
// that never come): one allgather over the world, the same verdict on
// every rank. `problem`: this rank's own reason the model cannot run.
void agree_on_the_model(const Stages& m, const std::vector<int>& split_points, const std::string& problem) {
  std::string mine = std::to_string(m.children.size()) + "\n" + list_text(split_points);
  for (size_t i = 0; i < m.children.size(); ++i) mine += "\n" + describe_layer(m.children[i]);
  const auto all = allgather(problem.empty() ? mine : "!" + problem, WORLD);
  const auto stage_of = [](int r) { return std::to_string(layout().place(r).pp_rank); };
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty() && all[r][0] == '!')
      throw UsageError("smp::DistributedModel: on stage " + stage_of(static_cast<int>(r)) + " (world rank " +
                       std::to_string(r) + "), " + all[r].substr(1));
  const auto first = split_lines(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const auto theirs = split_lines(all[r]);
    const std::string head = "smp::DistributedModel: the ranks built different models (every rank must build the "
                             "same model and give the same split points): ";
    const std::string zero = "world rank 0", other = "world rank " + std::to_string(r);
    if (theirs[0] != first[0])
      throw UsageError(head + zero + " has " + first[0] + " layers, " + other + " has " + theirs[0]);
    if (theirs[1] != first[1])
      throw UsageError(head + zero + " gives the split points " + first[1] + ", " + other + " " + theirs[1]);
    for (size_t i = 2; i < first.size() && i < theirs.size(); ++i)
      if (theirs[i] != first[i])
        throw UsageError(head + "layer " + std::to_string(i - 2) + " is " + first[i] + " on " + zero + " and " +
                         theirs[i] + " on " + other);
  }
}

// partita's distributed layers in the layers of stage k must run on stage
// k's ranks (pp rank k mod pp_size, every replica and tp rank: what
// smp::stage_partitions(k) gives), the Linear layers split over tp along
// their model axis. (A LayerNorm, embedding or dropout built on another
// stage's ranks would return clones of its input where it runs.)
// Every rank checks every layer (the same verdict everywhere; agreed over
// the world all the same).
// The partition a stage-bound layer of partita's runs on (a distributed
// Linear layer, a LayerNorm, an embedding, a cross-entropy, a dropout), or
// null for any other module.
const mpi::Partition* stage_bound_partition(const std::shared_ptr<torch::nn::Module>& sub) {
  if (const auto d = std::dynamic_pointer_cast<nn::DistributedLinearBase>(sub)) return &d->partition();
  if (const auto n = std::dynamic_pointer_cast<nn::SequenceParallelLayerNormImpl>(sub)) return &n->partition();
  if (const auto e = std::dynamic_pointer_cast<nn::VocabParallelEmbeddingImpl>(sub)) return &e->partition();
  if (const auto c = std::dynamic_pointer_cast<nn::VocabParallelCrossEntropyImpl>(sub)) return &c->partition();
  if (const auto o = std::dynamic_pointer_cast<nn::SeededDropoutImpl>(sub)) return &o->partition();
  return nullptr;
}

void check_tensor_parallel_layers(const Stages& m, int ranks) {
  std::string problem;
  const Layout& l = layout();
  auto sorted = [](std::vector<int> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  for (size_t k = 0; k + 1 < m.bounds.size() && problem.empty(); ++k)
    for (int i = m.bounds[k]; i < m.bounds[k + 1] && problem.empty(); ++i)
      for (const auto& sub : m.children[i]->modules(/*include_self=*/true)) {
        const mpi::Partition* of = stage_bound_partition(sub);
        if (!of) continue;
        const auto d = std::dynamic_pointer_cast<nn::DistributedLinearBase>(sub);
        const int pp = static_cast<int>(k) % ranks;
        const mpi::Partition& P = *of;
        const std::vector<int> want = sorted(stage_workers(pp));
        const std::vector<int> got = P.is_null() ? std::vector<int>{} : sorted(P.workers());
        const std::string what = "layer " + std::to_string(i) + " ('" + m.names[i] + "') runs on stage " +
                                 std::to_string(k) + " (pp rank " + std::to_string(pp) + ", world ranks " +
                                 list_text(want) + "), but its " + sub->name();
        if (got != want) {
          int built_for = -1;
          for (int s = 0; s < ranks; ++s)
            if (sorted(stage_workers(s)) == got) built_for = s;
          if (built_for >= 0)
            problem = what + " was built on the ranks of pp rank " + std::to_string(built_for) +
                      " (smp::stage_partitions(" + std::to_string(built_for) + ")): a stage boundary falls inside "
                      "a tensor-parallel block, or the layer was built for another stage";
          else
            problem = what + " was built on world ranks " + list_text(got) + ", which are no stage's ranks; build "
                      "it on smp::stage_partitions(" + std::to_string(pp) + ")";
        } else if (d && P.cartesian() && !std::dynamic_pointer_cast<nn::DistributedLinearImpl>(sub) &&
                   P.shape().back() != l.tp_size()) {
          problem = what + " splits its features over M = " + std::to_string(P.shape().back()) +
                    " workers (partition " + P.describe() + "), and tensor_parallel_degree is " +
                    std::to_string(l.tp_size()) + "; build it on smp::stage_partitions(" + std::to_string(pp) + ")";
        }
        if (!problem.empty()) break;
      }
  const auto all = allgather(problem, WORLD);
  for (const auto& p : all)
    if (!p.empty()) throw UsageError("smp::DistributedModel: " + p);
}

// In a stage split over tp > 1 ranks, a layer with parameters that partita
// does not know would get, on each tp rank, only the gradient of what that
// rank computed, and nothing would sum it (docs/3d.md, "One rule for every
// parameter"): refused, naming the layer. Every rank built the same model
// (agreed above), so every rank reaches the same verdict.
void check_parameters_known_to_tensor_parallel(const Stages& m) {
  if (layout().tp_size() <= 1) return;
  for (size_t i = 0; i < m.children.size(); ++i)
    for (const auto& sub : m.children[i]->modules(/*include_self=*/true)) {
      if (std::dynamic_pointer_cast<nn::DistributedLinearBase>(sub) ||
          std::dynamic_pointer_cast<nn::SequenceParallelLayerNormImpl>(sub) ||
          std::dynamic_pointer_cast<nn::VocabParallelEmbeddingImpl>(sub))
        continue;
      const auto own = sub->named_parameters(/*recurse=*/false);
      if (own.is_empty()) continue;
      std::string names;
      for (const auto& p : own) names += (names.empty() ? "'" : ", '") + p.key() + "'";
      throw UsageError("smp::DistributedModel: layer " + std::to_string(i) + " ('" + m.names[i] + "') holds " +
                       sub->name() + " with parameters " + names + ", which partita does not know how to train " +
                       "under tensor_parallel_degree " + std::to_string(layout().tp_size()) +
                       ": each tp rank would get only its own share of their gradient. Build tensor-parallel "
                       "stages from partita's layers (nn::SequenceParallelLayerNorm, nn::VocabParallelEmbedding, "
                       "nn::DistributedLinear*)");
    }
}

// A parameter two modules share (tied weights). Where its two owners run
// on different pp ranks, each rank would train its own copy with its own
// stage's share of the gradient, and nothing would add the two; where one
// owner is partita's distributed Linear layer that sums its replicas'
// gradients onto its stored copy (not a replicated one), the pipeline
// averages the other owner's. Both refused, naming the two places; a tie
// between plain modules on one pp rank, or one module reused on one pp
// rank, trains as it does in one process. (A distributed
// layer holds its parameters on some ranks only: the verdict is agreed.)
void check_tied_parameters(const Stages& m, int ranks) {
  std::string problem;
  struct Owner {
    size_t layer;
    std::string name;
    bool distributed;  // its layer sums its copies' gradients itself
    const torch::nn::Module* module;
  };
  std::map<const void*, Owner> first;
  auto rank_of = [&](size_t layer) {
    size_t k = 0;
    while (m.bounds[k + 1] <= static_cast<int>(layer)) ++k;
    return static_cast<int>(k) % ranks;
  };
  for (size_t i = 0; i < m.children.size() && problem.empty(); ++i)
    for (const auto& item : m.children[i]->named_modules(/*name_prefix=*/m.names[i], /*include_self=*/true)) {
      const auto d = std::dynamic_pointer_cast<nn::DistributedLinearBase>(item.value());
      const bool distributed = d && !d->replicated();
      for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
        const Owner here{i, item.key() + "." + p.key(), distributed, item.value().get()};
        const auto [it, fresh] = first.try_emplace(p.value().unsafeGetTensorImpl(), here);
        if (fresh) continue;
        const Owner& there = it->second;
        const bool apart = rank_of(there.layer) != rank_of(i);
        if (!apart && (there.module == here.module || (!there.distributed && !here.distributed))) continue;
        problem = "'" + there.name + "' (layer " + std::to_string(there.layer) +
                         ") and '" + here.name + "' (layer " + std::to_string(i) + ") are one tensor, " +
                         (apart ? "on different pp ranks (" + std::to_string(rank_of(there.layer)) + " and " +
                                      std::to_string(rank_of(i)) + "): each would train its own copy"
                                : std::string("and one of them is a partita distributed layer's, whose gradient is "
                                              "summed where the other's is averaged")) +
                  ". Tied parameters are trained only between plain modules on one pp rank";
        break;
      }
      if (!problem.empty()) break;
    }
  for (const auto& p : allgather(problem, WORLD))
    if (!p.empty()) throw UsageError("smp::DistributedModel: " + p);
}

}  // namespace

void add_layer_adapter(LayerAdapter adapter) { layer_adapters().push_back(std::move(adapter)); }

bool holds_distributed_layers(const std::shared_ptr<torch::nn::Module>& m) {
  for (const auto& sub : m->modules(/*include_self=*/true))
    if (std::dynamic_pointer_cast<nn::DistributedLinearBase>(sub)) return true;
  return false;
}

namespace {
// A distributed layer that sums its gradients over its data-parallel copies
// itself (seed 002's broadcast, ZeRO-3); a replicated one leaves that to the
// pipeline's average.
bool sums_its_copies(const std::shared_ptr<torch::nn::Module>& sub) {
  const auto d = std::dynamic_pointer_cast<nn::DistributedLinearBase>(sub);
  return d && !d->replicated();
}
}  // namespace

std::vector<at::Tensor> distributed_parameters(const std::shared_ptr<torch::nn::Module>& m) {
  std::vector<at::Tensor> out;
  std::set<const void*> seen;
  for (const auto& sub : m->modules(/*include_self=*/true))
    if (sums_its_copies(sub))
      for (const auto& p : sub->parameters())
        if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

std::vector<at::Tensor> replicated_parameters(const std::shared_ptr<torch::nn::Module>& m) {
  std::set<const void*> skip;
  for (const auto& sub : m->modules(/*include_self=*/true))
    if (sums_its_copies(sub))
      for (const auto& p : sub->parameters()) skip.insert(p.unsafeGetTensorImpl());
  std::vector<at::Tensor> out;
  for (const auto& p : m->parameters())
    if (!skip.count(p.unsafeGetTensorImpl())) out.push_back(p);
  return out;
}

Stages split_into_stages(const std::shared_ptr<torch::nn::Module>& model, const std::vector<int>& split_points,
                         int ranks, int v) {
  const int stages = ranks * v;
  Stages m;
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
  agree_on_the_model(m, split_points, problem);
  // Virtual stages: every rank holds v chunks of at least one layer, so
  // the model needs ranks * v layers (the same verdict on every rank: the
  // counts agree).
  if (v > 1 && n < stages)
    throw UsageError("smp::DistributedModel: virtual_pipeline_model_parallel_size " + std::to_string(v) + " on " +
                     std::to_string(ranks) + " pipeline ranks needs " + std::to_string(stages) +
                     " stages of at least one layer, and the model has " + std::to_string(n) +
                     " layers: use a v with ranks * v <= " + std::to_string(n));
  if (split_points.empty()) {
    std::vector<int64_t> params;
    bool distributed = false;
    for (const auto& child : m.children) {
      int64_t c = 0;
      for (const auto& p : child->parameters()) c += p.numel();
      params.push_back(c);
      distributed = distributed || holds_distributed_layers(child);
    }
    // partita's distributed layers hold different blocks (or none) on
    // different ranks: every rank balances by the world's sum of the counts,
    // so that every replica and tp rank splits the model alike. (Every rank
    // builds the same model, so all take this branch or none.)
    if (distributed && !params.empty()) {
      // On the heap, kept where the wait gives the sum up.
      const auto counts = std::make_shared<std::vector<int64_t>>(params);
      MPI_Request req;
      PARTITA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, counts->data(), static_cast<int>(counts->size()), MPI_INT64_T,
                                       MPI_SUM, communicator(WORLD), &req));
      mpi::wait_holding(req, "smp::DistributedModel (the layers' parameter counts over the world)", counts);
      params = *counts;
    }
    m.bounds = balance_by_parameters(params, stages);
  } else {
    if (static_cast<int>(split_points.size()) != stages - 1)
      throw UsageError("smp::DistributedModel: " + std::to_string(split_points.size()) +
                       " split points for " + std::to_string(stages) + " stages (it needs " +
                       std::to_string(stages - 1) + ")");
    if (n < stages) balance_by_parameters(std::vector<int64_t>(n, 0), stages);  // raises
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
  // partita's layers anywhere in the model (the same types on every rank:
  // agreed above, so every rank takes this branch or none).
  bool partita_layers = false;
  for (const auto& child : m.children)
    for (const auto& sub : child->modules(/*include_self=*/true))
      partita_layers = partita_layers || stage_bound_partition(sub) != nullptr;
  if (partita_layers) check_tensor_parallel_layers(m, ranks);
  check_parameters_known_to_tensor_parallel(m);
  check_tied_parameters(m, ranks);
  m.calls = std::move(calls);
  return m;
}

}  // namespace partita::smp::detail
