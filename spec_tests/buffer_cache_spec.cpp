// The buffer cache (partita/mpi/buffer_cache.hpp): large CPU blocks freed by
// LibTorch come back for the next allocation of the same rounded size, small
// ones never enter it, the capacity bounds what it holds, and turning it off
// frees what it held. One process, no MPI needed.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "partita/mpi/buffer_cache.hpp"

namespace partita::spec {
namespace {

TEST(BufferCache, ReusesLargeBlocksWithinItsCapacity) {
  mpi::enable_buffer_cache(size_t{64} << 20);  // 64 MiB, blocks of 1 MiB and up
  const auto before = mpi::buffer_cache_stats();
  ASSERT_TRUE(before.enabled);

  void* first = nullptr;
  {
    at::Tensor a = at::empty({4 << 20}, at::kFloat);  // 16 MiB
    first = a.data_ptr();
    a.fill_(3);
  }
  const auto held = mpi::buffer_cache_stats();
  EXPECT_EQ(held.cached_bytes, before.cached_bytes + (size_t{16} << 20));

  // The same size again: the same block, not yet zeroed or otherwise touched.
  at::Tensor b = at::empty({4 << 20}, at::kFloat);
  EXPECT_EQ(b.data_ptr(), first);
  EXPECT_EQ(b[0].item<float>(), 3.0f);
  EXPECT_EQ(mpi::buffer_cache_stats().hits, before.hits + 1);
  // A size that rounds to another granule is a miss.
  at::Tensor c = at::empty({(4 << 20) + (1 << 16)}, at::kFloat);
  EXPECT_NE(c.data_ptr(), first);
  EXPECT_EQ(mpi::buffer_cache_stats().misses, held.misses + 1);

  // Small blocks do not go through the cache.
  const auto small_before = mpi::buffer_cache_stats();
  { at::Tensor s = at::empty({1000}, at::kFloat); }
  EXPECT_EQ(mpi::buffer_cache_stats().hits + mpi::buffer_cache_stats().misses,
            small_before.hits + small_before.misses);

  // Freed beyond the capacity: 5 x 16 MiB with 64 MiB of room keeps 4.
  {
    std::vector<at::Tensor> many;
    for (int i = 0; i < 5; ++i) many.push_back(at::empty({4 << 20}, at::kFloat));
    b = at::Tensor();
    c = at::Tensor();
  }
  EXPECT_LE(mpi::buffer_cache_stats().cached_bytes, size_t{64} << 20);
  EXPECT_GE(mpi::buffer_cache_stats().cached_bytes, size_t{48} << 20);

  // Off: what it held is freed, and new allocations bypass it.
  mpi::enable_buffer_cache(0);
  const auto off = mpi::buffer_cache_stats();
  EXPECT_FALSE(off.enabled);
  EXPECT_EQ(off.cached_bytes, 0u);
  { at::Tensor d = at::empty({4 << 20}, at::kFloat); }
  EXPECT_EQ(mpi::buffer_cache_stats().misses, off.misses);
  EXPECT_EQ(mpi::buffer_cache_stats().cached_bytes, 0u);
}

}  // namespace
}  // namespace partita::spec
