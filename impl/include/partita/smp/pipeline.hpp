// Pipeline-parallel execution (seed 004's smp.DistributedModel;
// docs/pipeline.md).
//
//   smp::init(smp::Config().partitions(4).microbatches(8).pipeline("1F1B"));
//   torch::nn::Sequential net(...);             // the whole model, on every rank
//   smp::DistributedModel model(net);            // keeps this rank's stage
//   auto train = smp::step([&](at::Tensor x, at::Tensor y) {
//     at::Tensor loss = torch::mse_loss(model(x), y);
//     model.backward(loss);                      // loss / microbatches, when the schedule says
//     return loss;
//   });
//   torch::optim::SGD opt(model.parameters(), 0.1);
//   smp::StepOutput losses = train(x, y);        // the last stage's losses, on every rank
//   opt.step(); opt.zero_grad();
//
// The model's layers (a Sequential's children, or any module's ordered
// children, docs/pipeline.md) are split into pp_size stages of consecutive
// layers (explicit split points, or balanced by parameter count); stage s
// runs on pp rank s, the peer in this rank's pp group (mp rank s without
// tensor parallelism; docs/3d.md). smp::step runs this rank's list of a verified schedule
// (partita/smp/schedule.hpp): "simple" (GPipe), "interleaved" (1F1B),
// "zero_bubble" (ZB-H1), "interleaved_virtual" (Megatron's interleaved 1F1B:
// the model in pp_size * v chunks, pp rank r holding r, r + pp_size, ...) or one
// set with set_schedule; the step function is called once per microbatch,
// at the forward of the model's call, and the other chunks' forwards (with
// virtual stages), the backward passes (full,
// or split into input and weight gradients) and the messages (activations
// forward, gradients back, MPI_Isend / MPI_Mrecv on the pp group) run where
// the list puts them. On every stage but the last, model(x)
// returns a stand-in of the output's shape (zeros): the step's returned
// tensors are replaced by the last stage's after the step. With dp_size > 1
// the replicas average their gradients (point to point over the dp group at
// the end of the step), all but those of partita's distributed layers
// (partita/nn/linear.hpp), which sum theirs over their own partition's
// data-parallel axis (docs/3d.md).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include "partita/smp.hpp"
#include "partita/smp/schedule.hpp"

namespace partita::smp {

// Raised on every other rank when a rank of a pipelined step fails with an
// error that is not an smp::UsageError (an exception in a layer's forward or
// backward, a missed deadline, ...): names the failed stage, where it
// failed and its error (docs/pipeline.md, "Errors"). A failed
// smp::UsageError is raised as an smp::UsageError on every rank.
struct PipelineError : Error {
  using Error::Error;
};

// A schedule of the user's own (built in code, or read with
// schedule_from_csv) for the steps that follow; set it alike on every rank.
// std::nullopt returns to Config::pipeline. Like the built-ins it is
// verified at every step before the first message (ScheduleError on every
// rank), and it must be for pp_size ranks, the step's microbatch count, as
// many stages per rank as the model has chunks, stage k on pp rank k mod
// pp_size (mp rank without tensor parallelism).
void set_schedule(std::optional<Schedule> s);
const std::optional<Schedule>& user_schedule();

// Counters of this stage, for the last step (docs/pipeline.md). An
// activation is a microbatch whose forward ran here and whose backward has
// not; its bytes are the outputs of this stage's layers for it.
struct PipelineStats {
  int live = 0;
  int peak_live = 0;
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
  double busy_seconds = 0;  // in this stage's layers, forward and backward
  double wait_seconds = 0;  // waiting for an activation or a gradient, or for
                            // the previous stage to take the gradient sent back
  double step_seconds = 0;  // first action to last action of the schedule
  int forwards = 0, backwards = 0;
  // Split backward (I and W, zero_bubble): weight and bias gradients that W
  // computed from what I left (Linear layers), and W passes that ran
  // autograd for the other layers' parameters.
  int weight_gradients_split = 0;
  int weight_autograd_passes = 0;
  // Bytes this rank sent in the step, by kind (docs/3d.md, "Communication
  // volume", has the definition for collectives and the formula for a
  // stack of tensor-parallel blocks). Data only: headers, shapes, the
  // stages' and layers' agreements and the returned values are not counted.
  //  - pipeline: activations to the next stage (SEND_F) and their
  //    gradients to the previous one (SEND_B);
  //  - tensor_parallel: partita's distributed layers' all-gathers and
  //    reduce-scatters of activations over their model-parallel axis (the
  //    tp group, on smp::stage_partitions), forward and adjoint;
  //  - data_parallel: those layers' parameters to their data-parallel
  //    copies and the gradients back (nn/traffic.hpp), and the dp average
  //    of the other parameters at the end of the step.
  int64_t pipeline_bytes = 0;
  int64_t tensor_parallel_bytes = 0;
  int64_t data_parallel_bytes = 0;
};

namespace detail {
using LayerCall = std::function<at::Tensor(const at::Tensor&)>;
// Returns an empty LayerCall when the module is not of the adapter's type.
using LayerAdapter = std::function<LayerCall(const std::shared_ptr<torch::nn::Module>&)>;
void add_layer_adapter(LayerAdapter adapter);
}  // namespace detail

// A module type the pipeline may call as a layer of a model that is not a
// torch::nn::Sequential (docs/pipeline.md): `Impl` (the module class, e.g.
// BlockImpl of TORCH_MODULE(Block)) has at::Tensor forward(at::Tensor).
// Call it on every rank, before building the DistributedModel.
template <typename Impl>
void register_layer() {
  detail::add_layer_adapter([](const std::shared_ptr<torch::nn::Module>& m) -> detail::LayerCall {
    auto p = std::dynamic_pointer_cast<Impl>(m);
    if (!p) return {};
    return [p](const at::Tensor& x) -> at::Tensor { return p->forward(x); };
  });
}

class DistributedModel {
 public:
  // Collective over the world (smp::init first). `split_points`: empty
  // (balanced by parameter count) or pp_size - 1 increasing layer indices in
  // (0, layers) at which a new stage starts. Every rank builds the same
  // model; this rank keeps layers [first_layer(), end_layer()). UsageError
  // on every rank when the model has fewer layers than stages, the ranks
  // built different models or gave different split points, partita's
  // distributed layers are not on their stage's ranks with M = tp
  // (docs/3d.md, "Bad input"), or the split points are bad.
  explicit DistributedModel(torch::nn::Sequential model, std::vector<int> split_points = {});
  // Any other module whose layers are its children: named_children(), in
  // the order they were registered, are the layers, and the module's
  // forward must be their chain, child(...child(x)) (the pipeline runs the
  // chain, never the module's own forward). Each child is called with one
  // tensor and returns one: a torch::nn::Sequential, one of torch::nn's
  // one-tensor modules (Linear, Conv1d, Conv2d, Embedding, LayerNorm,
  // BatchNorm1d, BatchNorm2d, Dropout, GELU, ReLU, SiLU, Tanh, Sigmoid,
  // Identity, Flatten), or a type given to register_layer<T>(). UsageError
  // on every rank for another child, or for parameters of the module's own
  // (outside its children). Parameter names are the module's own
  // ("block1.fc.weight").
  explicit DistributedModel(std::shared_ptr<torch::nn::Module> model, std::vector<int> split_points = {});
  template <typename M, typename = std::enable_if_t<!std::is_same_v<M, torch::nn::SequentialImpl>>>
  explicit DistributedModel(const torch::nn::ModuleHolder<M>& model, std::vector<int> split_points = {})
      : DistributedModel(std::static_pointer_cast<torch::nn::Module>(model.ptr()), std::move(split_points)) {}

  // Inside smp::step, once per microbatch: stage 0 runs on x, the others on
  // what the previous stage sends (x only gives the shape they check). The
  // last stage returns the output; the others a zero stand-in of its shape.
  at::Tensor operator()(const at::Tensor& x);
  at::Tensor forward(const at::Tensor& x) { return (*this)(x); }
  // Inside smp::step, once per microbatch, with a scalar that depends on
  // this microbatch's model output: its backward (of loss / microbatches)
  // runs when the schedule says. The other stages' backward passes start
  // from the gradient the next stage sends; their `loss` is only checked.
  void backward(const at::Tensor& loss);

  int stage() const;   // pp_rank (mp_rank without tensor parallelism)
  int stages() const;  // pp_size
  // Chunks per rank (Config::virtual_pipeline_model_parallel_size with the
  // "interleaved_virtual" pipeline; 1 otherwise and at pp_size 1), and the
  // model's stages this rank holds: stage(), stage() + stages(), ...
  // (stages() * virtual_stages() in all; bounds() has every one's layers).
  int virtual_stages() const;
  std::vector<int> local_stages() const;
  int first_layer() const;
  int end_layer() const;
  const std::vector<int>& bounds() const;  // every stage's bounds (stages * virtual_stages + 1)
  // This rank's parameters, every chunk's (for the optimizer), and with the
  // Sequential's own names ("3.weight"). first_layer() and end_layer() are
  // the rank's first chunk's.
  std::vector<at::Tensor> parameters() const;
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;
  // This rank's layers, every chunk's, under their names in the model ("3",
  // "blocks.0"): what smp::save_checkpoint walks.
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> named_layers() const;
  const PipelineStats& stats() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace partita::smp
