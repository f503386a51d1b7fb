// Issue 34 item 2: static shapes (docs/static-shapes.md). A plan made with
// Shapes::kStatic, or a communicator call given a StaticShapes promise,
// agrees on every rank's shapes at its first call only. These tests check,
// for every primitive and for the communicator's calls:
// - the results and input gradients are bit-identical to the per-call
//   agreement's, over calls with new values (the first call and the later
//   ones, which reuse the first call's plan), with and without the debug
//   setting;
// - with the debug setting (PARTITA_CHECK_STATIC_SHAPES=1, set here through
//   mpi::set_check_static_shapes) a call whose shape changed on one rank raises
//   ShapeError (rule input.static_shapes) on every rank, and the plan still
//   works afterwards;
// - without it, a rank whose own input changed raises the same error before
//   anything is posted, and the others are left waiting in the data's
//   collective, which deadline mode turns into DeadlineError;
// - ranks that disagree on the choice raise on every rank at the first call.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <c10/core/InferenceMode.h>

#include <cstring>
#include <functional>
#include <typeinfo>

#include "partita/errors.hpp"
#include "partita/mpi/communicator.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/nn/functional.hpp"
#include "partita/testing/lockstep.hpp"

namespace partita::spec {
namespace {

namespace F = partita::nn::functional;
using Layer = std::function<at::Tensor(const at::Tensor&)>;

bool agreed(bool local) { return mpi::all_true(local, mpi::world_comm()); }
int rank() { return mpi::world_rank(); }
int size() { return mpi::world_size(); }

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  if (a.numel() == 0) return true;
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

at::Tensor random(const Shape& shape, int salt, at::ScalarType dtype = at::kFloat) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * salt + rank());
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

// The debug setting on for one scope.
struct Verify {
  explicit Verify(bool on) : was(mpi::check_static_shapes()) { mpi::set_check_static_shapes(on); }
  ~Verify() { mpi::set_check_static_shapes(was); }
  bool was;
};

struct Outcome {
  at::Tensor y, dx;
};
// y = layer(x) and x's gradient for a random rank-dependent cotangent.
Outcome run(const Layer& layer, const at::Tensor& x, int salt) {
  const at::Tensor leaf = x.detach().clone().requires_grad_(x.is_floating_point());
  Outcome r;
  r.y = layer(leaf * 1);  // not a leaf: the in-place halo may write into it
  const Shape ys(r.y.sizes().begin(), r.y.sizes().end());
  torch::autograd::backward({r.y}, {random(ys, salt, r.y.scalar_type())});
  r.dx = leaf.grad();
  r.y = r.y.detach();
  return r;
}

// One primitive: its plan made with a choice of Shapes (on every rank, or
// `shapes_on(rank)` per rank), and this rank's input at a call (`changed`:
// the input of a broken promise on the rank that changes it).
struct Case {
  const char* name;
  std::function<Layer(std::function<Shapes(int)>)> make;
  std::function<at::Tensor(int salt, bool changed)> input;
  int changer;  // the rank whose input changes
};

mpi::CartesianPartition row(const Ranks& ranks) {
  return mpi::Partition::world().create_partition_inclusive(ranks).create_cartesian_topology_partition(
      {1, static_cast<int64_t>(ranks.size())});
}

std::vector<Case> cases() {
  Ranks all;
  for (int r = size() - 1; r >= 0; --r) all.push_back(r);  // partition rank != world rank
  const int last = size() - 1;
  const int64_t cols = local_length(7, size(), size() - 1 - rank());  // along `all`'s order
  std::vector<Case> c;
  c.push_back({"broadcast",
               [all](auto shapes) {
                 Options o;
                 o.shapes(shapes(rank()));
                 const F::BroadcastPlan p(row({0}), row(all), o);
                 return Layer([p](const at::Tensor& x) { return F::broadcast(x, p); });
               },
               [](int salt, bool changed) {
                 // (the members' zero-volume inputs change too: {0} to {0, 1})
                 return rank() == 0 ? random({3, changed ? 5 : 4}, salt)
                                    : changed ? at::zeros({0, 1}) : at::zeros({0});
               },
               0});
  c.push_back({"sum_reduce",
               [all](auto shapes) {
                 Options o;
                 o.shapes(shapes(rank()));
                 const F::SumReducePlan p(row(all), row({0}), o);
                 return Layer([p](const at::Tensor& x) { return F::sum_reduce(x, p); });
               },
               [](int salt, bool changed) { return random({3, changed ? 5 : 4}, salt); }, last});
  c.push_back({"all_sum_reduce",
               [all](auto shapes) {
                 const F::AllSumReducePlan p(row(all), {1}, shapes(rank()));
                 return Layer([p](const at::Tensor& x) { return F::all_sum_reduce(x, p); });
               },
               [](int salt, bool changed) { return random({2, changed ? 6 : 5}, salt); }, last});
  c.push_back({"all_gather",
               [all](auto shapes) {
                 const F::AllGatherPlan p(row(all), 1, 0, shapes(rank()));
                 return Layer([p](const at::Tensor& x) { return F::all_gather(x, p); });
               },
               [](int salt, bool changed) { return random({rank() + (changed ? 2 : 1), 3}, salt); },
               last});
  c.push_back({"reduce_scatter",
               [all](auto shapes) {
                 const F::ReduceScatterPlan p(row(all), 1, 1, shapes(rank()));
                 return Layer([p](const at::Tensor& x) { return F::reduce_scatter(x, p); });
               },
               [](int salt, bool changed) { return random({3, changed ? 6 : 5}, salt); }, last});
  c.push_back({"repartition",
               [all](auto shapes) {
                 const F::RepartitionPlan p(row(all), row({0}),
                                            nn::RepartitionExchange::kPointToPoint, shapes(rank()));
                 return Layer([p](const at::Tensor& x) { return F::repartition(x, p); });
               },
               // A broken promise in dtype alone.
               [cols](int salt, bool changed) {
                 return random({5, cols}, salt, changed ? at::kDouble : at::kFloat);
               },
               last});
  for (bool in_place : {false, true})
    c.push_back({in_place ? "halo_exchange_" : "halo_exchange",
                 [all, in_place](auto shapes) {
                   const F::HaloExchangePlan p(row(all), {0, 1}, {0, 1}, shapes(rank()));
                   return Layer([p, in_place](const at::Tensor& x) {
                     return in_place ? F::halo_exchange_(x, p) : F::halo_exchange(x, p);
                   });
                 },
                 [cols](int salt, bool changed) { return random({changed ? 4 : 3, cols + 2}, salt); },
                 last});
  return c;
}

auto everywhere(Shapes s) {
  return [s](int) { return s; };
}

class StaticShapes : public ::testing::Test {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

TEST_F(StaticShapes, LayersGiveThePerCallResults) {
  for (const auto& c : cases()) {
    const Layer fixed = c.make(everywhere(Shapes::kStatic));
    const Layer per_call = c.make(everywhere(Shapes::kPerCall));
    for (int call = 0; call < 4; ++call) {
      const Verify verify(call == 3);  // the last call with the debug setting
      const at::Tensor x = c.input(10 + call, false);
      const Outcome a = run(fixed, x, 20 + call), b = run(per_call, x, 20 + call);
      bool ok = same_bits(a.y, b.y) && same_bits(a.dx, b.dx);
      // Something moved: a gradient reaches every input that has elements.
      if (x.numel() > 0) ok = ok && a.dx.defined() && a.dx.abs().sum().item<double>() > 0;
      EXPECT_TRUE(agreed(ok)) << c.name << ", call " << call << ", rank " << rank() << ": static y "
                              << a.y << "\nper call y " << b.y << "\nstatic dx " << a.dx
                              << "\nper call dx " << b.dx;
    }
  }
}

// The rule code of the partita::Error f raises ("" if none, "?" for anything else).
template <typename E = Error, typename Fn>
std::string raised_rule(Fn&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.rule().empty() ? std::string(typeid(e).name()) : e.rule();
  } catch (const std::exception& e) {
    return std::string("? ") + e.what();
  }
  return "";
}

// The message of the partita::Error f raises ("" if none).
template <typename E = Error, typename Fn>
std::string raised_message(Fn&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

TEST_F(StaticShapes, BrokenPromiseRaisesOnEveryRankWithTheDebugSetting) {
  const Verify verify(true);
  for (const auto& c : cases()) {
    const Layer fixed = c.make(everywhere(Shapes::kStatic));
    run(fixed, c.input(1, false), 2);
    const std::string rule =
        raised_rule<ShapeError>([&] { run(fixed, c.input(3, rank() == c.changer), 4); });
    EXPECT_TRUE(agreed(rule == rule_code::kStaticShapes))
        << c.name << ", rank " << rank() << ": '" << rule << "'";
    // Nothing moved: the plan still serves the promised shapes.
    const at::Tensor x = c.input(4, false);
    const Outcome a = run(fixed, x, 5), b = run(c.make(everywhere(Shapes::kPerCall)), x, 5);
    EXPECT_TRUE(agreed(same_bits(a.y, b.y) && same_bits(a.dx, b.dx))) << c.name;
  }
}

TEST_F(StaticShapes, BrokenPromiseRaisesWhereTheInputChangedWithoutTheDebugSetting) {
  const Verify verify(false);
  for (const auto& c : cases()) {
    const Layer fixed = c.make(everywhere(Shapes::kStatic));
    run(fixed, c.input(1, false), 2);
    // Every rank changes its input: each finds it out alone, before posting.
    const std::string rule = raised_rule<ShapeError>([&] { run(fixed, c.input(3, true), 4); });
    EXPECT_TRUE(agreed(rule == rule_code::kStaticShapes))
        << c.name << ", rank " << rank() << ": '" << rule << "'";
  }
}

// One rank alone changes its input: it raises, and the others wait in the
// data's collective until deadline mode ends the wait.
TEST_F(StaticShapes, WithoutTheDebugSettingTheOthersWaitForTheRankThatRaised) {
  if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const Verify verify(false);
  const partita::testing::ExpectedDeadlineMisses expected_misses;  // (the run's end is then clean)
  const double old = mpi::deadline();
  mpi::set_deadline(mpi::scaled_for_ranks(1.0));
  const Case c = cases()[2];  // all_sum_reduce
  const Layer fixed = c.make(everywhere(Shapes::kStatic));
  run(fixed, c.input(1, false), 2);
  std::string rule;
  if (rank() == c.changer)
    rule = raised_rule<ShapeError>([&] { run(fixed, c.input(3, true), 4); });
  else
    rule = raised_rule<DeadlineError>([&] { run(fixed, c.input(3, false), 4); });
  mpi::set_deadline(old);
  const std::string expected =
      rank() == c.changer ? std::string(rule_code::kStaticShapes) : typeid(DeadlineError).name();
  EXPECT_TRUE(agreed(rule == expected)) << "rank " << rank() << ": '" << rule << "'";
}

// Grad mode is each rank's own setting, and a rank under NoGradGuard or
// InferenceMode records no backward. Where another rank's input requires
// grad, that rank's backward would wait for it: every rank raises at the
// forward instead (rule input.grad_mode), per call and at a static layer's
// first call alike, and the layer works afterwards.
using GradMode = StaticShapes;

// This rank's call of `layer` on `x`: under `guard` (0: none, 1:
// NoGradGuard, 2: InferenceMode; 3: none, x not requiring grad), else with
// x requiring grad.
at::Tensor call_under(const Layer& layer, const at::Tensor& x, int guard) {
  if (guard == 3) return layer(x.clone());
  if (guard == 1) {
    torch::NoGradGuard g;
    return layer(x);
  }
  if (guard == 2) {
    c10::InferenceMode g;
    return layer(x);
  }
  return layer(x.detach().clone().requires_grad_(x.is_floating_point()) * 1);
}

TEST_F(GradMode, OffOnOneRankWhileAnotherWantsAGradientRaisesOnEveryRank) {
  if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for (const auto& c : cases())
    for (const Shapes shapes : {Shapes::kPerCall, Shapes::kStatic})
      for (const int guard : {1, 2}) {
        const Layer layer = c.make(everywhere(shapes));
        const std::string rule = raised_rule<ShapeError>(
            [&] { call_under(layer, c.input(1, false), rank() == size() - 1 ? guard : 0); });
        EXPECT_TRUE(agreed(rule == rule_code::kGradMode))
            << c.name << (shapes == Shapes::kStatic ? " (static)" : " (per call)") << ", guard " << guard
            << ", rank " << rank() << ": '" << rule << "'";
        const at::Tensor x = c.input(2, false);
        const Outcome a = run(layer, x, 3), b = run(c.make(everywhere(Shapes::kPerCall)), x, 3);
        EXPECT_TRUE(agreed(same_bits(a.y, b.y) && same_bits(a.dx, b.dx))) << c.name;
      }
}

// A static layer trained with grad is evaluated under NoGradGuard or
// InferenceMode without breaking its promise (grad mode off attaches
// nothing, whatever the plan says), and trains again afterwards. With the
// debug setting the exchange also sees a rank whose grad mode is off while
// another's input requires grad, and every rank raises.
TEST_F(GradMode, AStaticLayerTrainedWithGradIsEvaluatedWithGradModeOff) {
  for (const bool debug : {false, true}) {
    const Verify verify(debug);
    for (const auto& c : cases())
      for (const int guard : {1, 2}) {
        const Layer fixed = c.make(everywhere(Shapes::kStatic));
        const Layer per_call = c.make(everywhere(Shapes::kPerCall));
        run(fixed, c.input(1, false), 2);
        const at::Tensor x = c.input(3, false);
        std::string got;
        at::Tensor a, b;
        try {
          a = call_under(fixed, x.clone(), guard);  // (the in-place halo writes into it)
          b = call_under(per_call, x.clone(), guard);
        } catch (const std::exception& e) {
          got = e.what();
        }
        EXPECT_TRUE(agreed(got.empty() && same_bits(a, b) && !a.requires_grad()))
            << c.name << ", guard " << guard << ", debug " << debug << ", rank " << rank() << ": " << got;
        const Outcome t = run(fixed, c.input(4, false), 5), u = run(per_call, c.input(4, false), 5);
        EXPECT_TRUE(agreed(same_bits(t.y, u.y) && same_bits(t.dx, u.dx))) << c.name << ", debug " << debug;
        if (debug && size() > 1) {
          const std::string rule = raised_rule<ShapeError>(
              [&] { call_under(fixed, c.input(6, false), rank() == size() - 1 ? guard : 0); });
          EXPECT_TRUE(agreed(rule == rule_code::kGradMode)) << c.name << ", rank " << rank() << ": '" << rule << "'";
          // A first call where the last rank's input wants no gradient
          // (its plan attaches on every rank), then the others under grad
          // mode off: each keeps its own promise, but the last rank alone
          // would record the adjoint.
          const Layer mixed_first = c.make(everywhere(Shapes::kStatic));
          call_under(mixed_first, c.input(7, false), rank() == size() - 1 ? 3 : 0);
          const std::string mixed = raised_rule<ShapeError>(
              [&] { call_under(mixed_first, c.input(8, false), rank() == size() - 1 ? 3 : guard); });
          EXPECT_TRUE(agreed(mixed == rule_code::kGradMode))
              << c.name << ", rank " << rank() << ": '" << mixed << "'";
        }
      }
  }
}

// The other way round: a promise made under grad mode off (a plan that
// attaches nothing) is broken by an input that requires grad, which would
// otherwise get no gradient.
TEST_F(GradMode, AStaticLayerFirstCalledWithGradModeOffRefusesAGradient) {
  const Verify verify(false);
  for (const auto& c : cases()) {
    const Layer fixed = c.make(everywhere(Shapes::kStatic));
    {
      torch::NoGradGuard g;
      fixed(c.input(1, false));
    }
    // An input that wants no gradient keeps the promise.
    EXPECT_TRUE(agreed(raised_rule<ShapeError>([&] { fixed(c.input(2, false) * 1); }).empty())) << c.name;
    const std::string rule = raised_rule<ShapeError>([&] { run(fixed, c.input(3, false), 4); });
    EXPECT_TRUE(agreed(rule == rule_code::kStaticShapes)) << c.name << ", rank " << rank() << ": '" << rule << "'";
  }
}

TEST_F(StaticShapes, RanksMustMakeTheSameChoice) {
  if (size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for (const auto& c : cases()) {
    const Layer mixed = c.make([](int r) { return r == 0 ? Shapes::kStatic : Shapes::kPerCall; });
    const std::string rule = raised_rule<PartitionError>([&] { mixed(c.input(1, false)); });
    EXPECT_TRUE(agreed(rule == rule_code::kArgumentsDiffer))
        << c.name << ", rank " << rank() << ": '" << rule << "'";
  }
}

// ---- the communicator -------------------------------------------------------

struct CommCase {
  const char* name;
  std::function<at::Tensor(const at::Tensor&, const mpi::StaticShapes&)> call;
  std::function<at::Tensor(int salt, bool changed)> input;
};

std::vector<CommCase> comm_cases() {
  const auto comm = mpi::Communicator::world();
  const int n = size();
  return {
      {"allreduce", [comm](const at::Tensor& t, const auto& s) { return comm.allreduce(t, ReduceOp::kSum, s); },
       [](int salt, bool changed) { return random({changed ? 4 : 3, 2}, salt); }},
      {"bcast_", [comm](const at::Tensor& t, const auto& s) { return comm.bcast_(t, 0, s); },
       [](int salt, bool changed) { return random({changed ? 4 : 3, 2}, salt); }},
      {"allgather", [comm](const at::Tensor& t, const auto& s) { return comm.allgather(t, 0, s); },
       [](int salt, bool changed) { return random({rank() + 1, changed ? 3 : 2}, salt); }},
      {"alltoall",
       [comm, n](const at::Tensor& t, const auto& s) { return comm.alltoall(t, 0, 1, 2, s); },
       [n](int salt, bool changed) { return random({changed ? 2 : 1, 2 * n}, salt); }},
      // The same site rules for the out= form (no gradient: not in the
      // first test below). Every rank's out assumes every rank's rows are
      // its own: where they are not, the promise raises first.
      {"alltoall_out",
       [comm, n](const at::Tensor& t, const auto& s) {
         at::NoGradGuard no_grad;
         at::Tensor out = at::empty({t.size(0) * n, 2}, t.options());
         return comm.alltoall_out(out, t, 0, 1, 2, s);
       },
       [n](int salt, bool changed) { return random({changed ? 2 : 1, 2 * n}, salt); }},
  };
}

TEST_F(StaticShapes, CommunicatorCallsGiveThePerCallResults) {
  for (const auto& c : comm_cases()) {
    if (std::string(c.name) == "alltoall_out") {  // forward only, into out
      const auto site = mpi::StaticShapes::promise();
      for (int call = 0; call < 4; ++call) {
        const Verify verify(call == 3);
        const at::Tensor x = c.input(10 + call, false);
        EXPECT_TRUE(agreed(same_bits(c.call(x, site), c.call(x, {}))))
            << c.name << ", call " << call << ", rank " << rank();
      }
      continue;
    }
    const auto site = mpi::StaticShapes::promise();
    for (int call = 0; call < 4; ++call) {
      const Verify verify(call == 3);
      const at::Tensor x = c.input(10 + call, false);
      const Outcome a = run([&](const at::Tensor& v) { return c.call(v, site); }, x, 20 + call);
      const Outcome b = run([&](const at::Tensor& v) { return c.call(v, {}); }, x, 20 + call);
      // (bcast_'s gradient is zero off the root, mpi4torch's reduce_.)
      const bool zero_here = std::string(c.name) == "bcast_" && rank() != 0;
      const bool ok = same_bits(a.y, b.y) && same_bits(a.dx, b.dx) && a.dx.defined() &&
                      (zero_here || a.dx.abs().sum().item<double>() > 0);
      EXPECT_TRUE(agreed(ok)) << c.name << ", call " << call << ", rank " << rank();
    }
  }
}

TEST_F(StaticShapes, CommunicatorBrokenPromises) {
  for (const auto& c : comm_cases()) {
    {  // with the debug setting: one rank changes, every rank raises
      const Verify verify(true);
      const auto site = mpi::StaticShapes::promise();
      c.call(c.input(1, false), site);
      const std::string rule =
          raised_rule<ShapeError>([&] { c.call(c.input(2, rank() == size() - 1), site); });
      EXPECT_TRUE(agreed(rule == rule_code::kStaticShapes))
          << c.name << " (checked), rank " << rank() << ": '" << rule << "'";
      EXPECT_TRUE(agreed(same_bits(c.call(c.input(3, false), site), c.call(c.input(3, false), {}))))
          << c.name << " after the broken promise";
    }
    {  // without: every rank changes, each raises alone
      const Verify verify(false);
      const auto site = mpi::StaticShapes::promise();
      c.call(c.input(1, false), site);
      const std::string rule = raised_rule<ShapeError>([&] { c.call(c.input(2, true), site); });
      EXPECT_TRUE(agreed(rule == rule_code::kStaticShapes))
          << c.name << " (unchecked), rank " << rank() << ": '" << rule << "'";
      // The message names the call, then what was promised.
      const std::string msg = raised_message<ShapeError>([&] { c.call(c.input(2, true), site); });
      const std::string call = std::string("Communicator::") + c.name + "(";
      EXPECT_TRUE(agreed(msg.rfind(call, 0) == 0 && msg.find("static shapes were promised") != std::string::npos))
          << c.name << " (unchecked), rank " << rank() << ": '" << msg << "'";
    }
    if (size() >= 2) {  // a promise on rank 0 only: every rank raises at the first call
      const auto site = rank() == 0 ? mpi::StaticShapes::promise() : mpi::StaticShapes();
      bool raised = false;
      try {
        c.call(c.input(1, false), site);
      } catch (const ShapeError&) {
        raised = true;
      }
      EXPECT_TRUE(agreed(raised)) << c.name << ": a promise on rank 0 only, rank " << rank();
    }
  }
  // A site serves one call: given to another, it raises (on every rank alike).
  const auto site = mpi::StaticShapes::promise();
  const auto cs = comm_cases();
  cs[0].call(cs[0].input(1, false), site);
  bool raised = false;
  try {
    cs[1].call(cs[1].input(1, false), site);
  } catch (const Error&) {
    raised = true;
  }
  EXPECT_TRUE(agreed(raised)) << "a site used for two calls, rank " << rank();
  // alltoall and alltoall_out are one call for a site; switching forms
  // changes the record (its out), a broken promise on the rank that switched.
  {
    const Verify verify(false);
    const auto one = mpi::StaticShapes::promise();
    cs[3].call(cs[3].input(1, false), one);
    const std::string rule = raised_rule<ShapeError>([&] { cs[4].call(cs[4].input(1, false), one); });
    EXPECT_TRUE(agreed(rule == rule_code::kStaticShapes))
        << "alltoall then alltoall_out at one site, rank " << rank() << ": '" << rule << "'";
  }
  // A later call whose out is refused (here it requires grad) says why,
  // not only that its record changed.
  {
    const Verify verify(false);
    const auto one = mpi::StaticShapes::promise();
    cs[4].call(cs[4].input(1, false), one);
    const std::string rule = raised_rule<ShapeError>([&] {
      const at::Tensor t = cs[4].input(2, false);
      at::Tensor out = at::empty({t.size(0) * size(), 2}, t.options()).requires_grad_();
      mpi::Communicator::world().alltoall_out(out, t, 0, 1, 2, one);
    });
    EXPECT_TRUE(agreed(rule == rule_code::kOutTensor))
        << "alltoall_out's later call with a refused out, rank " << rank() << ": '" << rule << "'";
  }
}

// A first call that raises in its own checks (shapes that differ between
// ranks where they must agree, an out of the wrong shape) makes no promise:
// the next call with good input is a first call again, and later calls keep
// its promise, with and without the debug setting.
TEST_F(StaticShapes, AFailingFirstCommunicatorCallMakesNoPromise) {
  if (size() < 2) GTEST_SKIP() << "one rank: nothing to differ between ranks";
  const auto comm = mpi::Communicator::world();
  for (const bool checked : {false, true}) {
    const Verify verify(checked);
    {
      const auto site = mpi::StaticShapes::promise();
      const at::Tensor bad = at::ones({2, rank() == size() - 1 ? 3 : 2});
      const std::string rule = raised_rule<ShapeError>([&] { comm.allgather(bad, 0, site); });
      EXPECT_TRUE(agreed(!rule.empty())) << "allgather's bad first call, rank " << rank();
      bool ok = true;
      for (int call = 0; call < 3; ++call) {
        const at::Tensor good = at::full({2, 2}, static_cast<float>(rank() + call));
        ok = ok && same_bits(comm.allgather(good, 0, site), comm.allgather(good, 0, {}));
      }
      EXPECT_TRUE(agreed(ok)) << "allgather after a failed first call" << (checked ? " (checked)" : "")
                              << ", rank " << rank();
    }
    {
      const auto site = mpi::StaticShapes::promise();
      // (gather and scatter along axis 0: each rank sends and receives 2 rows.)
      const at::Tensor t = at::full({2, 2}, static_cast<float>(rank()));
      at::Tensor wrong = at::empty({3, 2});
      const std::string rule = raised_rule<ShapeError>([&] { comm.alltoall_out(wrong, t, 0, 0, 2, site); });
      EXPECT_TRUE(agreed(rule == rule_code::kOutTensor)) << "alltoall_out's bad first out, rank " << rank();
      bool ok = true;
      for (int call = 0; call < 3; ++call) {
        at::Tensor out = at::empty({2, 2}), plain = at::empty({2, 2});
        comm.alltoall_out(out, t + call, 0, 0, 2, site);
        comm.alltoall_out(plain, t + call, 0, 0, 2, {});
        ok = ok && same_bits(out, plain);
      }
      EXPECT_TRUE(agreed(ok)) << "alltoall_out after a failed first call" << (checked ? " (checked)" : "")
                              << ", rank " << rank();
    }
  }
}

}  // namespace
}  // namespace partita::spec
