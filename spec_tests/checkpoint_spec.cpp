// partita::checkpoint (docs/checkpoints.md): tensors saved from the pieces
// of one partition and loaded into the pieces of another, the file any
// safetensors reader opens, modules with their optimizers' state, and
// every bad input raising the same CheckpointError on every rank.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "expect_raises.hpp"
#include "temp_dir.hpp"
#include "partita/checkpoint.hpp"
#include "partita/safetensors.hpp"
#include "partita/distribute.hpp"
#include "partita/reference/distribute.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/dropout.hpp"
#include "partita/nn/layer_norm.hpp"
#include "partita/nn/linear.hpp"
#include "partita/testing/checks.hpp"

namespace partita::spec {
namespace {

namespace fs = std::filesystem;
using checkpoint::Shard;

// The global tensor every test knows without communication: element i
// of tensor k is (i mod 61) - 30 + k, exact in every dtype used here
// (spec_tests/read_checkpoint.py checks the same formula).
at::Tensor known(const Shape& shape, at::ScalarType dtype, int k) {
  const int64_t n = volume(shape);
  at::Tensor v = at::arange(n, at::kLong).remainder(61).sub(30).add(k);
  return v.reshape(shape).to(dtype);
}

// A Cartesian partition of `shape` over the first volume(shape) ranks of
// the world (the others inactive).
mpi::Partition cartesian(const Shape& shape) {
  Ranks ranks(static_cast<size_t>(volume(shape)));
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r] = static_cast<int>(r);
  return mpi::Partition::world().create_partition_inclusive(ranks).create_cartesian_topology_partition(shape);
}
// The same partition in the serial reference.
reference::Partition reference_cartesian(const Shape& shape) {
  Ranks ranks(static_cast<size_t>(volume(shape)));
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r] = static_cast<int>(r);
  return reference::Partition::world(mpi::world_size()).create_partition_inclusive(ranks).create_cartesian_topology_partition(shape);
}

// A grid of `dims` dimensions of at most `ranks` workers.
Shape random_grid(std::mt19937& g, size_t dims, int ranks) {
  Shape s(dims, 1);
  for (int tries = 0; tries < 8; ++tries) {
    const size_t d = g() % dims;
    if (volume(s) * 2 <= ranks) s[d] *= 2;
  }
  return s;
}

const std::vector<at::ScalarType> kDtypes = {at::kDouble, at::kFloat, at::kLong, at::kBFloat16, at::kInt, at::kHalf};

// Saved from the blocks of one random partition, loaded into the blocks of
// another: every loaded block is the reference's block of the global tensor
// (reference::distribute, which shares no code with checkpoint::block's
// placement; the blocks given to save and load are partita::distribute's).
std::string reshard_once(unsigned seed, const TempDir& tmp) {
  std::mt19937 g(seed);
  const int world = mpi::world_size();
  struct T {
    Shape shape;
    at::ScalarType dtype;
    Shape saved_on, loaded_on;
  };
  std::vector<T> ts;
  const int count = 1 + static_cast<int>(g() % 3);
  for (int k = 0; k < count; ++k) {
    T t;
    const size_t dims = 1 + g() % 3;
    for (size_t d = 0; d < dims; ++d) t.shape.push_back(1 + static_cast<int64_t>(g() % 7));  // uneven over 2 and 4
    t.dtype = kDtypes[g() % kDtypes.size()];
    t.saved_on = random_grid(g, dims, world);
    t.loaded_on = random_grid(g, dims, world);
    ts.push_back(t);
  }
  const std::string dir = tmp / ("reshard-" + std::to_string(seed));
  std::string what = "seed " + std::to_string(seed) + ":";
  for (size_t k = 0; k < ts.size(); ++k)
    what += " t" + std::to_string(k) + " " + shape_string(ts[k].shape) + " " + c10::toString(ts[k].dtype) + " saved on " +
            shape_string(ts[k].saved_on) + ", loaded on " + shape_string(ts[k].loaded_on) + ";";
  std::vector<Shard> saved, loaded;
  std::vector<at::Tensor> want;
  for (size_t k = 0; k < ts.size(); ++k) {
    const at::Tensor global = known(ts[k].shape, ts[k].dtype, static_cast<int>(k));
    const mpi::Partition P = cartesian(ts[k].saved_on), Q = cartesian(ts[k].loaded_on);
    saved.push_back(checkpoint::block("t" + std::to_string(k), partita::distribute(global, P), ts[k].shape, P));
    want.push_back(reference::distribute(reference_cartesian(ts[k].loaded_on), global).at(mpi::world_rank()));
    loaded.push_back(
        checkpoint::block("t" + std::to_string(k), at::full_like(partita::distribute(global, Q), 99), ts[k].shape, Q));
  }
  checkpoint::save(dir, saved, {{{"step", static_cast<int64_t>(seed)}}, "test"});
  const checkpoint::Info info = checkpoint::load(dir, loaded);
  if (info.counters.at("step") != static_cast<int64_t>(seed)) return what + " the step came back as " + std::to_string(info.counters.at("step"));
  for (size_t k = 0; k < ts.size(); ++k)
    if (loaded[k].local.defined() && (loaded[k].local.numel() || want[k].numel()) && !at::equal(loaded[k].local, want[k]))
      return what + " rank " + std::to_string(mpi::world_rank()) + " loaded t" + std::to_string(k) + " wrong";
  return "";
}

TEST(Checkpoint, LoadsEveryBlockOfAnotherPartition) {
  TempDir tmp;
  for (unsigned seed = 1; seed <= 24; ++seed) PARTITA_EXPECT_AGREED(reshard_once(seed, tmp));
}

// The file any safetensors reader opens: written to $PARTITA_CHECKPOINT_OUT
// when set (spec_tests/read_checkpoint.py then reads it), else to a
// temporary directory; this rank's own reading of the bytes is checked
// here without partita's reader.
TEST(Checkpoint, WritesTensorsAnyReaderOpens) {
  TempDir tmp;
  const char* out = std::getenv("PARTITA_CHECKPOINT_OUT");
  const std::string dir = out && *out ? std::string(out) : tmp / "plain";
  if (mpi::world_rank() == 0 && out && *out) fs::remove_all(dir);
  barrier();
  const int world = mpi::world_size();
  const Shape a = {7, 5}, b = {6}, c = {3, 4, 2};
  std::vector<Shard> shards = {
      checkpoint::block("t0", partita::distribute(known(a, at::kDouble, 0), cartesian({world, 1})), a, cartesian({world, 1})),
      checkpoint::block("t1", partita::distribute(known(b, at::kFloat, 1), cartesian({world})), b, cartesian({world})),
      checkpoint::whole("t2", known({}, at::kLong, 2)),
      checkpoint::block("t3", partita::distribute(known(c, at::kBFloat16, 3), cartesian({1, world > 1 ? 2 : 1, 1})), c,
                        cartesian({1, world > 1 ? 2 : 1, 1})),
      checkpoint::whole("t4", known({2, 3}, at::kHalf, 4)),
      checkpoint::block("t5", partita::distribute(known({0, 3}, at::kDouble, 5), cartesian({world, 1})), {0, 3},
                        cartesian({world, 1})),
  };
  checkpoint::save(dir, shards, {{{"step", 3}, {"data.position", 12}}, "world " + std::to_string(world)});

  std::string problem;
  if (mpi::world_rank() == 0) {
    std::ifstream in(dir + "/model.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
    const auto header = nlohmann::json::parse(bytes.substr(8, n));
    if ((8 + n) % 8 != 0) problem += "the data section is not 8-byte aligned; ";
    struct Want {
      std::string name, dtype;
      Shape shape;
      at::ScalarType type;
    };
    for (const Want& w : {Want{"t0", "F64", a, at::kDouble}, Want{"t1", "F32", b, at::kFloat}, Want{"t2", "I64", {}, at::kLong},
                          Want{"t3", "BF16", c, at::kBFloat16}, Want{"t4", "F16", {2, 3}, at::kHalf},
                          Want{"t5", "F64", {0, 3}, at::kDouble}}) {
      const auto& e = header.at(w.name);
      if (e.at("dtype") != w.dtype || e.at("shape").get<Shape>() != w.shape) {
        problem += w.name + " is " + e.dump() + "; ";
        continue;
      }
      const auto begin = e.at("data_offsets")[0].get<int64_t>(), end = e.at("data_offsets")[1].get<int64_t>();
      const at::Tensor want = known(w.shape, w.type, std::stoi(w.name.substr(1)));
      const std::string got_bytes = bytes.substr(8 + n + begin, end - begin);
      // (An empty tensor has no data pointer: memcmp may not be handed it.)
      if (got_bytes.size() != static_cast<size_t>(want.nbytes()) ||
          (!got_bytes.empty() && std::memcmp(got_bytes.data(), want.contiguous().data_ptr(), got_bytes.size()) != 0))
        problem += w.name + "'s bytes differ from the global tensor's; ";
    }
    uint64_t last = 0;
    for (const auto& [name, e] : header.items())
      if (name != "__metadata__") last = std::max(last, e.at("data_offsets")[1].get<uint64_t>());
    if (bytes.size() != 8 + n + last) problem += "the file does not end where its last tensor does; ";
    // The tensors one after the other in the order of their names, and the
    // metadata as docs/checkpoints.md gives it.
    std::vector<std::pair<uint64_t, std::string>> by_offset;
    for (const auto& [name, e] : header.items())
      if (name != "__metadata__") by_offset.emplace_back(e.at("data_offsets")[0].get<uint64_t>(), name);
    std::stable_sort(by_offset.begin(), by_offset.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    std::string order;
    for (const auto& [at, name] : by_offset) order += name + " ";
    if (order != "t0 t1 t2 t3 t4 t5 ") problem += "the tensors lie in the order " + order + "; ";
    const nlohmann::json metadata = {{"format", "pt"}, {"partita_checkpoint", "1"}};
    if (!header.contains("__metadata__") || header.at("__metadata__") != metadata)
      problem += "__metadata__ is " + (header.contains("__metadata__") ? header.at("__metadata__").dump() : "missing") + "; ";
  }
  PARTITA_EXPECT_AGREED(problem);
  const checkpoint::Contents got = checkpoint::contents(dir);
  EXPECT_EQ(got.saved_by, world);
  EXPECT_EQ(got.info.counters.at("data.position"), 12);
  EXPECT_EQ(got.tensors.size(), 6u);
}

// A tensor every rank holds whole is written once, by the lowest rank that
// holds it: replicas that differ (they should not) load as rank 0's.
TEST(Checkpoint, AReplicatedTensorIsTheLowestHoldersCopy) {
  TempDir tmp;
  const int r = mpi::world_rank();
  checkpoint::save(tmp / "replicas", {checkpoint::whole("r", at::full({2}, static_cast<double>(r + 1), at::kDouble))});
  at::Tensor got = at::zeros({2}, at::kDouble);
  checkpoint::load(tmp / "replicas", {checkpoint::whole("r", got)});
  EXPECT_TRUE(at::equal(got, at::full({2}, 1.0, at::kDouble))) << "rank " << r << " loaded " << got;
}

// ---- Modules and optimizers -------------------------------------------------

struct Net : torch::nn::Module {
  Net() {
    fc = register_module("fc", torch::nn::Linear(4, 3));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({3})));
    // Every rank holds the same [2, 3] activations: one mask on all.
    const auto P = mpi::Partition::world().create_cartesian_topology_partition({mpi::world_size(), 1});
    drop = register_module("drop", nn::SeededDropout(P, nn::DropoutOptions().p(0.5).seed(3).replicated_axes({0})));
    to(at::kDouble);
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  nn::SeededDropout drop{nullptr};
};

// Two steps of `opt` on `net` from a fixed input.
void train(Net& net, torch::optim::Optimizer& opt, int steps) {
  for (int i = 0; i < steps; ++i) {
    const at::Tensor x = at::linspace(-1, 1, 8, at::kDouble).reshape({2, 4});
    opt.zero_grad();
    net.drop->forward(net.norm->forward(net.fc->forward(x))).pow(2).sum().backward();
    opt.step();
  }
}

template <typename Opt, typename Options>
std::string resume_matches(const Options& options, const TempDir& tmp, const std::string& name) {
  // One run of 5 steps; another of 2, saved, loaded into a fresh net and
  // optimizer, and 3 more: the same parameters and optimizer state.
  torch::manual_seed(1);
  auto straight = std::make_shared<Net>();
  Opt o1(straight->parameters(), options);
  torch::manual_seed(1);
  auto first = std::make_shared<Net>();
  Opt o2(first->parameters(), options);
  train(*straight, o1, 5);
  train(*first, o2, 2);
  checkpoint::save(tmp / name, first, &o2, {{{"step", 2}}, ""});
  torch::manual_seed(2);  // other initial values: the load must replace them all
  auto resumed = std::make_shared<Net>();
  Opt o3(resumed->parameters(), options);
  const checkpoint::Info info = checkpoint::load(tmp / name, resumed, &o3);
  if (info.counters.at("step") != 2) return name + ": the step did not come back";
  if (resumed->drop->calls() != 2) return name + ": the dropout count is " + std::to_string(resumed->drop->calls());
  train(*resumed, o3, 3);
  const auto want = straight->named_parameters(), got = resumed->named_parameters();
  for (const auto& item : want)
    if (!at::equal(item.value(), got[item.key()]))
      return name + ": " + item.key() + " differs from the uninterrupted run's";
  return "";
}

TEST(Checkpoint, ModuleAndOptimizerResumeBitForBit) {
  TempDir tmp;
  PARTITA_EXPECT_AGREED(resume_matches<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9), tmp, "sgd"));
  PARTITA_EXPECT_AGREED(resume_matches<torch::optim::Adam>(torch::optim::AdamOptions(0.1), tmp, "adam"));
  PARTITA_EXPECT_AGREED(resume_matches<torch::optim::Adam>(torch::optim::AdamOptions(0.1).amsgrad(true), tmp, "amsgrad"));
  PARTITA_EXPECT_AGREED(resume_matches<torch::optim::AdamW>(torch::optim::AdamWOptions(0.1), tmp, "adamw"));
}

// A checkpoint of parameters only loads into a model with an optimizer
// that has state: the state is dropped (the checkpoint has none).
TEST(Checkpoint, ModuleWithoutOptimizerStateHasNoneAfterLoad) {
  TempDir tmp;
  torch::manual_seed(1);
  auto net = std::make_shared<Net>();
  checkpoint::save(tmp / "params", net);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.1));
  train(*net, adam, 1);
  EXPECT_FALSE(adam.state().empty());
  checkpoint::load(tmp / "params", net, &adam);
  EXPECT_TRUE(adam.state().empty());
}

// Pieces that are not contiguous (a transposed view) save and load like
// any other: the saved file holds the global tensor, and a load writes
// through the view into the caller's storage.
TEST(Checkpoint, NonContiguousPiecesSaveAndLoad) {
  TempDir tmp;
  const Shape global{2 * mpi::world_size() + 1, 3};  // uneven rows
  const mpi::Partition P = cartesian({mpi::world_size(), 1});
  const at::Tensor want = partita::distribute(known(global, at::kDouble, 2), P);
  const at::Tensor strided = want.t().contiguous().t();  // the same values, column-major
  ASSERT_FALSE(strided.is_contiguous());  // at least 2 rows on every rank
  checkpoint::save(tmp / "strided", {checkpoint::block("w", strided, global, P)});
  at::Tensor storage = at::full({want.size(1), want.size(0)}, 99.0, at::kDouble);
  at::Tensor into = storage.t();  // a view: the load must write through it
  checkpoint::load(tmp / "strided", {checkpoint::block("w", into, global, P)});
  EXPECT_TRUE(at::equal(into, want)) << "rank " << mpi::world_rank() << " loaded " << into << " for " << want;
  EXPECT_TRUE(at::equal(storage.t(), want)) << "rank " << mpi::world_rank() << ": the caller's storage was not written";
  // The file, read into one contiguous global tensor on every rank.
  at::Tensor whole = at::zeros(global, at::kDouble);
  checkpoint::load(tmp / "strided", {checkpoint::whole("w", whole)});
  EXPECT_TRUE(at::equal(whole, known(global, at::kDouble, 2)));
}

// A net trained 2 steps by Adam without amsgrad, saved with the Adam's
// state in `dir`.
std::shared_ptr<Net> saved_after_adam(const std::string& dir) {
  torch::manual_seed(1);
  auto net = std::make_shared<Net>();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.1));
  train(*net, adam, 2);
  checkpoint::save(dir, net, &adam);
  return net;
}

// A checkpoint with optimizer state loads into a model alone: the
// parameters come back and the optimizer's entries are not asked for.
TEST(Checkpoint, ModuleLoadsWithoutTheOptimizerSaved) {
  TempDir tmp;
  const auto net = saved_after_adam(tmp / "with_adam");
  torch::manual_seed(2);
  auto fresh = std::make_shared<Net>();
  EXPECT_NO_THROW(checkpoint::load(tmp / "with_adam", fresh));
  const auto want = net->named_parameters(), got = fresh->named_parameters();
  for (const auto& item : want)
    EXPECT_TRUE(at::equal(item.value(), got[item.key()])) << item.key();
  // The names docs/checkpoints.md gives Adam's state and the dropout's count.
  std::set<std::string> names;
  const checkpoint::Contents c = checkpoint::contents(tmp / "with_adam");
  for (const auto& t : c.tensors) names.insert(t.name);
  for (const std::string n : {"fc.weight", "optimizer.fc.weight.exp_avg", "optimizer.fc.weight.exp_avg_sq",
                              "optimizer.fc.weight.step", "optimizer.norm.bias.step"})
    EXPECT_EQ(names.count(n), 1u) << n;
  EXPECT_EQ(names.count("optimizer.fc.weight.max_exp_avg_sq"), 0u);  // saved without amsgrad
  for (const auto& t : c.tensors)
    if (t.name == "optimizer.fc.weight.step") {
      EXPECT_TRUE(t.dtype == "I64" && t.shape.empty()) << t.dtype;
    }
  EXPECT_EQ(c.info.counters.count("rng.drop.calls"), 1u);
  EXPECT_EQ(c.info.counters.count("rng.drop.seed"), 1u);
  // Only the optimizer's entries are left unread: a model without the
  // LayerNorm is refused the checkpoint's "norm.*".
  auto part = std::make_shared<torch::nn::Module>();
  part->register_module("fc", torch::nn::Linear(4, 3));
  part->to(at::kDouble);
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(tmp / "with_adam", part); }),
                  "the checkpoint holds \"norm.");
}

// A dropout reseeded before the save resumes with its seed and its count:
// the loaded layer's next mask is the saved one's next mask (a fresh
// layer keeps seed 3 until the load).
TEST(Checkpoint, ADropoutResumesWithItsSeedAndItsCount) {
  TempDir tmp;
  auto net = std::make_shared<Net>();
  net->drop->reseed(uint64_t{1} << 63 | 7);  // (a seed above INT64_MAX: the bits travel)
  const at::Tensor x = at::ones({2, 3}, at::kDouble);
  net->drop->forward(x);
  checkpoint::save(tmp / "c", net);
  auto fresh = std::make_shared<Net>();
  checkpoint::load(tmp / "c", fresh);
  EXPECT_EQ(fresh->drop->seed(), net->drop->seed());
  EXPECT_EQ(fresh->drop->calls(), 1u);
  const at::Tensor want = net->drop->forward(x), got = fresh->drop->forward(x);
  EXPECT_TRUE(at::equal(got, want)) << got << "\nfor " << want;
}

// partita's layers built on part of the world: the ranks outside their
// partition hold nothing of them (docs/checkpoints.md), so a checkpoint
// keeps the partition's trained LayerNorm, not a lower rank's untrained
// copy, and a dropout's count is its partition's (the other ranks' zero
// would disagree with it).
TEST(Checkpoint, ALayerOnPartOfTheWorldKeepsItsPartitionsValues) {
  const int n = mpi::world_size(), r = mpi::world_rank();
  if (n == 1) GTEST_SKIP() << "needs a rank outside the partition";
  TempDir tmp;
  const auto P = mpi::Partition::world().create_partition_inclusive({n - 1}).create_cartesian_topology_partition({1, 1});
  const auto make = [&] {
    auto net = std::make_shared<torch::nn::Module>();
    net->register_module("norm", nn::SequenceParallelLayerNorm(P, 3, nn::LayerNormOptions().dtype(at::kDouble)));
    net->register_module("drop", nn::SeededDropout(P, nn::DropoutOptions().p(0.5).seed(9)));
    return net;
  };
  const auto norm_of = [](const std::shared_ptr<torch::nn::Module>& net) {
    return std::dynamic_pointer_cast<nn::SequenceParallelLayerNormImpl>(net->named_children()["norm"]);
  };
  const auto drop_of = [](const std::shared_ptr<torch::nn::Module>& net) {
    return std::dynamic_pointer_cast<nn::SeededDropoutImpl>(net->named_children()["drop"]);
  };
  auto net = make();
  if (r == n - 1) {  // the partition trains; no other rank takes part
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.5));
    const at::Tensor x = at::linspace(-1, 2, 6, at::kDouble).reshape({2, 3});
    drop_of(net)->forward(norm_of(net)->forward(x)).pow(3).sum().backward();
    opt.step();
  }
  std::string error;
  try {
    checkpoint::save(tmp / "part", net);
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_EQ(error, "") << "rank " << r;
  if (!error.empty()) return;
  auto fresh = make();
  checkpoint::load(tmp / "part", fresh);
  if (r == n - 1) {
    EXPECT_TRUE(at::equal(norm_of(fresh)->weight, norm_of(net)->weight))
        << norm_of(fresh)->weight << " for the trained " << norm_of(net)->weight;
    EXPECT_TRUE(at::equal(norm_of(fresh)->bias, norm_of(net)->bias));
    EXPECT_FALSE(at::equal(norm_of(net)->weight, at::ones({3}, at::kDouble)));  // it trained
    EXPECT_EQ(drop_of(fresh)->calls(), 1u);
  }
}

// Adam's state saved without amsgrad, loaded into an Adam with amsgrad:
// the maximum of the second moments starts afresh at zero, in a fresh
// optimizer and in one that had its own, and the next steps run.
TEST(Checkpoint, AmsgradLoadsAStateSavedWithoutIt) {
  TempDir tmp;
  saved_after_adam(tmp / "plain");
  for (const bool had_state : {false, true}) {
    torch::manual_seed(2);
    auto other = std::make_shared<Net>();
    torch::optim::Adam ams(other->parameters(), torch::optim::AdamOptions(0.1).amsgrad(true));
    if (had_state) train(*other, ams, 3);
    checkpoint::load(tmp / "plain", other, &ams);
    for (const auto& p : other->parameters()) {
      // (No ASSERT: every rank goes on to the next load, a collective.)
      const auto it = ams.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      EXPECT_NE(it, ams.state().end()) << "had state " << had_state;
      if (it == ams.state().end()) continue;
      const auto& s = static_cast<const torch::optim::AdamParamState&>(*it->second);
      EXPECT_TRUE(s.max_exp_avg_sq().defined()) << "had state " << had_state;
      if (!s.max_exp_avg_sq().defined()) continue;
      EXPECT_TRUE(at::equal(s.max_exp_avg_sq(), at::zeros_like(p))) << "had state " << had_state;
      EXPECT_EQ(s.step(), 2) << "had state " << had_state;
    }
    // (The steps are collective: taken on every rank or on none.)
    if (partita::testing::sum_over_ranks(::testing::Test::HasFailure() ? 1.0 : 0.0) == 0) {
      EXPECT_NO_THROW(train(*other, ams, 2)) << "had state " << had_state;
    }
  }
  // The other direction: a maximum saved with amsgrad loads into an Adam
  // without it as it was saved (kept, never read).
  torch::manual_seed(1);
  auto net = std::make_shared<Net>();
  torch::optim::Adam ams(net->parameters(), torch::optim::AdamOptions(0.1).amsgrad(true));
  train(*net, ams, 2);
  checkpoint::save(tmp / "ams", net, &ams);
  torch::manual_seed(2);
  auto other = std::make_shared<Net>();
  torch::optim::Adam plain(other->parameters(), torch::optim::AdamOptions(0.1));
  checkpoint::load(tmp / "ams", other, &plain);
  const auto saved = net->parameters(), loaded = other->parameters();
  for (size_t i = 0; i < saved.size(); ++i) {
    const auto& a = static_cast<const torch::optim::AdamParamState&>(
        *ams.state().at(c10::guts::to_string(saved[i].unsafeGetTensorImpl())));
    const auto it = plain.state().find(c10::guts::to_string(loaded[i].unsafeGetTensorImpl()));
    EXPECT_NE(it, plain.state().end()) << i;
    if (it == plain.state().end()) continue;
    const auto& b = static_cast<const torch::optim::AdamParamState&>(*it->second);
    EXPECT_TRUE(b.max_exp_avg_sq().defined() && at::equal(b.max_exp_avg_sq(), a.max_exp_avg_sq())) << i;
  }
}

// Tied weights: an embedding's table that an output layer also holds is
// saved once, under its first name, with its optimizer state; a load
// fills the one tensor, which both modules still share.
struct Tied : torch::nn::Module {
  Tied() {
    emb = register_module("emb", torch::nn::Embedding(5, 3));
    out = register_module("out", std::make_shared<torch::nn::Module>());
    out->register_parameter("weight", emb->weight);
    to(at::kDouble);
  }
  torch::nn::Embedding emb{nullptr};
  std::shared_ptr<torch::nn::Module> out;
};

TEST(Checkpoint, ATiedTensorIsSavedOnceUnderItsFirstName) {
  TempDir tmp;
  torch::manual_seed(1);
  auto net = std::make_shared<Tied>();
  torch::optim::SGD sgd({net->emb->weight}, torch::optim::SGDOptions(0.1).momentum(0.9));
  auto step = [](Tied& t, torch::optim::SGD& o) {
    o.zero_grad();
    const at::Tensor ids = at::arange(4, at::kLong);
    at::matmul(t.emb->forward(ids), t.out->named_parameters()["weight"].t()).pow(2).sum().backward();
    o.step();
  };
  step(*net, sgd);
  checkpoint::save(tmp / "tied", net, &sgd);
  std::vector<std::string> names;
  for (const auto& t : checkpoint::contents(tmp / "tied").tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"emb.weight", "optimizer.emb.weight.momentum_buffer"}));

  torch::manual_seed(2);
  auto other = std::make_shared<Tied>();
  torch::optim::SGD sgd2({other->emb->weight}, torch::optim::SGDOptions(0.1).momentum(0.9));
  checkpoint::load(tmp / "tied", other, &sgd2);
  const at::Tensor shared = other->out->named_parameters()["weight"];
  EXPECT_EQ(shared.unsafeGetTensorImpl(), other->emb->weight.unsafeGetTensorImpl()) << "the tie was broken";
  EXPECT_TRUE(at::equal(other->emb->weight, net->emb->weight));
  // The next step from the loaded momentum is the saved run's next step.
  step(*net, sgd);
  step(*other, sgd2);
  EXPECT_TRUE(at::equal(other->emb->weight, net->emb->weight));
}

// ---- Bad input ---------------------------------------------------------------

std::vector<Shard> two_tensors(at::ScalarType dtype = at::kDouble, int64_t rows = 6) {
  const mpi::Partition P = cartesian({mpi::world_size(), 1});
  return {checkpoint::block("w", partita::distribute(known({rows, 3}, dtype, 0), P), {rows, 3}, P),
          checkpoint::whole("b", known({3}, dtype, 1))};
}

// Rank 0 edits a file of the checkpoint; every rank waits for it.
void edit(const std::string& path, const std::function<void(std::string&)>& f) {
  if (mpi::world_rank() == 0) {
    std::string bytes;
    {
      std::ifstream in(path, std::ios::binary);
      bytes.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
    f(bytes);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  barrier();
}

// Rank 0 replaces the first `from` in a file of the checkpoint with `to`.
void replace_once(const std::string& path, const std::string& from, const std::string& to) {
  edit(path, [&](std::string& bytes) {
    const size_t at = bytes.find(from);
    ASSERT_NE(at, std::string::npos) << from << " not in " << bytes.substr(0, 200);
    bytes.replace(at, from.size(), to);
  });
}

TEST(CheckpointErrors, EveryRankRaisesTheSameError) {
  TempDir tmp;
  const std::string dir = tmp / "good";
  checkpoint::save(dir, two_tensors());
  auto copy = [&](const std::string& name) {
    if (mpi::world_rank() == 0) fs::copy(dir, tmp / name, fs::copy_options::recursive);
    barrier();
    return tmp / name;
  };

  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::save(dir, two_tensors()); }), "already exists");
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(tmp / "missing", two_tensors()); }),
                  "no such checkpoint directory");
  // Another model: a missing name, an extra one, another shape, another dtype.
  EXPECT_CONTAINS(raised<CheckpointError>([&] {
                    auto s = two_tensors();
                    s.push_back(checkpoint::whole("extra", at::zeros({2}, at::kDouble)));
                    checkpoint::load(dir, s);
                  }),
                  "\"extra\" (asked for by rank 0) is not in the checkpoint");
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(dir, {two_tensors()[0]}); }),
                  "the checkpoint holds \"b\", which no rank asked for");
  EXPECT_NO_THROW(checkpoint::load(dir, {two_tensors()[0]}, {true, ""}));
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(dir, two_tensors(at::kDouble, 7)); }),
                  "\"w\" has the global shape 6x3 in the checkpoint, 7x3 on rank 0");
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(dir, two_tensors(at::kFloat)); }),
                  "is F64 in the checkpoint, F32 on rank 0 (a checkpoint is never cast)");

  // Pieces that do not make a tensor.
  EXPECT_CONTAINS(raised<CheckpointError>([&] {
                    checkpoint::save(tmp / "hole", {Shard{"w", at::zeros({1, 3}, at::kDouble), {6, 3}, {0, 0}}});
                  }),
                  "the pieces cover 3 of the 18 elements");
  if (mpi::world_size() > 1)
    EXPECT_CONTAINS(raised<CheckpointError>([&] {
                      const int64_t r = mpi::world_rank();
                      checkpoint::save(tmp / "overlap", {Shard{"w", at::zeros({2, 3}, at::kDouble), {8, 3}, {r, 0}}});
                    }),
                    "overlap without being the same piece");
  EXPECT_CONTAINS(raised<CheckpointError>([&] {
                    checkpoint::save(tmp / "outside", {Shard{"w", at::zeros({2, 3}, at::kDouble), {2, 3}, {1, 0}}});
                  }),
                  "is not inside the global shape");
  if (mpi::world_size() > 1)
    EXPECT_CONTAINS(raised<CheckpointError>([&] {
                      checkpoint::save(tmp / "counters", two_tensors(),
                                       {{{"step", static_cast<int64_t>(mpi::world_rank() == 0 ? 1 : 2)}}, ""});
                    }),
                    "the counter \"step\" is 1 on rank 0 and 2 on rank 1");
  EXPECT_FALSE(fs::exists(tmp / "hole") || fs::exists(tmp / "outside"));

  // Damaged files.
  const std::string truncated = copy("truncated");
  edit(truncated + "/model.safetensors", [](std::string& b) { b.resize(b.size() - 8); });
  // Each message names the file at fault, once.
  const std::string cut = raised<CheckpointError>([&] { checkpoint::load(truncated, two_tensors()); });
  EXPECT_CONTAINS(cut, "the file is truncated");
  EXPECT_EQ(cut.rfind(truncated + ": model.safetensors: ", 0), 0u) << cut;
  const std::string liar = copy("liar");
  replace_once(liar + "/model.safetensors", "[0,24]", "[0,32]");  // "b": 3 doubles; make it claim 4
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(liar, two_tensors()); }), "hold 32 bytes");
  const std::string version = copy("version");
  replace_once(version + "/manifest.json", "\"version\": 1", "\"version\": 9");
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(version, two_tensors()); }),
                  "format version 9; this build reads version 1 only");
  const std::string garbage = copy("garbage");
  edit(garbage + "/model.safetensors", [](std::string& b) { b[9] = '#'; });
  const std::string not_json = raised<CheckpointError>([&] { checkpoint::load(garbage, two_tensors()); });
  EXPECT_EQ(not_json.rfind(garbage + ": model.safetensors: the header: not valid JSON", 0), 0u) << not_json;
  const std::string bad_manifest = copy("bad_manifest");
  edit(bad_manifest + "/manifest.json", [](std::string& m) { m.insert(0, "#"); });
  const std::string manifest_error = raised<CheckpointError>([&] { checkpoint::load(bad_manifest, two_tensors()); });
  EXPECT_EQ(manifest_error.rfind(bad_manifest + ": manifest.json: not valid JSON", 0), 0u) << manifest_error;
  // Brackets nested 200,000 deep in the manifest (and so in a header): one
  // message, not a stack overflow while naming the value.
  const std::string deep = copy("deep");
  replace_once(deep + "/manifest.json", "\"version\": 1", "\"version\": " + std::string(200000, '[') + std::string(200000, ']'));
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(deep, two_tensors()); }),
                  "manifest.json: not valid JSON for partita: arrays and objects nested deeper than 512 levels");
  // A global shape whose byte count passes 2^63 (each extent within MPI's
  // int): refused, not wrapped to a small volume.
  EXPECT_CONTAINS(raised<CheckpointError>([&] {
                    checkpoint::save(tmp / "huge", {Shard{"h", at::zeros({0, 0, 0, 0}, at::kDouble),
                                                          {65536, 65536, 65536, 65536}, {0, 0, 0, 0}}});
                  }),
                  "holds more than 2^63 bytes");
  // A header above what a load reads (a name of 10^8 bytes, on rank 0): the
  // save refuses it on every rank instead of writing a checkpoint no load
  // opens.
  EXPECT_CONTAINS(raised<CheckpointError>([&] {
                    std::vector<Shard> s;
                    if (mpi::world_rank() == 0)
                      s.push_back(checkpoint::whole(std::string(safetensors::kMaxHeaderBytes, 'n'), at::zeros({1}, at::kDouble)));
                    checkpoint::save(tmp / "long_name", s);
                  }),
                  "a load reads (fewer tensors, or shorter names); nothing was written");
  EXPECT_FALSE(fs::exists(tmp / "long_name"));
  // A partition of more dimensions than the tensor (partita::distribute
  // refuses it too), and a destination whose elements overlap (a stride 0).
  if (mpi::world_size() > 1)
    EXPECT_CONTAINS(raised<CheckpointError>([&] {
                      checkpoint::block("v", at::zeros({3}, at::kDouble), {6},
                                        mpi::Partition::world().create_cartesian_topology_partition({1, mpi::world_size()}));
                    }),
                    "has more dimensions than");
  EXPECT_CONTAINS(raised<CheckpointError>([&] {
                    auto s = two_tensors();
                    const int last = mpi::world_size() - 1;
                    if (mpi::world_rank() == last) s[1].local = at::zeros({1}, at::kDouble).expand(s[1].local.sizes());
                    checkpoint::load(dir, s);
                  }),
                  "rank " + std::to_string(mpi::world_size() - 1) +
                      ": \"b\": the tensor to load into has elements that overlap in memory");
  // A manifest that does not list what the file holds.
  const std::string unlisted = copy("unlisted");
  replace_once(unlisted + "/manifest.json", "\"name\": \"b\"", "\"name\": \"c\"");
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(unlisted, two_tensors()); }),
                  unlisted + ": manifest.json lists \"c\", which model.safetensors does not hold");
  const std::string no_manifest = copy("no_manifest");
  if (mpi::world_rank() == 0) fs::remove(no_manifest + "/manifest.json");
  barrier();
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(no_manifest, two_tensors()); }), "no manifest.json");
  const std::string no_data = copy("no_data");
  if (mpi::world_rank() == 0) fs::remove(no_data + "/model.safetensors");
  barrier();
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(no_data, two_tensors()); }), "no model.safetensors");
  // A save whose ranks disagree on a tensor's dtype: refused, nothing written.
  if (mpi::world_size() > 1) {
    EXPECT_CONTAINS(raised<CheckpointError>([&] {
                      checkpoint::save(tmp / "dtypes", {checkpoint::whole("b", known({3}, mpi::world_rank() == 1 ? at::kFloat : at::kDouble, 1))});
                    }),
                    "\"b\" is F64 3 on one rank and F32 3 on rank 1");
    EXPECT_FALSE(fs::exists(tmp / "dtypes"));
  }

  // Nothing was half-loaded by any refusal: the tensors passed keep the
  // values they had (not the checkpoint's).
  auto s = two_tensors(at::kDouble, 7);
  for (auto& x : s) x.local.fill_(7);
  EXPECT_THROW(checkpoint::load(dir, s), CheckpointError);
  EXPECT_TRUE(at::equal(s[1].local, at::full({3}, 7.0, at::kDouble)));
  if (s[0].local.numel() > 0) {
    EXPECT_TRUE(at::equal(s[0].local, at::full_like(s[0].local, 7)));
  }
}

// A refusal on one rank alone (the last) is every rank's error, at a save
// and at a load, and a refused save writes nothing.
TEST(CheckpointErrors, ARefusalOnOneRankIsEveryRanks) {
  TempDir tmp;
  const std::string good = tmp / "good";
  checkpoint::save(good, two_tensors());
  const bool last = mpi::world_rank() == mpi::world_size() - 1;
  const std::string by_last = "rank " + std::to_string(mpi::world_size() - 1) + ": ";
  const int64_t above = int64_t{INT_MAX} + 1;
  struct Case {
    std::string name;
    Shard odd;  // what the last rank passes besides two_tensors()
    std::string message;
  };
  const std::vector<Case> cases = {
      {"utf8", checkpoint::whole("bad\xff", at::zeros({1})), "a tensor name is not valid UTF-8"},
      {"metadata", checkpoint::whole("__metadata__", at::zeros({1})), "a tensor may not be named \"__metadata__\""},
      {"twice", checkpoint::whole("b", known({3}, at::kDouble, 1)), "\"b\" is passed twice by one rank"},
      {"sparse", checkpoint::whole("s", at::zeros({2, 2}).to_sparse()), "\"s\": only dense CPU tensors"},
      {"dimension", Shard{"big", at::zeros({1}, at::kByte), {above}, {0}},
       "\"big\": the global shape 2147483648 has a dimension above MPI's count limit (INT_MAX = 2147483647)"},
      // 2 x (2^30 + 1) bytes, expanded from one: no memory behind it.
      {"piece", Shard{"big", at::zeros({1, 1}, at::kByte).expand({2, (int64_t{1} << 30) + 1}), {2, (int64_t{1} << 30) + 1}, {0, 0}},
       "\"big\": the piece 2x1073741825 holds 2147483650 elements, above MPI's count limit"},
  };
  for (const Case& c : cases) {
    auto shards = two_tensors();
    if (last) shards.push_back(c.odd);
    const std::string saved = raised<CheckpointError>([&] { checkpoint::save(tmp / c.name, shards); });
    EXPECT_CONTAINS(saved, by_last + c.message);
    EXPECT_FALSE(fs::exists(tmp / c.name)) << c.name;
    EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(good, shards); }), by_last + c.message);
  }
  // An optimizer partita does not checkpoint, on the last rank alone.
  torch::manual_seed(1);
  auto net = std::make_shared<Net>();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.1));
  torch::optim::RMSprop rmsprop(net->parameters(), torch::optim::RMSpropOptions(0.1));
  torch::optim::Optimizer* mine = last ? static_cast<torch::optim::Optimizer*>(&rmsprop) : &adam;
  const std::string refused = by_last + "the optimizer is not one partita checkpoints";
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::save(tmp / "rmsprop", net, mine); }), refused);
  EXPECT_FALSE(fs::exists(tmp / "rmsprop"));
  checkpoint::save(tmp / "net", net, &adam);
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(tmp / "net", net, mine); }), refused);
}

// A refused load of a module with its optimizer leaves the optimizer's
// state as it was (the parameters too).
TEST(CheckpointErrors, ARefusedLoadLeavesTheOptimizerAlone) {
  TempDir tmp;
  torch::manual_seed(1);
  auto net = std::make_shared<Net>();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.1));
  train(*net, adam, 1);
  checkpoint::save(tmp / "net", net, &adam);
  // Another model: the same names and one more.
  auto other = std::make_shared<Net>();
  other->register_parameter("extra", at::zeros({2}, at::kDouble));
  torch::optim::Adam adam2(other->parameters(), torch::optim::AdamOptions(0.1));
  train(*other, adam2, 2);
  const at::Tensor fc = other->fc->weight.detach().clone();
  const auto key = c10::guts::to_string(other->fc->weight.unsafeGetTensorImpl());
  const auto& state = static_cast<torch::optim::AdamParamState&>(*adam2.state().at(key));
  const at::Tensor moment = state.exp_avg().clone();
  const int64_t step = state.step();
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(tmp / "net", other, &adam2); }),
                  "\"extra\" (asked for by rank 0) is not in the checkpoint");
  EXPECT_TRUE(at::equal(other->fc->weight, fc));
  const auto& after = static_cast<torch::optim::AdamParamState&>(*adam2.state().at(key));
  EXPECT_TRUE(at::equal(after.exp_avg(), moment));
  EXPECT_EQ(after.step(), step);
}

// The temporary directories a save of DIR may find (docs/checkpoints.md,
// "Atomic and durable"): DIR.partial-HOST-PID, named after the saving job's
// rank 0.
std::string temporary_of(const std::string& dir, long pid) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return dir + ".partial-" + host + "-" + std::to_string(pid);
}

// The entries of `dir`'s parent whose name starts with `dir`'s and
// ".partial" (a save's temporary directory, whoever made it).
std::vector<std::string> temporaries_of(const std::string& dir) {
  std::vector<std::string> found;
  const fs::path d(dir);
  const std::string prefix = d.filename().string() + ".partial";
  for (const auto& e : fs::directory_iterator(d.parent_path()))
    if (e.path().filename().string().rfind(prefix, 0) == 0) found.push_back(e.path().filename().string());
  return found;
}

// A save killed before its rename leaves its temporary directory, named
// after a process that is gone; the next save of that name removes it and
// succeeds, and a load never sees it. (A process number above Linux's
// largest, 2^22, is never alive.)
TEST(CheckpointErrors, AnUnfinishedSaveIsNotACheckpoint) {
  TempDir tmp;
  const std::string dir = tmp / "step-1";
  const std::string dead = temporary_of(dir, (1L << 22) + 1);
  if (mpi::world_rank() == 0) {
    fs::create_directories(dead);
    std::ofstream(dead + "/model.safetensors") << "half";
  }
  barrier();
  EXPECT_CONTAINS(raised<CheckpointError>([&] { checkpoint::load(dir, two_tensors()); }), "no such checkpoint directory");
  checkpoint::save(dir, two_tensors());
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(temporaries_of(dir).empty());
  auto s = two_tensors();
  for (auto& x : s) x.local = at::zeros_like(x.local);
  checkpoint::load(dir, s);
  EXPECT_TRUE(at::equal(s[1].local, known({3}, at::kDouble, 1)));
}

// Two saves of one name at once (two jobs): neither touches the other's
// temporary directory. Here the other job's save is in progress (its
// rank 0, this job's launcher, is alive; and one under the name a save
// used before it had its own), and this job's save succeeds beside it,
// leaving both as they were.
TEST(CheckpointErrors, ASaveLeavesAnotherSavesDirectoryAlone) {
  TempDir tmp;
  const std::string dir = tmp / "step-1";
  // Rank 0's host and parent: across nodes the other ranks' differ.
  const std::string live =
      mpi::allgather_strings(temporary_of(dir, static_cast<long>(getppid())), mpi::world_comm())[0];
  const std::string plain = dir + ".partial";
  // Another host's, of a process id no process here has (above Linux's
  // largest): this host cannot tell whether it is alive.
  const std::string elsewhere = dir + ".partial-another-host-4194305";
  if (mpi::world_rank() == 0) {
    for (const std::string& d : {live, plain, elsewhere}) {
      fs::create_directories(d);
      std::ofstream(d + "/model.safetensors") << "another job's";
    }
  }
  barrier();
  checkpoint::save(dir, two_tensors());
  barrier();
  for (const std::string& d : {live, plain, elsewhere}) {
    std::ifstream in(d + "/model.safetensors");
    std::string text;
    std::getline(in, text);
    EXPECT_EQ(text, "another job's") << d << " was touched by a save of " << dir;
  }
  EXPECT_EQ(temporaries_of(dir).size(), 3u);
}

// The other save of the same name finishes first: this one's rename finds
// the name taken and raises on every rank, leaving the other's checkpoint
// as it is and no temporary directory. The other job is a thread of rank
// 0 here, which makes DIR (a checkpoint's file in it) as soon as this save's
// temporary directory appears.
TEST(CheckpointErrors, ASaveThatLosesTheRaceRaisesAndLeavesTheWinner) {
  TempDir tmp;
  // The winner: another save's checkpoint, or a directory someone made
  // empty (rename(2) alone would replace that one).
  for (const bool empty : {false, true}) {
    bool raced = false;
    for (int attempt = 0; attempt < 10 && !raced; ++attempt) {
      const std::string dir = tmp / ((empty ? "empty-" : "step-") + std::to_string(attempt));
      std::thread other;
      std::atomic<bool> stop{false};
      if (mpi::world_rank() == 0)
        other = std::thread([&] {
          const std::string mine = temporary_of(dir, static_cast<long>(getpid()));
          while (!stop && !fs::exists(mine)) std::this_thread::yield();
          if (stop) return;
          fs::create_directories(dir);
          if (!empty) std::ofstream(dir + "/manifest.json") << "the winner's";
        });
      std::string message;
      try {
        checkpoint::save(dir, two_tensors());
      } catch (const CheckpointError& e) {
        message = e.what();
      }
      stop = true;
      if (other.joinable()) other.join();
      const int raised_here = message.empty() ? 0 : 1;
      const int raised_on = static_cast<int>(partita::testing::sum_over_ranks(raised_here));
      if (raised_on == 0) continue;  // the thread was too late: the save won
      raced = true;
      EXPECT_EQ(raised_on, mpi::world_size()) << "raised on some ranks only: " << message;
      EXPECT_CONTAINS(message, dir);
      EXPECT_CONTAINS(message, "another save of it finished first");
      barrier();
      if (empty) {
        EXPECT_TRUE(fs::is_directory(dir) && fs::is_empty(dir)) << dir;
      } else {
        std::ifstream in(dir + "/manifest.json");
        std::string text;
        std::getline(in, text);
        EXPECT_EQ(text, "the winner's");
      }
      EXPECT_TRUE(temporaries_of(dir).empty());
    }
    EXPECT_TRUE(raced) << "the other " << (empty ? "empty directory" : "save")
                       << " never came between this save's start and its rename";
  }
}

// A disk too small for the checkpoint ($PARTITA_CHECKPOINT_SMALL_FS: a
// directory on a 1 MiB file system; the ctest checkpoint_full_disk_np2
// mounts one): the same CheckpointError on every rank, nothing left
// behind, and the checkpoint saved before it still loads.
TEST(CheckpointErrors, AFullDiskIsReportedAndLeavesNothing) {
  const char* small = std::getenv("PARTITA_CHECKPOINT_SMALL_FS");
  if (!small || !*small) GTEST_SKIP() << "PARTITA_CHECKPOINT_SMALL_FS is not set";
  const std::string dir = std::string(small) + "/fits", big = std::string(small) + "/too-big";
  if (mpi::world_rank() == 0) {
    fs::remove_all(dir);
    fs::remove_all(big);
  }
  barrier();
  checkpoint::save(dir, two_tensors());
  const mpi::Partition P = cartesian({mpi::world_size(), 1});
  const Shape huge = {1 << 18, 2};  // 4 MiB of doubles
  const std::string message = raised<CheckpointError>([&] {
    checkpoint::save(big, {checkpoint::block("w", partita::distribute(at::ones(huge, at::kDouble), P), huge, P)});
  });
  EXPECT_CONTAINS(message, big);
  EXPECT_CONTAINS(message, "writing");
  EXPECT_CONTAINS(message, "No space left on device");
  std::printf("a full disk: %s\n", message.c_str());
  barrier();  // rank 0 removes the temporary directory as it raises
  EXPECT_FALSE(fs::exists(big));
  EXPECT_TRUE(temporaries_of(big).empty());
  auto s = two_tensors();
  for (auto& x : s) x.local = at::zeros_like(x.local);
  checkpoint::load(dir, s);
  EXPECT_TRUE(at::equal(s[1].local, known({3}, at::kDouble, 1)));
}

}  // namespace
}  // namespace partita::spec
