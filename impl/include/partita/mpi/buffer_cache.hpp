// Reuse of large CPU buffers (docs/mpi-runtime.md, "Buffer cache").
//
// Every partita call returns new tensors, and LibTorch's CPU allocator takes
// large blocks from glibc, which maps blocks above its threshold (at most
// 32 MiB, whatever the tunables) freshly each time: a call on 64 MiB then
// pays ~16k page faults and the zeroing of every page, which a hand-written
// MPI loop on preallocated buffers does not. The buffer cache is a CPU
// allocator for LibTorch that keeps freed blocks of at least `min_bytes` (up
// to `capacity_bytes` in all) and hands them out again for the same rounded
// size; when a freed block does not fit, the blocks held longest make room.
// On by default since partita::mpi::Environment starts it (512 MiB, blocks
// of 1 MiB and up); PARTITA_BUFFER_CACHE_MIB=N sets the capacity, 0 leaves
// LibTorch's own allocator in place; enable_buffer_cache() in code.
//
// Reused memory is not zeroed (at::empty never promised zeros; glibc's
// reused heap memory is not zeroed either): code that reads an at::empty
// tensor before writing it sees old data instead of fresh pages' zeros
// (ctest runs the primitive properties with the cache on for every block
// for that reason).
#pragma once

#include <cstddef>

namespace partita::mpi {

struct BufferCacheStats {
  bool enabled = false;
  size_t capacity_bytes = 0, min_bytes = 0;
  size_t cached_bytes = 0;  // held for reuse now
  long hits = 0, misses = 0;  // large allocations served from the cache / not
};

// Installs the cache as LibTorch's CPU allocator (or changes its limits when
// it is installed). Tensors allocated before keep their own deleters.
// capacity 0 turns reuse off (held blocks are freed; the allocator stays).
void enable_buffer_cache(size_t capacity_bytes, size_t min_bytes = size_t{1} << 20);
BufferCacheStats buffer_cache_stats();

inline constexpr size_t kDefaultBufferCacheMiB = 512;

// Output reuse (docs/output-reuse.md): a primitive's layer keeps the last
// output it returned without an autograd node, of at most this many bytes,
// and its next call writes into that tensor again when the caller dropped
// it and nothing else (a view, a weak reference, a saved copy) can reach it;
// otherwise it allocates a fresh one. 0 turns reuse off (kept outputs are
// released at the layers' next calls).
inline constexpr size_t kDefaultOutputReuseBytes = size_t{64} << 10;
void set_output_reuse_limit(size_t bytes);
size_t output_reuse_limit();

// enable_buffer_cache(N MiB) with N from PARTITA_BUFFER_CACHE_MIB (default
// kDefaultBufferCacheMiB; 0: off, and not installed if it was not), blocks of at least
// PARTITA_BUFFER_CACHE_MIN_KIB (default 1024) KiB, and set_output_reuse_limit
// from PARTITA_OUTPUT_REUSE_BYTES (default kDefaultOutputReuseBytes). Called
// by Environment; throws partita::Error on a value that is not a
// non-negative number of at most 1e15 (nan and inf included).
void buffer_cache_from_environment();

}  // namespace partita::mpi
