// partita::testing's own checks must be able to fail: each check
// of checks.hpp against a correct distributed function and against one with
// the kind of bug it is there to catch; the lockstep harness against a
// function that deadlocks in one case. Every verdict is agreed on every rank.
#include <gtest/gtest.h>

#include <optional>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "partita/mpi/communicator.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/testing/case_runner.hpp"
#include "partita/testing/checks.hpp"
#include "partita/errors.hpp"
#include "partita/testing/ivalue_compare.hpp"
#include "partita/testing/lockstep.hpp"
#include "partita/testing/partition_cases.hpp"

namespace partita::testing {
namespace {

using Comm = mpi::Communicator;

// allreduce(x, SUM) with a hand-written backward that can be made wrong.
enum class Bug { none, doubled_gradient, writes_cotangent, ones_when_unused, undefined_when_unused, float32_off,
                 nan_gradient, huge_element };
struct Summed : torch::autograd::Function<Summed> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t bug) {
    ctx->saved_data["bug"] = bug;
    if (static_cast<Bug>(bug) == Bug::undefined_when_unused) ctx->set_materialize_grads(false);
    return Comm::world().allreduce(x, ReduceOp::kSum).detach();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const auto bug = static_cast<Bug>(ctx->saved_data["bug"].toInt());
    if (!g[0].defined()) return {at::Tensor(), at::Tensor()};
    if (bug == Bug::ones_when_unused && !g[0].ne(0).any().item<bool>())
      return {at::ones_like(g[0]), at::Tensor()};
    at::Tensor gx = Comm::world().allreduce(g[0], ReduceOp::kSum).detach();
    if (bug == Bug::doubled_gradient) gx = gx * 2;
    if (bug == Bug::nan_gradient) gx = gx * std::nan("");
    if (bug == Bug::huge_element) gx.view(-1)[0] += 1e200;  // its square overflows
    if (bug == Bug::writes_cotangent) g[0].mul_(1.5);  // the caller's tensor
    return {gx, at::Tensor()};
  }
};

// The function and its twin (every output is the sum of every input).
DistributedFunction summed(Bug bug, bool wrong_forward = false) {
  return {"summed",
          [bug, wrong_forward](const at::Tensor& x) {
            at::Tensor y = Summed::apply(x, static_cast<int64_t>(bug));
            if (wrong_forward && mpi::world_rank() == mpi::world_size() - 1) y = y + 1e-6;
            if (bug == Bug::float32_off) y = y * (1 + 1e-3);  // a relative error float32 must not pass
            return y;
          },
          [](const Tensors& xs) {
            at::Tensor s = at::zeros_like(xs[0]);
            for (const auto& x : xs) s = s + x;
            return Tensors(xs.size(), s);
          },
          [](int) { return Shape{3, 2}; }};
}

TEST(Checks, PassACorrectFunction) {
  PARTITA_EXPECT_AGREED(check_forward(summed(Bug::none), at::kDouble, 1));
  PARTITA_EXPECT_AGREED(check_forward(summed(Bug::none), at::kInt, 2));
  PARTITA_EXPECT_AGREED(check_backward(summed(Bug::none), at::kFloat, 3));
  PARTITA_EXPECT_AGREED(check_backward(summed(Bug::none), at::kDouble, 3, {0}));
  PARTITA_EXPECT_AGREED(check_adjoint(summed(Bug::none), 4));
  PARTITA_EXPECT_AGREED(check_unused_output(summed(Bug::none), 5));
  PARTITA_EXPECT_AGREED(check_finite_differences(summed(Bug::none), 6));
  Verdict v;
  check_all(summed(Bug::none), 7, v);
  PARTITA_EXPECT_AGREED(v.message());
}

// Each bug fails the check meant for it, on every rank.
TEST(Checks, FailWhereTheyShould) {
  EXPECT_NE(agree(check_forward(summed(Bug::none, true), at::kDouble, 1)), "");
  EXPECT_NE(agree(check_backward(summed(Bug::doubled_gradient), at::kDouble, 1)), "");
  EXPECT_NE(agree(check_adjoint(summed(Bug::doubled_gradient), 1)), "");
  EXPECT_NE(agree(check_finite_differences(summed(Bug::doubled_gradient), 1)), "");
  const std::string kept = agree(check_adjoint(summed(Bug::writes_cotangent), 1));
  EXPECT_NE(kept.find("changed the cotangent"), std::string::npos) << kept;
  EXPECT_NE(agree(check_unused_output(summed(Bug::ones_when_unused), 1)), "");
  const std::string undefined = agree(check_unused_output(summed(Bug::undefined_when_unused), 1));
  EXPECT_NE(undefined.find("undefined"), std::string::npos) << undefined;
  // NaN gradients fail finite differences; a gradient element whose square
  // overflows (an infinite norm) fails the adjoint identity instead of
  // making every gap zero.
  const std::string nan = agree(check_finite_differences(summed(Bug::nan_gradient), 1));
  EXPECT_NE(nan.find("backward nan, finite differences"), std::string::npos) << nan;
  const std::string huge = agree(check_adjoint(summed(Bug::huge_element), 1));
  EXPECT_NE(huge.find("adjoint identity: not finite"), std::string::npos) << huge;
  // A 1e-6 forward error passes a stated float32 tolerance and fails bitwise.
  EXPECT_EQ(agree(check_forward(summed(Bug::none, true), at::kDouble, 1, Tolerance().float64(1e-3))), "");
}

// Each dtype is held to its own bound (|got - want| <= bound * max(1,
// max |want|)): float32 to 8e-5, not to the 16-bit types' 0.24, and the
// 16-bit types to 0.24. The failure tests above are float64 only.
TEST(Checks, EachDtypeIsHeldToItsOwnBound) {
  const at::Tensor want = at::linspace(1, 2, 16, at::kDouble);
  auto off_by = [&](at::ScalarType dtype, double relative) {
    return compare((want * (1 + relative)).to(dtype), want.to(dtype));
  };
  EXPECT_EQ(off_by(at::kFloat, 1e-5), "");
  EXPECT_NE(off_by(at::kFloat, 1e-3), "") << "float32 held to a bound looser than 8e-5";
  EXPECT_NE(off_by(at::kFloat, 1e-4 * 2), "") << "float32 held to a bound looser than 8e-5";
  EXPECT_EQ(off_by(at::kDouble, 1e-13), "");
  EXPECT_NE(off_by(at::kDouble, 1e-10), "") << "float64 held to a bound looser than 8e-12";
  EXPECT_EQ(off_by(at::kHalf, 0.1), "");
  EXPECT_NE(off_by(at::kHalf, 0.5), "") << "float16 held to a bound looser than 0.24";
  EXPECT_EQ(off_by(at::kBFloat16, 0.1), "");
  EXPECT_NE(off_by(at::kBFloat16, 0.5), "") << "bfloat16 held to a bound looser than 0.24";
  // And through a check: a float32 layer 1e-3 off fails check_forward.
  PARTITA_EXPECT_AGREED(check_forward(summed(Bug::none), at::kFloat, 2));
  EXPECT_NE(agree(check_forward(summed(Bug::float32_off), at::kFloat, 2)), "");
  EXPECT_EQ(agree(check_forward(summed(Bug::float32_off), at::kFloat, 2, Tolerance().float32(1e-2))), "");
}

// Below 1 the 16-bit bound is absolute (0.24): zeros in place of outputs
// or gradients near 0.05 pass compare() and fail against the twin in
// float64; zeros where the exact result is zero (x * 3 - x * 2 - x, which
// rounds to other values in 16 bits) pass, and so do zeros that the twin
// computes in 16 bits too.
TEST(Checks, SixteenBitZerosFailWhereTheExactResultIsNot) {
  enum class Wrong { none, zero_output, zero_gradient };
  auto scaled = [](Wrong wrong) {
    return DistributedFunction{"scaled",
                               [wrong](const at::Tensor& x) {
                                 if (wrong == Wrong::zero_output) return at::zeros_like(x);
                                 return (wrong == Wrong::zero_gradient ? x.detach() : x) * 0.05;
                               },
                               [](const Tensors& xs) {
                                 Tensors ys;
                                 for (const auto& x : xs) ys.push_back(x * 0.05);
                                 return ys;
                               },
                               [](int) { return Shape{4, 3}; }};
  };
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    const std::string name = c10::toString(dtype);
    PARTITA_EXPECT_AGREED(check_forward(scaled(Wrong::none), dtype, 3));
    PARTITA_EXPECT_AGREED(check_backward(scaled(Wrong::none), dtype, 3));
    EXPECT_EQ(compare(at::zeros({4, 3}, dtype), (rank_input(3, 0, {4, 3}, dtype) * 0.05)), "")
        << name << ": the absolute bound alone passes zeros (what this test is about)";
    const std::string zeros = agree(check_forward(scaled(Wrong::zero_output), dtype, 3));
    EXPECT_NE(zeros.find("all-zero output (the twin's in float64 reaches"), std::string::npos) << name << ": " << zeros;
    const std::string grads = agree(check_backward(scaled(Wrong::zero_gradient), dtype, 3));
    EXPECT_NE(grads.find("backward (" + name + "): all-zero output (the twin's in float64"), std::string::npos)
        << name << ": " << grads;
    const DistributedFunction vanishing{"vanishing",
                                        [](const at::Tensor& x) { return at::zeros_like(x) * x; },
                                        [](const Tensors& xs) {
                                          Tensors ys;
                                          for (const auto& x : xs) ys.push_back(x * 3 - x * 2 - x);
                                          return ys;
                                        },
                                        [](int) { return Shape{4, 3}; }};
    PARTITA_EXPECT_AGREED(check_forward(vanishing, dtype, 3));
    // Zeros the obvious 16-bit computation gives too ((x / 20 + 256) - 256
    // rounds to 0 in 16 bits, not in float64): the layer equals its twin.
    auto cancelling = [](const at::Tensor& x) { return (x * 0.05 + 256) - 256; };
    const DistributedFunction rounded_away{"rounded away", cancelling,
                                           [cancelling](const Tensors& xs) {
                                             Tensors ys;
                                             for (const auto& x : xs) ys.push_back(cancelling(x));
                                             return ys;
                                           },
                                           [](int) { return Shape{4, 3}; }};
    PARTITA_EXPECT_AGREED(check_forward(rounded_away, dtype, 3));
  }
}

// Tolerance::exact() compares bits: -0.0 is not +0.0, a NaN is the same NaN.
TEST(Checks, ExactMeansEqualBits) {
  const at::Tensor x = at::linspace(-1, 1, 5, at::kDouble);
  EXPECT_EQ(compare(x, x.clone(), Tolerance::exact()), "");
  EXPECT_NE(compare(x + 1e-16, x, Tolerance::exact()), "");
  EXPECT_NE(compare(at::full({2}, -0.0, at::kDouble), at::zeros({2}, at::kDouble), Tolerance::exact()), "")
      << "-0.0 and +0.0 differ in bits";
  const at::Tensor nan = at::full({2}, std::nan(""), at::kFloat);
  EXPECT_EQ(compare(nan, nan.clone(), Tolerance::exact()), "") << "a NaN has the same bits as itself";
}

// ivalue_difference compares values as read: a conjugate or negative view
// against the bits beneath its flag differs, against its resolved copy not.
TEST(Checks, IValuesCompareConjugateAndNegativeViewsByValue) {
  const at::Tensor t = at::complex(at::arange(1, 5, at::kDouble), at::arange(2, 6, at::kDouble));
  EXPECT_NE(ivalue_difference(c10::IValue(t.conj()), c10::IValue(t)), "");
  EXPECT_EQ(ivalue_difference(c10::IValue(t.conj()), c10::IValue(t.conj().resolve_conj())), "");
  const at::Tensor r = at::arange(1, 5, at::kDouble);
  EXPECT_NE(ivalue_difference(c10::IValue(r._neg_view()), c10::IValue(r)), "");
  EXPECT_EQ(ivalue_difference(c10::IValue(r._neg_view()), c10::IValue(-r)), "");
}

// check_all's forward and backward checks run only the dtypes asked for,
// the unused-output backward included: a function made for float32 alone
// passes them at float32 (the adjoint and unused-output checks are float64
// by definition, and left out here).
TEST(Checks, CheckAllRunsOnlyTheDtypesAskedFor) {
  DistributedFunction f = summed(Bug::none);
  const auto run = f.run;
  f.run = [run](const at::Tensor& x) {
    if (x.scalar_type() != at::kFloat) throw std::runtime_error("float32 only");
    return run(x);
  };
  Verdict v;
  check_all(f, 3, v, CheckOptions().dtypes({at::kFloat}).adjoint(false).unused_output(false));
  EXPECT_EQ(agree(v.ok() ? "" : v.message()), "");
}

struct Seeded {
  explicit Seeded(int v) : value(v) {}
  int value;
};
std::ostream& operator<<(std::ostream& os, const Seeded& s) { return os << "{\"value\": " << s.value << "}"; }

// A function that deadlocks in some cases (rank 0 skips the collective)
// fails those cases within the deadline, with a replay line, and the cases
// and properties after it run.
// The case runner's verdict on a case the reference rejects: only MPI's
// error of the same class naming the same rule agrees; a DeadlineError, an
// error of another class or another rule, or none on an involved rank does
// not (any of them taken as agreeing would hide an MPI bug behind a
// rejection); a reference error without a rule agrees with nothing.
TEST(CaseRunner, ARejectionAgreesOnlyWithTheSameClassAndRule) {
  const std::string uneven = error_class(ShapeError("pieces", rule_code::kTilingUneven));
  EXPECT_EQ(uneven, "ShapeError[tiling.uneven]");
  EXPECT_TRUE(rejection_agrees(uneven, uneven, true));
  EXPECT_FALSE(rejection_agrees(uneven, error_class(ShapeError("x", rule_code::kTeamShapes)), true));
  EXPECT_FALSE(rejection_agrees(uneven, error_class(PartitionError("x", rule_code::kTilingUneven)), true));
  EXPECT_FALSE(rejection_agrees(uneven, error_class(DeadlineError("stuck")), true));
  EXPECT_FALSE(rejection_agrees(uneven, error_class(Error("x")), true));
  EXPECT_FALSE(rejection_agrees(uneven, "", true)) << "an involved rank that raised nothing";
  EXPECT_TRUE(rejection_agrees(uneven, "", false)) << "a rank outside the layer may go on";
  const std::string no_rule = error_class(ShapeError("no code"));
  EXPECT_EQ(no_rule, "ShapeError[no rule]");
  EXPECT_FALSE(rejection_agrees(no_rule, no_rule, true));
}

// The runner's check that a layer's second call equals its first: a first
// output of another dtype or shape fails whatever its bytes, also one
// whose bytes are the start of the second's or run past its end.
TEST(CaseRunner, SameBitsNeedsTheSameDtypeAndShape) {
  const at::Tensor a = at::arange(6, at::kLong);
  EXPECT_TRUE(same_bits(a, a.clone()));
  EXPECT_FALSE(same_bits(a.slice(0, 0, 3), a)) << "a shorter first output, the start of the second";
  EXPECT_FALSE(same_bits(a, a.slice(0, 0, 3))) << "a longer first output";
  EXPECT_FALSE(same_bits(a.reshape({2, 3}), a)) << "another shape, the same bytes";
  EXPECT_FALSE(same_bits(a.view(at::kDouble), a)) << "another dtype, the same bytes";
  EXPECT_FALSE(same_bits(at::zeros({0, 2}), at::zeros({0}))) << "two empty tensors of other shapes";
  EXPECT_TRUE(same_bits(at::zeros({0, 2}), at::zeros({0, 2})));
  EXPECT_FALSE(same_bits(a, a + 1));
}

// Every case the property generators draw prints (its `case:` line) as a
// case file `partita run` reads back to the same case: repartitions and
// halo exchanges whose tensor has more dimensions than P_x among them.
TEST(CaseRunner, EveryDrawnCaseIsACaseFilePartitaRunReads) {
  const std::vector<std::string> primitives = {"broadcast",      "sum_reduce",  "all_sum_reduce", "all_gather",
                                               "reduce_scatter", "repartition", "halo_exchange"};
  const std::vector<std::string> layers = {"linear", "linear_all_gather", "linear_reduce_scatter",
                                           "linear_all_gather_zero", "linear_reduce_scatter_zero"};
  for (int world : {1, 2, 3, 4, 6, 8})
    for (const auto& gen : {gen_primitive_case(world, primitives), gen_linear_case(world, layers)})
      EXPECT_TRUE(rc::check("drawn cases read back at " + std::to_string(world) + " ranks", [&gen] {
        const Case c = *gen;
        const std::string line = c.repro();
        std::string again;
        try {
          again = Case::parse(line, "case").repro();
        } catch (const CaseError& e) {
          RC_FAIL(std::string("refused: ") + e.what());
        }
        RC_ASSERT(again == line);
      }));
}

// A counterexample that prints as a case line the reader refuses is said
// to be one (its replay through `partita run` would fail), not left out.
struct RefusedCase {
  explicit RefusedCase(int v) : value(v) {}
  int value;
};
std::ostream& operator<<(std::ostream& os, const RefusedCase& c) {
  return os << R"({"primitive": "broadcast", "P_x": {"ranks": [0], "shape": [1]}, "global_shape": [)" << c.value
            << "]}";
}

// PARTITA_PROP_CASES sets the case count unless RC_PARAMS names one (a
// replay line does, and replays the failing run's cases whatever the shell
// holds); a value that is not a count from 1 to 10^9 throws on every rank
// instead of running no case at all.
TEST(Lockstep, TheCaseCountFromTheEnvironment) {
  auto saved = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  const auto rc_params = saved("RC_PARAMS"), cases = saved("PARTITA_PROP_CASES");
  ::unsetenv("RC_PARAMS");
  ::setenv("PARTITA_PROP_CASES", "7", 1);
  EXPECT_EQ(lockstep_params().max_success, 7);
  ::setenv("RC_PARAMS", "seed=1 max_success=3", 1);
  EXPECT_NE(lockstep_params().max_success, 7) << "PARTITA_PROP_CASES overrode a replay line's max_success";
  ::unsetenv("RC_PARAMS");
  for (const char* bad : {"lots", "0", "-3", "12x", "2000000000"}) {
    ::setenv("PARTITA_PROP_CASES", bad, 1);
    EXPECT_THROW(lockstep_params(), std::invalid_argument) << bad;
  }
  for (const auto& [name, value] : {std::pair{"RC_PARAMS", rc_params}, std::pair{"PARTITA_PROP_CASES", cases}}) {
    if (value) ::setenv(name, value->c_str(), 1);
    else ::unsetenv(name);
  }
}

TEST(Lockstep, ACaseLineTheReaderRefusesIsSaid) {
  std::string report;
  EXPECT_FALSE(check_lockstep<RefusedCase>("refused case line", rc::gen::construct<RefusedCase>(rc::gen::inRange(0, 5)),
                                           [](const RefusedCase&, Verdict& v) { v.fail("every case fails"); },
                                           &report));
  EXPECT_NE(report.find("this case line is not a case file partita run reads"), std::string::npos) << report;
  EXPECT_NE(report.find("field \"P_y\""), std::string::npos) << report;
}

TEST(Lockstep, ADeadlockFailsItsCaseAndTheNextRuns) {
  if (mpi::world_size() < 2) GTEST_SKIP() << "a deadlock needs two ranks";
  if (mpi::deadline() <= 0) GTEST_SKIP() << "PARTITA_DEADLINE is not set";
  auto run = [](const Seeded& s, Verdict& v) {
    at::Tensor want = at::zeros({4}, at::kDouble);
    for (int r = 0; r < mpi::world_size(); ++r) want += rank_input(s.value, r, {4}, at::kDouble);
    if (s.value >= 7 && mpi::world_rank() == 0) return;  // the bug: no allreduce here
    const at::Tensor x = rank_input(s.value, mpi::world_rank(), {4}, at::kDouble);
    v.expect_empty(compare(Comm::world().allreduce(x, ReduceOp::kSum), want));
  };
  std::string report;
  const auto gen = rc::gen::construct<Seeded>(rc::gen::inRange(0, 10));
  {
    ExpectedDeadlineMisses expected;  // without it the run fails at its end
    EXPECT_FALSE(check_lockstep<Seeded>("deadlocks from 7", gen, run, &report));
  }
  if (mpi::world_rank() == 0) {
    EXPECT_NE(report.find("replay: RC_PARAMS=\"seed="), std::string::npos) << report;
    EXPECT_NE(report.find("deadlocks from 7"), std::string::npos) << report;
  }
  const auto small = rc::gen::construct<Seeded>(rc::gen::inRange(0, 7));
  EXPECT_TRUE(check_lockstep<Seeded>("never deadlocks", small, run));
}

// Cases that miss a deadline and pass (a property expecting the misses)
// all run: only shrinking stops after three cases that missed one.
TEST(Lockstep, CasesThatMissADeadlineAndPassAllRun) {
  if (mpi::world_size() < 2) GTEST_SKIP() << "a missed deadline needs two ranks";
  if (mpi::deadline() <= 0) GTEST_SKIP() << "PARTITA_DEADLINE is not set";
  const char* was = std::getenv("PARTITA_PROP_CASES");
  const std::string saved = was ? was : "";
  setenv("PARTITA_PROP_CASES", "5", 1);
  int runs = 0;
  bool passed = false;
  {
    ExpectedDeadlineMisses expected;
    passed = check_lockstep<Seeded>("expects its misses", rc::gen::construct<Seeded>(rc::gen::inRange(0, 10)),
                                    [&runs](const Seeded&, Verdict& v) {
                                      ++runs;
                                      if (mpi::world_rank() == 0) return;  // rank 0 never joins
                                      try {
                                        Comm::world().allreduce(at::ones({1}, at::kDouble), ReduceOp::kSum);
                                        v.fail("the allreduce returned without rank 0");
                                      } catch (const DeadlineError&) {
                                        // expected
                                      }
                                    });
  }
  if (was)
    setenv("PARTITA_PROP_CASES", saved.c_str(), 1);
  else
    unsetenv("PARTITA_PROP_CASES");
  EXPECT_TRUE(passed);
  EXPECT_EQ(runs, 5) << "rank " << mpi::world_rank();
}

// A body that throws what is not a std::exception (RapidCheck's RC_ASSERT
// throws its own type) on one rank fails the case on every rank, in step:
// the property reports it, and the next property runs.
TEST(Lockstep, RapidChecksMacrosAndOtherThrowsFailTheCaseOnEveryRank) {
  const int last = mpi::world_size() - 1;
  for (const int kind : {0, 1}) {
    auto run = [kind, last](const Seeded& s, Verdict& v) {
      const at::Tensor x = rank_input(s.value, mpi::world_rank(), {2}, at::kDouble);
      v.expect_empty(compare(Comm::world().allreduce(x, ReduceOp::kSum), Comm::world().allreduce(x, ReduceOp::kSum)));
      if (mpi::world_rank() == last && s.value >= 3) {
        if (kind == 0) RC_ASSERT(s.value < 3);
        throw 42;
      }
    };
    std::string report;
    const auto gen = rc::gen::construct<Seeded>(rc::gen::inRange(0, 10));
    const bool passed = check_lockstep<Seeded>("throws from 3", gen, run, &report);
    EXPECT_FALSE(passed) << kind;
    if (mpi::world_rank() == 0)
      EXPECT_NE(report.find(kind == 0 ? "RC_ASSERT or RC_FAIL" : "an exception that is not a std::exception"),
                std::string::npos)
          << report;
  }
  const auto small = rc::gen::construct<Seeded>(rc::gen::inRange(0, 3));
  EXPECT_TRUE(check_lockstep<Seeded>("never throws", small, [](const Seeded& s, Verdict& v) {
    const at::Tensor x = rank_input(s.value, mpi::world_rank(), {2}, at::kDouble);
    v.expect(Comm::world().allreduce(x, ReduceOp::kSum).numel() == 2, "two elements");
  }));
}

}  // namespace
}  // namespace partita::testing
