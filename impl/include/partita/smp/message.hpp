// The message format of partita::smp (docs/smp.md): encoding and the
// decoder for untrusted bytes. No MPI here, so the decoder builds on its own
// under libFuzzer (fuzz/).
//
// A frame is a 32-byte header and a payload, all integers little-endian:
//
//   offset  size  field
//   0       4     magic "PSMP"
//   4       2     version (1)
//   6       2     kind: 1 IValue, 2 plain (trivially copyable), 3 string, 4 error
//   8       8     payload length in bytes
//   16      8     type tag: FNV-1a of the plain type's name and size, else 0
//   24      8     checksum: FNV-1a 64 of bytes 0-23 and the payload
//
// Payloads:
//   IValue  u64 pickle length, the pickle (torch::jit::pickle with a tensor
//           table), u64 tensor count, then per tensor: u8 dtype code,
//           u8 requires_grad, u8 ndim, ndim x i64 sizes, u64 byte count, the
//           bytes (contiguous, row-major)
//   plain   u16 type-name length, the type name (mangled), the value's bytes
//   string  the bytes
//   error   the sender's error text (it could not encode its object)
//
// Every decode checks the whole frame before using any of it and throws
// MessageError (partita/smp.hpp) naming what is wrong.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

namespace c10 {
struct IValue;
}

namespace partita::smp::message {

enum class Kind : uint16_t { IValue = 1, Plain = 2, String = 3, Error = 4 };
const char* kind_name(uint16_t kind);

inline constexpr std::size_t kHeaderSize = 32;
inline constexpr uint16_t kVersion = 1;
// MPI counts are int: no frame may be longer.
inline constexpr std::size_t kMaxFrame = 0x7fffffff;

uint64_t fnv1a(const void* data, std::size_t n, uint64_t h = 0xcbf29ce484222325ull);

// Builds a frame; throws MessageError if the payload is too long.
std::string frame(Kind kind, uint64_t type_tag, const std::string& payload);

// Checks the header, length and checksum; returns the payload. Throws
// MessageError for truncated, corrupted or unknown frames, and for error
// frames (with the sender's text).
struct Checked {
  Kind kind;
  uint64_t type_tag;
  const char* payload;
  std::size_t length;
};
Checked check(const char* data, std::size_t n);

// IValues: encode throws MessageError for what cannot be sent (objects,
// futures, non-CPU or non-dense tensors, ...).
std::string encode_ivalue(const c10::IValue& value);
c10::IValue decode_ivalue(const char* data, std::size_t n);

// The payload of an IValue frame alone (what follows a valid header):
// exposed so the fuzzer reaches the pickle and tensor decoding past the
// checksum.
c10::IValue decode_ivalue_payload(const char* payload, std::size_t length);

std::string error_frame(const std::string& text);

// MPI counts bytes in an int: a frame of more than INT_MAX bytes cannot
// travel as one message.
inline constexpr std::size_t kOneMessageLimit = INT_MAX;

// Says why a frame of `bytes` cannot travel as one message (empty when it
// fits). `limit` is MPI's; tests pass others.
std::string too_large_for_one_message(std::size_t bytes, std::size_t limit = kOneMessageLimit);

// What a sender posts for `frame`: the frame itself when it fits in one
// message; otherwise an error frame, so that every receiver raises as for
// an object that cannot be encoded before anything larger is posted, and
// `error` (empty when the frame fits) for the sender to raise with. Both
// say `context` (e.g. "the last stage's returned values: ") before why.
struct OneMessage {
  std::string frame;
  std::string error;
};
OneMessage one_message(std::string frame, const std::string& context = {},
                       std::size_t limit = kOneMessageLimit);

}  // namespace partita::smp::message
