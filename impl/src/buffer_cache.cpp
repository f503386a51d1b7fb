#include "partita/mpi/buffer_cache.hpp"

#include <c10/core/CPUAllocator.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "partita/errors.hpp"

namespace partita::mpi {

namespace {

constexpr size_t kAlignment = 64;       // LibTorch's CPU alignment
// Sizes are rounded up to 4 KiB below 1 MiB, to 64 KiB above.
size_t rounded(size_t n) {
  const size_t g = n < (size_t{1} << 20) ? size_t{4} << 10 : size_t{64} << 10;
  return (n + g - 1) / g * g;
}

class CachingAllocator final : public c10::Allocator {
 public:
  explicit CachingAllocator(c10::Allocator* fallback) : fallback_(fallback) {}

  c10::DataPtr allocate(size_t n) const override {
    if (n < min_bytes_ || capacity_ == 0) return fallback_->allocate(n);
    const size_t size = rounded(n);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_ -= size;
        ++hits_;
      } else {
        ++misses_;
      }
    }
    if (!p) p = std::aligned_alloc(kAlignment, size);
    if (!p) throw Error("partita buffer cache: out of memory allocating " + std::to_string(size) + " bytes");
    return {p, new Block{p, size, this}, &release, c10::Device(c10::DeviceType::CPU)};
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
  struct Block {
    void* p;
    size_t size;
    const CachingAllocator* owner;
  };

  static void release(void* ctx) {
    auto* b = static_cast<Block*>(ctx);
    const_cast<CachingAllocator*>(b->owner)->put(b->p, b->size);
    delete b;
  }

  void put(void* p, size_t size) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_ + size <= capacity_) {
        free_[size].push_back(p);
        cached_ += size;
        return;
      }
    }
    std::free(p);
  }

  // Frees held blocks, largest first, until the cache fits its capacity.
  void trim(std::vector<void*>& drop) {
    for (auto it = free_.rbegin(); it != free_.rend() && cached_ > capacity_; ++it)
      while (!it->second.empty() && cached_ > capacity_) {
        drop.push_back(it->second.back());
        it->second.pop_back();
        cached_ -= it->first;
      }
  }

  c10::Allocator* fallback_;
  mutable std::mutex mutex_;
  mutable std::map<size_t, std::vector<void*>> free_;
  mutable size_t cached_ = 0;
  mutable long hits_ = 0, misses_ = 0;
  size_t capacity_ = 0, min_bytes_ = size_t{1} << 20;
};

CachingAllocator* g_cache = nullptr;  // installed once, never destroyed
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

namespace {
// A non-negative number from the environment, or `otherwise` when unset.
double number_from_environment(const char* name, double otherwise) {
  const char* v = std::getenv(name);
  if (!v || !*v) return otherwise;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (*end != '\0' || x < 0)
    throw Error(std::string(name) + ": expected a non-negative number, got \"" + v + "\"");
  return x;
}
}  // namespace

void buffer_cache_from_environment() {
  const double mib = number_from_environment("PARTITA_BUFFER_CACHE_MIB", 0);
  const double min_kib = number_from_environment("PARTITA_BUFFER_CACHE_MIN_KIB", 1024);
  if (mib > 0) enable_buffer_cache(static_cast<size_t>(mib * (1 << 20)), static_cast<size_t>(min_kib * 1024));
}

}  // namespace partita::mpi
