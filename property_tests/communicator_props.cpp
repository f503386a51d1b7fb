// Lockstep properties of the differentiable communicator (issue 12): random
// calls (allreduce, bcast_, reduce_, gather, allgather, scatter, alltoall,
// the isend/irecv/wait ring) with random shapes of 1-3 dimensions
// (zero-length extents included), axes, roots, per-rank extents and numelem
// (uneven scatter and alltoall counts), operations and dtypes. Every rank's
// forward must equal the serial reference's for that rank, its input
// gradient the reference's autograd gradient (float dtypes, SUM; in a third
// of the cases some ranks' outputs do not reach the loss, and backward there
// gets an undefined gradient), and, in float64, the adjoint identity must hold.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <sstream>

#include "partita/testing/comm_checks.hpp"
#include "partita/testing/lockstep.hpp"
#include "partita/mpi/communicator.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/reference/communicator.hpp"
#include "partita/tensor_rules.hpp"

namespace partita::testing::comm {
namespace {

namespace ref = partita::reference::comm;
using mpi::Communicator;

struct CommCase {
  std::string call;
  std::string dtype = "float64";
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  Shape base;                     // every rank's shape but along the varying axes
  int64_t axis = 0, axis2 = 0;    // gather / scatter axis (alltoall: gather, scatter)
  std::vector<int64_t> extents;   // per rank, along `axis` (gather, allgather, alltoall)
  std::vector<int64_t> numelem;   // per rank (scatter, alltoall)
  Shape other;                    // scatter: the non-roots' (unread) shape
  uint64_t seed = 0;
  std::vector<int> unused;        // ranks whose output does not reach the loss (issue 18)
};

std::string list(const std::vector<int64_t>& v) { return "[" + list_string(v) + "]"; }

std::ostream& operator<<(std::ostream& os, const CommCase& c) {
  return os << "{\"call\": \"" << c.call << "\", \"dtype\": \"" << c.dtype << "\", \"op\": \""
            << op_name(c.op) << "\", \"root\": " << c.root << ", \"base\": " << list(c.base)
            << ", \"axis\": " << c.axis << ", \"axis2\": " << c.axis2
            << ", \"extents\": " << list(c.extents) << ", \"numelem\": " << list(c.numelem)
            << ", \"other\": " << list(c.other) << ", \"seed\": " << c.seed
            << ", \"unused\": [" << list_string(c.unused) << "]}";
}

int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (auto x : v) s += x;
  return s;
}

// A random split of `total` into `p` non-negative parts.
std::vector<int64_t> split(int64_t total, int p) {
  std::vector<int64_t> cuts{0, total};
  for (int i = 1; i < p; ++i) cuts.push_back(*rc::gen::inRange<int64_t>(0, total + 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> parts;
  for (int i = 0; i < p; ++i) parts.push_back(cuts[i + 1] - cuts[i]);
  return parts;
}

rc::Gen<CommCase> gen_case(int p) {
  return rc::gen::exec([p] {
    CommCase c;
    c.call = *rc::gen::element<std::string>("allreduce", "bcast_", "reduce_", "gather",
                                            "allgather", "scatter", "alltoall", "alltoall_out",
                                            "ring");
    c.dtype = *rc::gen::weightedElement<std::string>(
        {{6, "float64"}, {2, "float32"}, {2, "int32"}, {1, "int64"}, {1, "bfloat16"}});
    const bool reduction = c.call == "allreduce" || c.call == "reduce_";
    if (reduction) {
      if (c.dtype == "bfloat16")
        c.op = ReduceOp::kSum;
      else if (c.dtype == "int32" || c.dtype == "int64")
        c.op = static_cast<ReduceOp>(*rc::gen::inRange(0, 10));
      else
        c.op = *rc::gen::element(ReduceOp::kSum, ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax,
                                 ReduceOp::kMin);
    }
    c.root = *rc::gen::inRange(0, p);
    const int dims = *rc::gen::inRange(1, 4);
    for (int d = 0; d < dims; ++d)
      c.base.push_back(*rc::gen::weightedElement<int64_t>({{1, 0}, {4, 1}, {4, 2}, {3, 3}}));
    c.axis = *rc::gen::inRange<int64_t>(0, dims);
    c.axis2 = *rc::gen::inRange<int64_t>(0, dims);
    // alltoall_out copies the received blocks into out when rows come
    // before the gather axis (outer > 1) and receives in place otherwise:
    // half its cases gather along the last of at least two dimensions, with
    // two rows ahead, so that both paths are drawn at the default count.
    if (c.call == "alltoall_out" && *rc::gen::inRange(0, 2) == 0) {
      while (c.base.size() < 2) c.base.push_back(2);
      c.axis = static_cast<int64_t>(c.base.size()) - 1;
      c.axis2 = *rc::gen::inRange<int64_t>(0, static_cast<int64_t>(c.base.size()));
      c.base[0] = 2;
    }
    for (int r = 0; r < p; ++r) c.extents.push_back(*rc::gen::inRange<int64_t>(0, 4));
    if ((c.call == "alltoall" || c.call == "alltoall_out") && c.axis == c.axis2)
      c.numelem = split(sum_of(c.extents), p);  // the concatenation re-split
    else
      for (int r = 0; r < p; ++r) c.numelem.push_back(*rc::gen::inRange<int64_t>(0, 4));
    c.other = {*rc::gen::inRange<int64_t>(0, 3)};
    c.seed = *rc::gen::inRange<uint64_t>(0, 1u << 30);
    // In a third of the cases some ranks leave their output out of the loss.
    if (*rc::gen::inRange(0, 3) == 0)
      for (int r = 0; r < p; ++r)
        if (*rc::gen::inRange(0, 2) == 0) c.unused.push_back(r);
    return c;
  });
}

// The call of a case: what each rank runs, the reference, input shapes.
Call call_of(const CommCase& c) {
  Call k;
  k.name = c.call;
  const CommCase cc = c;
  auto with = [cc](int64_t axis, int64_t extent) {
    Shape s = cc.base;
    s[axis] = extent;
    return s;
  };
  if (c.call == "allreduce") {
    k.run = [cc](const Communicator& m, const at::Tensor& x) { return m.allreduce(x, cc.op); };
    k.reference = [cc](const Tensors& x) { return ref::allreduce(x, cc.op); };
    k.shape = [cc](int) { return cc.base; };
  } else if (c.call == "bcast_") {
    k.run = [cc](const Communicator& m, const at::Tensor& x) { return m.bcast_(x.clone(), cc.root); };
    k.reference = [cc](const Tensors& x) { return ref::bcast(x, cc.root); };
    k.shape = [cc](int) { return cc.base; };
  } else if (c.call == "reduce_") {
    k.run = [cc](const Communicator& m, const at::Tensor& x) {
      return m.reduce_(x.clone(), cc.op, cc.root);
    };
    k.reference = [cc](const Tensors& x) { return ref::reduce(x, cc.op, cc.root); };
    k.shape = [cc](int) { return cc.base; };
  } else if (c.call == "gather") {
    k.run = [cc](const Communicator& m, const at::Tensor& x) { return m.gather(x, cc.axis, cc.root); };
    k.reference = [cc](const Tensors& x) { return ref::gather(x, cc.axis, cc.root); };
    k.shape = [cc, with](int r) { return with(cc.axis, cc.extents[r]); };
  } else if (c.call == "allgather") {
    k.run = [cc](const Communicator& m, const at::Tensor& x) { return m.allgather(x, cc.axis); };
    k.reference = [cc](const Tensors& x) { return ref::allgather(x, cc.axis); };
    k.shape = [cc, with](int r) { return with(cc.axis, cc.extents[r]); };
  } else if (c.call == "scatter") {
    k.run = [cc](const Communicator& m, const at::Tensor& x) {
      return m.scatter(x, cc.axis, cc.numelem[m.rank()], cc.root);
    };
    k.reference = [cc](const Tensors& x) { return ref::scatter(x, cc.axis, cc.numelem, cc.root); };
    k.shape = [cc, with](int r) { return r == cc.root ? with(cc.axis, sum_of(cc.numelem)) : cc.other; };
  } else if (c.call == "alltoall" || c.call == "alltoall_out") {
    k.run = [cc](const Communicator& m, const at::Tensor& x) {
      if (cc.call == "alltoall") return m.alltoall(x, cc.axis, cc.axis2, cc.numelem[m.rank()]);
      // Into the caller's tensor, filled first with 77, which no input
      // holds (normal draws, or integers below 8), so that an element left
      // unwritten shows.
      Shape out_shape = x.sizes().vec();
      out_shape[cc.axis2] = cc.numelem[m.rank()];
      if (cc.axis != cc.axis2) out_shape[cc.axis] = sum_of(cc.extents);
      at::Tensor out = at::full(out_shape, 77, x.options());
      at::Tensor& same = m.alltoall_out(out, x, cc.axis, cc.axis2, cc.numelem[m.rank()]);
      if (same.data_ptr() != out.data_ptr()) throw std::runtime_error("alltoall_out returned another tensor");
      return out;
    };
    k.reference = [cc](const Tensors& x) { return ref::alltoall(x, cc.axis, cc.axis2, cc.numelem); };
    k.shape = [cc](int r) {
      Shape s = cc.base;
      s[cc.axis] = cc.extents[r];
      if (cc.axis2 != cc.axis) s[cc.axis2] = sum_of(cc.numelem);
      return s;
    };
  } else {  // the seed's ring, with dummies
    k.run = [](const Communicator& m, const at::Tensor& a) {
      const int next = (m.rank() + 1) % m.size(), prev = (m.rank() - 1 + m.size()) % m.size();
      auto h = m.isend(a, next, 5);
      auto rh = m.irecv(mpi::join_dummies(torch::empty_like(a), {h.dummy()}), prev, 5);
      at::Tensor b = m.wait(rh);
      at::Tensor w = m.wait(mpi::join_dummies_handle(h, {b}));
      return mpi::join_dummies(b, {w});
    };
    k.reference = [](const Tensors& x) { return ref::ring(x, 1); };
    k.shape = [cc](int) { return cc.base; };
  }
  return k;
}

TEST(CommunicatorProperty, MatchesReference) {
  torch::set_num_threads(1);
  std::map<std::string, int> seen;
  const bool ok = check_lockstep<CommCase>(
      "communicator against the reference", gen_case(mpi::world_size()),
      [&seen](const CommCase& c, Verdict& v) {
        const Communicator comm = Communicator::world();
        const Call k = call_of(c);
        const at::ScalarType dtype = parse_dtype(c.dtype);
        // The calls that only move values move their bits, in every dtype
        // (bfloat16's tolerance would let two swapped elements pass).
        const bool moves_only = c.call != "allreduce" && c.call != "reduce_";
        const std::string f = check_forward(comm, k, dtype, c.seed, moves_only ? Tolerance::exact() : Tolerance());
        v.expect(f.empty(), f);
        // (alltoall_out records no history, as LibTorch's out= functions.)
        const bool differentiable =
            at::isFloatingType(dtype) && c.call != "alltoall_out" &&
            !((c.call == "allreduce" || c.call == "reduce_") && c.op != ReduceOp::kSum);
        if (differentiable) {
          const std::string b = check_backward(comm, k, dtype, c.seed, c.unused);
          v.expect(b.empty(), b);
          if (dtype == at::kDouble) {
            const std::string a = check_adjoint(comm, k, c.seed);
            // An all-empty case has nothing to check: not a failure.
            v.expect(a.empty() || a.find("every norm is zero") != std::string::npos, a);
          }
        }
        ++seen[c.call + (differentiable ? " (fwd+bwd)" : " (fwd)")];
        if (differentiable && !c.unused.empty()) ++seen["some outputs unused"];
      });
  if (mpi::world_rank() == 0) {
    std::cout << "  rank 0 saw:";
    for (const auto& [k, n] : seen) std::cout << " " << k << " " << n << ";";
    std::cout << std::endl;
  }
  EXPECT_TRUE(ok);
}

}  // namespace
}  // namespace partita::testing::comm
