#include "partita/smp/checkpoint.hpp"

#include "partita/smp.hpp"

namespace partita::smp {

void save_checkpoint(const std::string& dir, const DistributedModel& model, torch::optim::Optimizer* optimizer,
                     checkpoint::Info info) {
  if (info.layout.empty())
    info.layout = "pp " + std::to_string(pp_size()) + " x tp " + std::to_string(tp_size()) + " x dp " +
                  std::to_string(dp_size());
  checkpoint::save_modules(dir, model.named_layers(), optimizer, std::move(info));
}

checkpoint::Info load_checkpoint(const std::string& dir, const DistributedModel& model, torch::optim::Optimizer* optimizer) {
  return checkpoint::load_modules(dir, model.named_layers(), optimizer);
}

}  // namespace partita::smp
