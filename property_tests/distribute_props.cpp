// Lockstep properties of partita::distribute and partita::gather against
// the reference: random teams drawn from the world (so some ranks are not
// workers), Cartesian grids of 1-3 dimensions on tensors of as many or more
// dimensions, extents from 0 (empty pieces) to 7 (uneven pieces), three
// dtypes; gather also of tilings that are not the balanced one, and of
// pieces that tile nothing.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <numeric>
#include <ostream>
#include <sstream>

#include "partita/distribute.hpp"
#include "partita/errors.hpp"
#include "partita/mpi/partition.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/reference/distribute.hpp"
#include "partita/reference/partition.hpp"
#include "partita/testing/lockstep.hpp"

namespace partita::testing {
namespace {

struct DistributeCase {
  int world = 1;
  Ranks workers;  // P's team, in partition-rank order
  Shape grid;     // P's shape
  Shape global;   // the tensor's shape (as many dimensions as grid, or more)
  int dtype = 0;  // 0 float64, 1 float32, 2 int64
  // gather's own tiling: per tensor dimension, the extent of each slab of
  // the (padded) grid; empty: the balanced one.
  std::vector<std::vector<int64_t>> slabs;
  int bad = -1;  // a worker (partition rank) whose piece gets one more row
};

std::ostream& operator<<(std::ostream& os, const DistributeCase& c) {
  os << "world " << c.world << " workers " << list_string(c.workers) << " grid " << shape_string(c.grid)
     << " global " << shape_string(c.global) << " dtype " << c.dtype;
  if (!c.slabs.empty()) {
    os << " slabs";
    for (const auto& s : c.slabs) os << " [" << list_string(s) << "]";
  }
  if (c.bad >= 0) os << " bad " << c.bad;
  return os;
}

rc::Gen<DistributeCase> gen_case(int world, bool tilings) {
  return rc::gen::exec([world, tilings] {
    DistributeCase c;
    c.world = world;
    Ranks all(world);
    std::iota(all.begin(), all.end(), 0);
    for (int i = world - 1; i > 0; --i) std::swap(all[i], all[*rc::gen::inRange(0, i + 1)]);
    const int k = *rc::gen::inRange(1, world + 1);
    c.workers.assign(all.begin(), all.begin() + k);
    const int dims = *rc::gen::inRange(1, 4);
    int left = k;
    for (int d = 0; d + 1 < dims; ++d) {
      std::vector<int> divisors;
      for (int f = 1; f <= left; ++f)
        if (left % f == 0) divisors.push_back(f);
      const int f = divisors[*rc::gen::inRange<size_t>(0, divisors.size())];
      c.grid.push_back(f);
      left /= f;
    }
    c.grid.push_back(left);
    const int tensor_dims = *rc::gen::inRange(dims, 4);
    for (int d = 0; d < tensor_dims; ++d) c.global.push_back(*rc::gen::inRange(0, 8));
    c.dtype = *rc::gen::inRange(0, 3);
    if (tilings) {
      const Shape padded = [&] {
        Shape g(tensor_dims - dims, 1);
        g.insert(g.end(), c.grid.begin(), c.grid.end());
        return g;
      }();
      for (int d = 0; d < tensor_dims; ++d) {
        std::vector<int64_t> s;
        for (int64_t i = 0; i < padded[d]; ++i) s.push_back(*rc::gen::inRange(0, 5));
        c.global[d] = std::accumulate(s.begin(), s.end(), int64_t{0});
        c.slabs.push_back(s);
      }
      // A worker's piece one row longer than its slab's: refused, unless
      // the worker is alone in its slab of dimension 0 (then it tiles).
      if (k / padded[0] > 1 && *rc::gen::inRange(0, 4) == 0) c.bad = *rc::gen::inRange(0, k);
    }
    return c;
  });
}

at::Tensor global_tensor(const DistributeCase& c) {
  const auto dtype = c.dtype == 0 ? at::kDouble : c.dtype == 1 ? at::kFloat : at::kLong;
  const int64_t n = volume(c.global);
  return (at::arange(n, at::kDouble) * 3 - 7).reshape(c.global).to(dtype);
}

mpi::Partition mpi_partition(const DistributeCase& c) {
  return mpi::Partition::world().create_partition_inclusive(c.workers).create_cartesian_topology_partition(c.grid);
}

reference::Partition reference_partition(const DistributeCase& c) {
  return reference::Partition::world(c.world)
      .create_partition_inclusive(c.workers)
      .create_cartesian_topology_partition(c.grid);
}

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::ostringstream os;
  os << c10::toString(t.scalar_type()) << " " << t.sizes() << " [";
  const at::Tensor flat = t.reshape(-1).to(at::kDouble);
  for (int64_t i = 0; i < std::min<int64_t>(flat.numel(), 6); ++i) os << (i ? " " : "") << flat[i].item<double>();
  os << (flat.numel() > 6 ? " ...]" : "]");
  return os.str();
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         at::equal(a, b);
}

// distribute gives this rank the reference's piece; gather of the pieces
// gives the global tensor back on every worker, nothing elsewhere.
TEST(DistributeProperty, DistributeMatchesReferenceAndGatherInverts) {
  torch::set_num_threads(1);
  EXPECT_TRUE(check_lockstep<DistributeCase>(
      "distribute and gather", gen_case(mpi::world_size(), false), [](const DistributeCase& c, Verdict& v) {
        const int me = mpi::world_rank();
        const at::Tensor global = global_tensor(c);
        const mpi::Partition P = mpi_partition(c);
        const at::Tensor piece = distribute(global, P);
        const at::Tensor expected = reference::distribute(reference_partition(c), global)[me];
        v.expect(same(piece, expected), "distribute gave " + describe(piece) + ", the reference " + describe(expected));
        v.expect(!piece.defined() || piece.data_ptr() != global.data_ptr() || piece.numel() == 0,
                 "distribute returned a view of the global tensor");
        const at::Tensor back = gather(piece, P);
        if (P.active())
          v.expect(same(back, global), "gather gave " + describe(back) + ", not the global " + describe(global));
        else
          v.expect(!back.defined(), "gather on a rank outside P gave " + describe(back));
      }));
}

// gather of pieces that tile the tensor in another way than the balanced
// decomposition (any extents per slab, zeros included); pieces that tile
// nothing raise ShapeError on every worker of P.
TEST(DistributeProperty, GatherAnyTilingAndRefuseBadPieces) {
  torch::set_num_threads(1);
  EXPECT_TRUE(check_lockstep<DistributeCase>(
      "gather of any tiling", gen_case(mpi::world_size(), true), [](const DistributeCase& c, Verdict& v) {
        const at::Tensor global = global_tensor(c);
        const mpi::Partition P = mpi_partition(c);
        Shape grid;  // P's grid read with leading ones, one entry per tensor dimension
        for (const auto& s : c.slabs) grid.push_back(static_cast<int64_t>(s.size()));
        at::Tensor piece;
        if (P.active()) {
          const Index place = unravel(P.rank(), grid);
          piece = global;
          for (size_t d = 0; d < grid.size(); ++d) {
            int64_t start = 0;
            for (int64_t i = 0; i < place[d]; ++i) start += c.slabs[d][i];
            piece = piece.narrow(static_cast<int64_t>(d), start, c.slabs[d][place[d]]);
          }
          piece = piece.clone();
          if (P.rank() == c.bad) {  // one more row than its slab's other pieces
            auto sizes = piece.sizes().vec();
            sizes[0] += 1;
            piece = at::zeros(sizes, piece.options());
          }
        }
        if (c.bad >= 0) {
          if (!P.active()) {
            v.expect(!gather(piece, P).defined(), "gather on a rank outside P gave a tensor");
            return;
          }
          std::string error;
          try {
            gather(piece, P);
          } catch (const ShapeError& e) {
            error = e.what();
          }
          v.expect(!error.empty(), "gather took pieces that do not tile a tensor");
          return;
        }
        const at::Tensor back = gather(piece, P);
        if (P.active())
          v.expect(same(back, global), "gather gave " + describe(back) + ", not the global " + describe(global));
        else
          v.expect(!back.defined(), "gather on a rank outside P gave " + describe(back));
      }));
}

}  // namespace
}  // namespace partita::testing
