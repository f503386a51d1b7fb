#include "partita/testing/pipeline_checks.hpp"

#include <cmath>
#include <map>
#include <sstream>

#include "partita/smp.hpp"
#include "partita/smp/step.hpp"
#include "partita/testing/checks.hpp"

namespace partita::testing {

namespace {

// Pre-norm residual block of a transformer's feed-forward half.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t width, int64_t hidden)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        up(register_module("up", torch::nn::Linear(width, hidden))),
        down(register_module("down", torch::nn::Linear(hidden, width))) {}
  at::Tensor forward(const at::Tensor& x) { return x + down(torch::gelu(up(norm(x)))); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// Sets every parameter of `ref` (one process's whole model) to the
// pipeline's, bit for bit: each parameter is held by one rank of replica 0,
// which contributes its values while every other rank contributes zeros,
// and a sum of one value and zeros is exact.
void copy_pipeline_parameters(smp::DistributedModel& model, torch::nn::Sequential& ref) {
  std::map<std::string, at::Tensor> mine;
  if (smp::dp_rank() == 0)
    for (const auto& [name, p] : model.named_parameters()) mine[name] = p;
  std::vector<double> flat;
  const auto params = ref->named_parameters();
  for (const auto& item : params) {
    const auto it = mine.find(item.key());
    const at::Tensor v = it != mine.end() ? it->second.detach().to(at::kDouble).contiguous()
                                          : at::zeros(item.value().sizes(), at::kDouble);
    flat.insert(flat.end(), v.data_ptr<double>(), v.data_ptr<double>() + v.numel());
  }
  flat = sum_over_ranks(std::move(flat));
  torch::NoGradGuard no_grad;
  size_t at = 0;
  for (const auto& item : params) {
    at::Tensor p = item.value();
    const auto n = static_cast<size_t>(p.numel());
    p.copy_(at::from_blob(flat.data() + at, p.sizes(), at::kDouble).to(p.scalar_type()));
    at += n;
  }
}

}  // namespace

torch::nn::Sequential build_model(const ModelSpec& spec) {
  torch::manual_seed(spec.seed);
  torch::nn::Sequential seq;
  const auto& w = spec.widths;
  const size_t n = w.size();
  if (spec.integer) {
    for (size_t i = 0; i + 1 < n; ++i) {
      torch::nn::Linear layer(w[i], w[i + 1]);
      {
        torch::NoGradGuard no_grad;
        for (auto& p : layer->parameters()) p.copy_(torch::randint(-1, 2, p.sizes()));
      }
      seq->push_back(layer);
      if (i + 2 < n) seq->push_back(torch::nn::ReLU());
    }
  } else if (!spec.blocks) {
    for (size_t i = 0; i + 1 < n; ++i) {
      seq->push_back(torch::nn::Linear(w[i], w[i + 1]));
      if (i + 2 < n) seq->push_back(torch::nn::GELU());
    }
  } else {
    seq->push_back(torch::nn::Linear(w[0], w[1]));
    for (size_t i = 1; i + 1 < n; ++i) seq->push_back(Block(w[1], w[i]));
    seq->push_back(torch::nn::Linear(w[1], w[n - 1]));
  }
  seq->to(torch::kDouble);
  return seq;
}

std::ostream& operator<<(std::ostream& os, const PipelineRun& r) {
  os << "{\"model\": \"" << (r.model.integer ? "integer_mlp" : r.model.blocks ? "blocks" : "mlp") << "\", \"widths\": [";
  for (size_t i = 0; i < r.model.widths.size(); ++i) os << (i ? ", " : "") << r.model.widths[i];
  os << "], \"seed\": " << r.model.seed << ", \"microbatches\": " << r.microbatches << ", \"split_points\": [";
  for (size_t i = 0; i < r.split_points.size(); ++i) os << (i ? ", " : "") << r.split_points[i];
  os << "], \"batch\": " << r.batch << ", \"steps\": " << r.steps;
  if (smp::initialized())
    os << ", \"partitions\": " << smp::mp_size() << ", \"pipeline\": \"" << smp::config().pipeline() << "\"";
  if (smp::initialized() && smp::config().virtual_pipeline_model_parallel_size() != 1)
    os << ", \"virtual_pipeline_model_parallel_size\": " << smp::config().virtual_pipeline_model_parallel_size();
  return os << "}";
}

std::string check_against_serial(const PipelineRun& run, double tol, smp::PipelineStats* stats) {
  const int dp = smp::dp_size(), d = smp::dp_rank();
  torch::nn::Sequential net = build_model(run.model);
  torch::nn::Sequential ref = build_model(run.model);
  smp::DistributedModel model(net, run.split_points);
  torch::optim::SGD opt(model.parameters(), run.lr);
  torch::optim::SGD ref_opt(ref->parameters(), run.lr);
  std::map<std::string, at::Tensor> ref_params;
  for (const auto& item : ref->named_parameters()) ref_params[item.key()] = item.value();

  auto train = mse_step(model, run.microbatches);

  const int64_t in = run.model.widths.front(), out = run.model.widths.back(), B = run.batch;
  std::ostringstream err;
  for (int step = 0; step < run.steps; ++step) {
    torch::manual_seed(run.model.seed * 7919 + static_cast<uint64_t>(step));
    const at::Tensor x = run.model.integer ? torch::randint(-3, 4, {dp * B, in}, torch::kDouble)
                                           : torch::randn({dp * B, in}, torch::kDouble);
    const at::Tensor y = run.model.integer ? torch::randint(-3, 4, {dp * B, out}, torch::kDouble)
                                           : torch::randn({dp * B, out}, torch::kDouble);
    const at::Tensor xd = x.narrow(0, d * B, B), yd = y.narrow(0, d * B, B);
    // Each step is compared at the pipeline's own parameters: two
    // independently trained trajectories would measure the model's
    // conditioning, not the pipeline (docs/pipeline.md, "Equal to one process").
    copy_pipeline_parameters(model, ref);

    const at::Tensor loss = train(xd, yd).reduce_mean();
    const at::Tensor full = ref->forward(x);
    const at::Tensor ref_loss = torch::mse_loss(full.narrow(0, d * B, B), yd).detach();
    torch::mse_loss(full, y).backward();

    if (!(std::abs(loss.item<double>() - ref_loss.item<double>()) <= tol))
      err << "step " << step << ": loss " << loss.item<double>() << " vs " << ref_loss.item<double>() << "; ";
    double norm = 0;
    for (const auto& [name, p] : model.named_parameters()) {
      const at::Tensor& g = p.grad();
      const at::Tensor& rg = ref_params.at(name).grad();
      if (!g.defined()) {
        err << "step " << step << ": " << name << " has no gradient; ";
        continue;
      }
      norm += g.norm().item<double>();
      const double diff = max_diff(g, rg);
      if (!(diff <= tol)) err << "step " << step << ": gradient of " << name << " differs by " << diff << "; ";
    }
    // A check on zeros proves nothing: a stage with parameters
    // must have non-zero gradients. (No early exit on a difference: every
    // rank runs every step, or the others would wait for this one.)
    if (!model.parameters().empty() && !(norm > 0))
      err << "step " << step << ": every gradient of stage " << model.stage() << " is zero; ";
    opt.step();
    ref_opt.step();
    opt.zero_grad();
    ref_opt.zero_grad();
    if (step + 1 == run.steps) {  // the last update, against one process's from the same point
      for (const auto& [name, p] : model.named_parameters()) {
        const double diff = max_diff(p, ref_params.at(name));
        if (!(diff <= tol)) err << "after " << run.steps << " steps: " << name << " differs by " << diff << "; ";
      }
    }
  }
  if (stats) *stats = model.stats();
  return err.str();
}

}  // namespace partita::testing
