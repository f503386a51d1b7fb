// The buffer cache (partita/mpi/buffer_cache.hpp): large CPU blocks freed by
// LibTorch come back for the next allocation of the same rounded size, small
// ones never enter it, the capacity bounds what it holds (the blocks held
// longest make room), turning it off frees what it held, and the environment
// variables set it (on by default). One process, no MPI needed.
#include <gtest/gtest.h>

#include <cstdlib>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include <cmath>

#include "partita/errors.hpp"
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

TEST(BufferCache, TheBlocksHeldLongestMakeRoom) {
  mpi::enable_buffer_cache(0);  // start empty
  mpi::enable_buffer_cache(size_t{64} << 20);
  std::vector<void*> order;  // the 16 MiB blocks, in the order they are freed
  {
    std::vector<at::Tensor> four;
    for (int i = 0; i < 4; ++i) four.push_back(at::empty({4 << 20}, at::kFloat));
    for (auto& t : four) {
      order.push_back(t.data_ptr());
      t = at::Tensor();
    }
  }
  ASSERT_EQ(mpi::buffer_cache_stats().cached_bytes, size_t{64} << 20);
  // A freed 32 MiB block evicts the two oldest 16 MiB ones, not the newest.
  void* big = nullptr;
  {
    at::Tensor t = at::empty({8 << 20}, at::kFloat);
    big = t.data_ptr();
  }
  EXPECT_EQ(mpi::buffer_cache_stats().cached_bytes, size_t{64} << 20);
  at::Tensor again = at::empty({8 << 20}, at::kFloat);
  EXPECT_EQ(again.data_ptr(), big);
  // The 16 MiB blocks left are the two freed last, newest first.
  at::Tensor a = at::empty({4 << 20}, at::kFloat);
  at::Tensor b = at::empty({4 << 20}, at::kFloat);
  EXPECT_EQ(a.data_ptr(), order[3]);
  EXPECT_EQ(b.data_ptr(), order[2]);
  const long misses = mpi::buffer_cache_stats().misses;
  at::Tensor c = at::empty({4 << 20}, at::kFloat);
  EXPECT_EQ(mpi::buffer_cache_stats().misses, misses + 1);
  EXPECT_EQ(mpi::buffer_cache_stats().cached_bytes, 0u);
  // A block larger than the capacity is never held.
  { at::Tensor huge = at::empty({20 << 20}, at::kFloat); }
  EXPECT_EQ(mpi::buffer_cache_stats().cached_bytes, 0u);
  mpi::enable_buffer_cache(0);
}

// Sizes that are not a multiple of the granule (4 KiB below 1 MiB, 64 KiB
// above) are held as the rounded block: freed, they count its rounded bytes
// and come back for any size that rounds to it, raw or through a tensor.
TEST(BufferCache, SizesBetweenGranulesShareTheRoundedBlock) {
  mpi::enable_buffer_cache(0);
  mpi::enable_buffer_cache(size_t{64} << 20, size_t{64} << 10);  // blocks of 64 KiB and up
  c10::Allocator* cpu = c10::GetCPUAllocator();
  const size_t large = (size_t{3} << 20) + 12345;                   // rounds up to 3 MiB + 64 KiB
  const size_t large_rounded = (size_t{3} << 20) + (size_t{64} << 10);
  void* p = cpu->raw_allocate(large);
  cpu->raw_deallocate(p);
  EXPECT_EQ(mpi::buffer_cache_stats().cached_bytes, large_rounded);
  const long hits = mpi::buffer_cache_stats().hits;
  void* q = cpu->raw_allocate(large_rounded - 7);  // another size, same rounded block
  EXPECT_EQ(q, p);
  EXPECT_EQ(mpi::buffer_cache_stats().hits, hits + 1);
  EXPECT_EQ(mpi::buffer_cache_stats().cached_bytes, 0u);
  cpu->raw_deallocate(q);
  // Below 1 MiB the granule is 4 KiB: 100,001 floats (400,004 bytes) round
  // to 401,408 bytes, which 100,100 floats (400,400 bytes) share.
  void* t_data = nullptr;
  { at::Tensor t = at::empty({100001}, at::kFloat); t_data = t.data_ptr(); }
  EXPECT_EQ(mpi::buffer_cache_stats().cached_bytes, large_rounded + 401408);
  at::Tensor u = at::empty({100100}, at::kFloat);
  EXPECT_EQ(u.data_ptr(), t_data);
  EXPECT_EQ(mpi::buffer_cache_stats().cached_bytes, large_rounded);
  mpi::enable_buffer_cache(0);
}

// LibTorch's raw interface (raw_allocate/raw_deallocate, used by some CPU
// kernels for scratch memory, e.g. GELU's) works for blocks of the cache's and
// for the small ones it leaves to LibTorch's own allocator.
TEST(BufferCache, RawAllocationsOfEitherKind) {
  mpi::enable_buffer_cache(0);
  mpi::enable_buffer_cache(size_t{64} << 20);
  c10::Allocator* cpu = c10::GetCPUAllocator();
  ASSERT_NE(cpu->raw_deleter(), nullptr);
  void* large = cpu->raw_allocate(size_t{2} << 20);
  static_cast<char*>(large)[0] = 1;
  cpu->raw_deallocate(large);
  EXPECT_EQ(mpi::buffer_cache_stats().cached_bytes, size_t{2} << 20);
  void* again = cpu->raw_allocate(size_t{2} << 20);
  EXPECT_EQ(again, large);
  cpu->raw_deallocate(again);
  void* small = cpu->raw_allocate(1000);
  static_cast<char*>(small)[999] = 1;
  cpu->raw_deallocate(small);
  EXPECT_EQ(mpi::buffer_cache_stats().cached_bytes, size_t{2} << 20);
  // And through a kernel that takes scratch memory this way.
  const at::Tensor x = at::randn({16, 32}, at::kDouble);
  EXPECT_TRUE(at::allclose(at::gelu(x), 0.5 * x * (1 + at::erf(x / std::sqrt(2.0)))));
  mpi::enable_buffer_cache(0);
}

TEST(BufferCache, SetFromTheEnvironmentOnByDefault) {
  ::unsetenv("PARTITA_BUFFER_CACHE_MIB");
  ::unsetenv("PARTITA_BUFFER_CACHE_MIN_KIB");
  mpi::buffer_cache_from_environment();
  auto s = mpi::buffer_cache_stats();
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.capacity_bytes, mpi::kDefaultBufferCacheMiB << 20);
  EXPECT_EQ(s.capacity_bytes, size_t{512} << 20);
  EXPECT_EQ(s.min_bytes, size_t{1} << 20);

  ::setenv("PARTITA_BUFFER_CACHE_MIB", "64", 1);
  ::setenv("PARTITA_BUFFER_CACHE_MIN_KIB", "256", 1);
  mpi::buffer_cache_from_environment();
  s = mpi::buffer_cache_stats();
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.capacity_bytes, size_t{64} << 20);
  EXPECT_EQ(s.min_bytes, size_t{256} << 10);

  ::setenv("PARTITA_BUFFER_CACHE_MIB", "0", 1);
  mpi::buffer_cache_from_environment();
  EXPECT_FALSE(mpi::buffer_cache_stats().enabled);
  EXPECT_EQ(mpi::buffer_cache_stats().cached_bytes, 0u);

  // The largest value taken (1e15 MiB, past size_t in bytes): the cache
  // holds its most (2^62 bytes), not nothing.
  ::setenv("PARTITA_BUFFER_CACHE_MIB", "1e15", 1);
  mpi::buffer_cache_from_environment();
  EXPECT_TRUE(mpi::buffer_cache_stats().enabled);
  EXPECT_EQ(mpi::buffer_cache_stats().capacity_bytes, size_t{1} << 62);

  ::setenv("PARTITA_BUFFER_CACHE_MIB", "lots", 1);
  EXPECT_THROW(mpi::buffer_cache_from_environment(), Error);
  ::unsetenv("PARTITA_BUFFER_CACHE_MIB");
  ::unsetenv("PARTITA_BUFFER_CACHE_MIN_KIB");
}

}  // namespace
}  // namespace partita::spec
