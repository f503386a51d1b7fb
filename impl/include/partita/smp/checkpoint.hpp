// Checkpoints of a pipeline: a DistributedModel's parameters and its
// optimizer's state, saved as global tensors at one layout and loaded at
// any other (docs/checkpoints.md).
//
//   smp::save_checkpoint("ckpt/step-100", model, &adam, {{{"step", 100}}});
//   ...  // later, at any pp x tp x dp the model allows
//   checkpoint::Info info = smp::load_checkpoint("ckpt/step-100", model, &adam);
#pragma once

#include <string>

#include "partita/checkpoint.hpp"
#include "partita/smp/pipeline.hpp"

namespace partita::smp {

// checkpoint::save_modules over model.named_layers() (every rank's own
// layers; the parameters under the model's names), with the optimizer's
// state; the manifest records the layout ("pp 2 x tp 2 x dp 2"). Every
// rank of the world calls it.
void save_checkpoint(const std::string& dir, const DistributedModel& model, torch::optim::Optimizer* optimizer = nullptr,
                     checkpoint::Info info = {});
// checkpoint::load_modules over the same layers: each rank reads its own
// blocks, whatever layout saved them.
checkpoint::Info load_checkpoint(const std::string& dir, const DistributedModel& model,
                                 torch::optim::Optimizer* optimizer = nullptr);

}  // namespace partita::smp
