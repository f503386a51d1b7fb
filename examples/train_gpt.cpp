// Trains a small character-level GPT under pipeline x tensor x data
// parallelism with partita's transformer layers (docs/transformer.md): 4
// blocks, 4 heads, width 64, context 64, a vocabulary of the 128 ASCII
// characters, on a text every Debian system has (the GPL's text under
// /usr/share/common-licenses, or the file given with --text).
//
//   mpiexec.mpich -n 8 build/examples/train_gpt            # pp 2 x tp 2 x dp 2
//   PARTITA_SMP_CONFIG='{"partitions": 1, "tensor_parallel_degree": 2}' mpiexec.mpich -n 4 build/examples/train_gpt
//   build/examples/train_gpt --steps 50 --batch 16         # one process
//
// The Linear layers' data parallelism: --data-parallel replicated (the
// default: every replica holds its blocks, the step averages their
// gradients once, as DistributedDataParallel) or stored (seed 002's: stored
// on replica 0, broadcast in every microbatch's forward; docs/3d.md).
//
// --dropout P turns on the hidden dropout (after the embedding, each
// attention and each MLP; 0, none, by default), each site's masks drawn
// from the elements' places in the global batch (docs/transformer.md).
//
// Checkpoints (docs/checkpoints.md): --checkpoint-every N saves the model
// and Adam's state after every N steps to DIR/step-K (step-K-r2, ... where
// DIR/step-K exists: a run resumed from an older checkpoint; DIR: --checkpoint-dir,
// "checkpoints" under the working directory by default) and then points
// DIR/latest at it; --resume PATH continues from a checkpoint (PATH/latest
// where PATH is a directory of them) at whatever layout this run has, the
// data drawn as the uninterrupted run draws them. --die-at-step K ends
// the last rank with SIGKILL as step K begins (the tests of a lost rank).
//
// Prints the layout, then the loss per step (the mean cross-entropy over the
// global batch, in nats); exits 0 when the loss fell over the run.
#include <fcntl.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gpt/gpt.hpp"
#include "partita/distribute.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/smp.hpp"
#include "partita/smp/checkpoint.hpp"
#include "partita/smp/pipeline.hpp"
#include "partita/smp/step.hpp"
#include "partita/smp/tensor_parallel.hpp"

namespace mpi = partita::mpi;
namespace nn = partita::nn;
namespace smp = partita::smp;

struct Flags {
  int steps = 30;
  int64_t batch = 16;  // sequences per step, over all replicas
  double lr = 3e-3;
  uint64_t seed = 2026;
  std::string text = "/usr/share/common-licenses/GPL-3";
  int threads = 1;  // LibTorch intra-op threads per process
  int checkpoint_every = 0;
  std::string checkpoint_dir = "checkpoints";
  std::string resume;
  int die_at_step = -1;
  gpt::Sizes sizes;
  bool help = false;
};

const char* const kUsage =
    "usage: train_gpt [--steps N] [--batch N] [--lr X] [--seed N] [--text FILE] [--threads N]\n"
    "                 [--layers N] [--hidden N] [--heads N] [--context N] [--dropout P]\n"
    "                 [--data-parallel replicated|stored] [--checkpoint-every N] [--checkpoint-dir DIR]\n"
    "                 [--resume DIR] [--die-at-step N]\n";

// The whole of `v` as an integer in [lo, hi], or an error naming the flag.
int64_t integer_flag(const std::string& k, const std::string& v, int64_t lo, int64_t hi) {
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || x < lo || x > hi)
    throw std::invalid_argument("train_gpt: " + k + " takes an integer from " + std::to_string(lo) + " to " +
                                std::to_string(hi) + ", not '" + v + "'");
  return x;
}

double real_flag(const std::string& k, const std::string& v, double lo, double hi) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || !(x >= lo && x < hi))
    throw std::invalid_argument("train_gpt: " + k + " takes a number in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "), not '" + v + "'");
  return x;
}

Flags parse(int argc, char** argv) {
  Flags f;
  constexpr int64_t kInt = std::numeric_limits<int>::max(), kBig = int64_t{1} << 40;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      f.help = true;
      return f;
    }
    if (i + 1 >= argc) throw std::invalid_argument("train_gpt: " + k + " needs a value");
    const std::string v = argv[i + 1];
    if (k == "--steps") f.steps = static_cast<int>(integer_flag(k, v, 0, kInt));
    else if (k == "--batch") f.batch = integer_flag(k, v, 1, kBig);
    else if (k == "--lr") f.lr = real_flag(k, v, 0, 1e6);
    else if (k == "--seed") f.seed = static_cast<uint64_t>(integer_flag(k, v, 0, std::numeric_limits<int64_t>::max()));
    else if (k == "--text") f.text = v;
    else if (k == "--threads") f.threads = static_cast<int>(integer_flag(k, v, 1, 1024));
    else if (k == "--layers") f.sizes.layers = integer_flag(k, v, 1, kBig);
    else if (k == "--hidden") f.sizes.hidden = integer_flag(k, v, 1, kBig);
    else if (k == "--heads") f.sizes.heads = integer_flag(k, v, 1, kBig);
    else if (k == "--context") f.sizes.context = integer_flag(k, v, 1, kBig);
    else if (k == "--dropout") f.sizes.dropout = real_flag(k, v, 0, 1);
    else if (k == "--checkpoint-every") f.checkpoint_every = static_cast<int>(integer_flag(k, v, 0, kInt));
    else if (k == "--checkpoint-dir") f.checkpoint_dir = v;
    else if (k == "--resume") f.resume = v;
    else if (k == "--die-at-step") f.die_at_step = static_cast<int>(integer_flag(k, v, -1, kInt));
    else if (k == "--data-parallel" && (v == "replicated" || v == "stored")) f.sizes.replicated = v == "replicated";
    else if (k == "--data-parallel") throw std::invalid_argument("train_gpt: --data-parallel takes replicated or stored, not " + v);
    else throw std::invalid_argument("train_gpt: unknown flag " + k);
  }
  return f;
}

smp::Config configuration(int world) {
  if (std::getenv(smp::kConfigVariable)) return smp::Config::from_environment();
  smp::Config c;  // two stages of two tp ranks where the world allows
  c.partitions(world % 2 == 0 ? 2 : 1);
  c.tensor_parallel_degree(world % (2 * c.partitions()) == 0 ? 2 : 1);
  c.microbatches(2);
  c.pipeline("interleaved");
  return c;
}

// A checkpoint, or the one a directory of them names in its `latest`.
std::string checkpoint_of(const std::string& path) {
  if (std::filesystem::exists(path + "/manifest.json") || !std::filesystem::exists(path + "/latest")) return path;
  std::ifstream in(path + "/latest");
  std::string name;
  std::getline(in, name);
  return path + "/" + name;
}

// Rank 0 points dir/latest at `name`: written aside and flushed, renamed
// over it, and the directory flushed, so that `latest` never names a
// checkpoint a crash could lose (an error ends the job).
void point_latest(const std::string& dir, const std::string& name) {
  if (smp::rank() != 0) return;
  const std::string aside = dir + "/latest.new", line = name + "\n";
  const int fd = ::open(aside.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const bool written = fd >= 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                       ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  if (!written) throw std::runtime_error("train_gpt: cannot write " + aside + ": " + std::strerror(errno));
  std::filesystem::rename(aside, dir + "/latest");
  const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (d < 0 || ::fsync(d) != 0) throw std::runtime_error("train_gpt: cannot flush " + dir + ": " + std::strerror(errno));
  ::close(d);
}

double group_sum(double v, smp::CommGroup group) {
  double s = 0;
  for (double x : smp::allgather(v, group)) s += x;
  return s;
}

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  Flags f;
  try {
    f = parse(argc, argv);  // the same arguments on every rank: every rank refuses alike
  } catch (const std::invalid_argument& e) {
    if (mpi::world_rank() == 0) std::fprintf(stderr, "%s\n%s", e.what(), kUsage);
    return 2;
  }
  if (f.help) {
    if (mpi::world_rank() == 0) std::printf("%s", kUsage);
    return 0;
  }
  at::set_num_threads(f.threads);
  smp::init(configuration(mpi::world_size()));
  const int pp = smp::pp_size(), tp = smp::tp_size(), dp = smp::dp_size(), stage = smp::pp_rank();
  const int microbatches = smp::config().microbatches();
  const gpt::Sizes& s = f.sizes;
  const int64_t T = s.context;
  if (smp::rank() == 0)
    std::printf("train_gpt: %d processes = dp %d x pp %d x tp %d, %d microbatches, pipeline %s, Linear layers %s; "
                "%lld blocks, %lld heads, width %lld, context %lld, vocabulary %lld, dropout %g\n",
                smp::size(), dp, pp, tp, microbatches, smp::config().pipeline().c_str(),
                s.replicated ? "replicated" : "stored on replica 0", (long long)s.layers,
                (long long)s.heads, (long long)s.hidden, (long long)T, (long long)s.vocab, s.dropout);
  if (f.batch % (dp * microbatches) != 0 || T % tp != 0) {
    if (smp::rank() == 0) std::printf("train_gpt: --batch must divide by dp x microbatches and the context by tp\n");
    return 2;
  }

  // The text, as ASCII codes (others become '?').
  std::ifstream in(f.text, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (static_cast<int64_t>(text.size()) < T + 2) {
    if (smp::rank() == 0) std::printf("train_gpt: cannot read enough text from %s\n", f.text.c_str());
    return 2;
  }
  std::vector<int64_t> codes;
  for (unsigned char ch : text) codes.push_back(ch < 128 ? ch : '?');
  const at::Tensor corpus = at::tensor(codes, at::TensorOptions(at::kLong));

  // The model: every rank builds every layer on its stage's partitions,
  // from the same global parameters one process would start from.
  std::vector<smp::StagePartitions> parts;
  for (int k = 0; k < pp; ++k) parts.push_back(smp::stage_partitions(k));
  const int v = smp::config().virtual_pipeline_model_parallel_size();
  gpt::Model m = gpt::build(parts, s, v);
  gpt::load(m, gpt::init_parameters(s, f.seed));
  smp::DistributedModel model(m.layers, gpt::split_points(s, pp * v));
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(f.lr));

  nn::VocabParallelCrossEntropy ce(parts[pp - 1].tokens, s.vocab);
  const double tokens_per_microbatch = static_cast<double>(f.batch / dp / microbatches * T);
  auto train = smp::step([&](at::Tensor xb, at::Tensor yb) {
    const at::Tensor out = model(xb);
    // This rank's tokens' share of its replica's mean cross-entropy
    // (docs/3d.md, "One rule for every parameter").
    at::Tensor loss = stage == pp - 1 ? ce(out, yb).sum() / tokens_per_microbatch : out.sum() * 0;
    model.backward(loss);
    return loss;
  });

  auto gen = at::detail::createCPUGenerator(f.seed + 1);
  auto draw = [&] { return at::randint(0, corpus.size(0) - T - 1, {f.batch}, gen, at::TensorOptions(at::kLong)); };
  int start = 0;
  if (!f.resume.empty()) {
    const std::string from = checkpoint_of(f.resume);
    const partita::checkpoint::Info info = smp::load_checkpoint(from, model, &opt);
    start = static_cast<int>(info.counters.at("step"));
    // The data where the saved run left them: the batches it drew, drawn again.
    for (int64_t b = 0; b < info.counters.at("data.batches"); ++b) draw();
    if (smp::rank() == 0) std::printf("train_gpt: resumed from %s (saved at %s) at step %d\n", from.c_str(), info.layout.c_str(), start);
  }
  if (f.checkpoint_every > 0 && smp::rank() == 0) std::filesystem::create_directories(f.checkpoint_dir);
  const at::Tensor positions = at::arange(T, at::TensorOptions(at::kLong)).unsqueeze(0).expand({f.batch, T});
  const mpi::Partition& cut = parts[stage].tokens;
  double first = 0, last = 0;
  std::vector<double> seconds;
  for (int step = start; step < f.steps; ++step) {
    if (step == f.die_at_step && smp::rank() == smp::size() - 1) std::raise(SIGKILL);
    // Every rank draws the same windows of the text; each keeps its piece.
    const at::Tensor starts = draw();
    const at::Tensor offsets = starts.unsqueeze(1) + at::arange(T, at::TensorOptions(at::kLong)).unsqueeze(0);
    const at::Tensor ids = corpus.index_select(0, offsets.reshape(-1)).reshape({f.batch, T});
    const at::Tensor targets = corpus.index_select(0, (offsets + 1).reshape(-1)).reshape({f.batch, T});
    const at::Tensor x = partita::distribute(at::stack({ids, positions}, 2).contiguous(), cut);
    const at::Tensor y = partita::distribute(targets.unsqueeze(2).contiguous(), cut).squeeze(2).contiguous();

    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    smp::StepOutput losses = train(x, y);
    opt.step();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    double mine = 0;
    for (const auto& l : losses.outputs()) mine += l.item<double>();
    const double loss = group_sum(group_sum(mine / microbatches, smp::TP_GROUP), smp::DP_GROUP) / dp;
    if (smp::rank() == 0) std::printf("step %d: loss %.6f\n", step, loss);
    if (step == start) first = loss;
    last = loss;
    if (f.checkpoint_every > 0 && (step + 1) % f.checkpoint_every == 0) {
      // A run resumed from an older checkpoint reaches steps saved before;
      // a checkpoint is never overwritten, so this one takes the next free
      // name (step-4-r2, ...). Every rank sees the same directory: a save
      // makes its name visible only after every rank has entered it.
      std::string name = "step-" + std::to_string(step + 1);
      for (int again = 2; std::filesystem::exists(std::filesystem::path(f.checkpoint_dir) / name); ++again)
        name = "step-" + std::to_string(step + 1) + "-r" + std::to_string(again);
      smp::save_checkpoint(f.checkpoint_dir + "/" + name, model, &opt,
                           {{{"step", step + 1}, {"data.batches", step + 1}}, ""});
      point_latest(f.checkpoint_dir, name);
    }
  }
  if (seconds.size() < 2) {
    if (smp::rank() == 0) std::printf("train_gpt: %zu steps run, too few to see the loss fall\n", seconds.size());
    return 0;
  }
  std::sort(seconds.begin(), seconds.end());
  if (smp::rank() == 0)
    std::printf("train_gpt: the loss %s from %.4f to %.4f (median step %.4f s)\n", last < first ? "fell" : "did not fall",
                first, last, seconds[seconds.size() / 2]);
  return last < first ? 0 : 1;
}
