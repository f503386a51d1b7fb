#include "partita/mpi/buffer_cache.hpp"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "partita/errors.hpp"
#include "env_number.hpp"

namespace partita::mpi {

namespace {

constexpr size_t kAlignment = 64;       // LibTorch's CPU alignment
// Sizes are rounded up to 4 KiB below 1 MiB, to 64 KiB above.
size_t rounded(size_t n) {
  const size_t g = n < (size_t{1} << 20) ? size_t{4} << 10 : size_t{64} << 10;
  return (n + g - 1) / g * g;
}

// The cache's blocks carry their own address as context (LibTorch's raw
// interface, raw_allocate/raw_deallocate, which some CPU kernels use for
// scratch memory, requires context == data), so the deleters are plain
// functions that find the one allocator through this pointer.
class CachingAllocator;
CachingAllocator* g_cache = nullptr;  // installed once, never destroyed

class CachingAllocator final : public c10::Allocator {
 public:
  explicit CachingAllocator(c10::Allocator* fallback)
      : fallback_(fallback), fallback_raw_deleter_(fallback->raw_deleter()) {}

  // Blocks below min_bytes come from the fallback with its deleter; the raw
  // deleter tells the two apart by the cache's record of its live blocks.
  c10::DeleterFnPtr raw_deleter() const override { return &raw_release; }

  c10::DataPtr allocate(size_t n) const override {
    if (n < min_bytes_ || capacity_ == 0) return fallback_->allocate(n);
    const size_t size = rounded(n);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        const auto held = it->second.back();  // the newest block of this size
        it->second.pop_back();
        p = held->p;
        oldest_first_.erase(held);
        cached_ -= size;
        ++hits_;
      } else {
        ++misses_;
      }
    }
    if (!p) p = std::aligned_alloc(kAlignment, size);
    if (!p) throw Error("partita buffer cache: out of memory allocating " + std::to_string(size) + " bytes");
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_[p] = size;
    }
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }

  void configure(size_t capacity, size_t min_bytes) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      capacity_ = capacity;
      min_bytes_ = min_bytes;
      trim(drop);
    }
    for (void* p : drop) std::free(p);
  }

  BufferCacheStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    BufferCacheStats s;
    s.enabled = capacity_ > 0;
    s.capacity_bytes = capacity_;
    s.min_bytes = min_bytes_;
    s.cached_bytes = cached_;
    s.hits = hits_;
    s.misses = misses_;
    return s;
  }

 private:
  // The deleter of the cache's own blocks.
  static void release(void* p) {
    size_t size = 0;
    {
      std::lock_guard<std::mutex> lock(g_cache->mutex_);
      auto it = g_cache->live_.find(p);
      size = it->second;
      g_cache->live_.erase(it);
    }
    g_cache->put(p, size);
  }

  // raw_deallocate: a block of the cache's, or one the fallback allocated.
  static void raw_release(void* p) {
    bool ours = false;
    {
      std::lock_guard<std::mutex> lock(g_cache->mutex_);
      ours = g_cache->live_.count(p) != 0;
    }
    if (ours) {
      release(p);
    } else {
      TORCH_CHECK(g_cache->fallback_raw_deleter_, "partita buffer cache: LibTorch's CPU allocator has no raw deleter");
      g_cache->fallback_raw_deleter_(p);
    }
  }

  // A freed block is kept when it fits the capacity at all; the blocks held
  // longest make room for it, so that the cache follows the sizes in use now
  // rather than filling up once with sizes no longer asked for.
  void put(void* p, size_t size) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (size <= capacity_) {
        cached_ += size;
        trim(drop);
        free_[size].push_back(oldest_first_.insert(oldest_first_.end(), Held{p, size}));
      } else {
        drop.push_back(p);
      }
    }
    for (void* q : drop) std::free(q);
  }

  // Frees the blocks held longest until the cache fits its capacity.
  void trim(std::vector<void*>& drop) {
    while (cached_ > capacity_ && !oldest_first_.empty()) {
      const Held old = oldest_first_.front();
      auto& same = free_[old.size];  // its oldest entry is `old`: both lists keep the order of arrival
      same.pop_front();
      oldest_first_.pop_front();
      cached_ -= old.size;
      drop.push_back(old.p);
    }
  }

  struct Held {
    void* p;
    size_t size;
  };

  c10::Allocator* fallback_;
  c10::DeleterFnPtr fallback_raw_deleter_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, size_t> live_;  // the cache's blocks in use, by address
  mutable std::list<Held> oldest_first_;  // every held block, in the order it was freed
  mutable std::map<size_t, std::deque<std::list<Held>::iterator>> free_;  // by size, oldest first
  mutable size_t cached_ = 0;
  mutable long hits_ = 0, misses_ = 0;
  size_t capacity_ = 0, min_bytes_ = size_t{1} << 20;
};

std::mutex g_install;

}  // namespace

void enable_buffer_cache(size_t capacity_bytes, size_t min_bytes) {
  std::lock_guard<std::mutex> lock(g_install);
  if (!g_cache) {
    if (capacity_bytes == 0) return;
    g_cache = new CachingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(g_cache, /*priority=*/1);
  }
  g_cache->configure(capacity_bytes, min_bytes);
}

BufferCacheStats buffer_cache_stats() {
  std::lock_guard<std::mutex> lock(g_install);
  return g_cache ? g_cache->stats() : BufferCacheStats{};
}

namespace detail {
double number_from_environment(const char* name, double otherwise) {
  const char* v = std::getenv(name);
  if (!v || !*v) return otherwise;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (*end != '\0' || !(x >= 0) || x > 1e15)
    throw Error(std::string(name) + ": expected a non-negative number (at most 1e15), got \"" + v + "\"");
  return x;
}
}  // namespace detail

namespace {
std::atomic<size_t> g_output_reuse_limit{kDefaultOutputReuseBytes};
}  // namespace
void set_output_reuse_limit(size_t bytes) { g_output_reuse_limit.store(bytes, std::memory_order_relaxed); }
size_t output_reuse_limit() { return g_output_reuse_limit.load(std::memory_order_relaxed); }

namespace {
// A byte count from a number of units, at most 2^62 bytes (1e15 MiB is
// about 1e21 bytes, past size_t: converting it was undefined, and on
// x86-64 gave 0, which turns the cache off).
size_t bytes_of(double units, double unit_bytes) {
  return static_cast<size_t>(std::min(units * unit_bytes, 4611686018427387904.0));
}
}  // namespace

void buffer_cache_from_environment() {
  const double reuse = detail::number_from_environment("PARTITA_OUTPUT_REUSE_BYTES", double(kDefaultOutputReuseBytes));
  const double mib = detail::number_from_environment("PARTITA_BUFFER_CACHE_MIB", double(kDefaultBufferCacheMiB));
  const double min_kib = detail::number_from_environment("PARTITA_BUFFER_CACHE_MIN_KIB", 1024);
  // 0 turns it off: nothing is installed when it was not (LibTorch keeps its
  // own allocator), and one installed before stops holding blocks.
  enable_buffer_cache(bytes_of(mib, 1 << 20), bytes_of(min_kib, 1024));
  set_output_reuse_limit(bytes_of(reuse, 1));
}

}  // namespace partita::mpi
