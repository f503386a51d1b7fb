// The safetensors container, as its authors publish it: an 8-byte
// little-endian header length N, N bytes of JSON (an object mapping each
// tensor's name to {"dtype", "shape", "data_offsets": [begin, end]}, and an
// optional "__metadata__" object of strings), then the data: each tensor
// C-order, little-endian, at [8 + N + begin, 8 + N + end), the tensors'
// ranges contiguous from 0 to the end of the file. partita's checkpoints
// (docs/checkpoints.md) are one such file of global tensors.
//
// No LibTorch here: the reader is a pure function of bytes (its own fuzz
// target) and dtypes are safetensors' names ("F64", "BF16", ...).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "partita/shape.hpp"

namespace partita::safetensors {

struct Entry {
  std::string name;
  std::string dtype;  // safetensors' name: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL
  Shape shape;
  int64_t begin = 0, end = 0;  // byte range in the data section
};

struct Header {
  std::vector<Entry> tensors;                  // in the order of their data
  std::map<std::string, std::string> metadata; // "__metadata__"
  int64_t data_start = 0;                      // 8 + N: where the data section begins
};

// Bytes per element of a safetensors dtype; 0 for a name it does not know.
int64_t dtype_size(const std::string& dtype);

// The largest header partita reads (safetensors' own readers refuse more
// than 100 MB).
inline constexpr int64_t kMaxHeaderBytes = 100'000'000;

// Reads the header length from the first 8 bytes of a file of `file_size`
// bytes. Throws partita::Error naming `source` when the file is shorter
// than 8 bytes or the length is 0, above kMaxHeaderBytes, or past the end
// of the file.
int64_t header_length(const std::string& first8, int64_t file_size, const std::string& source);

// Parses and checks the JSON header (the N bytes after the length) of a
// file of `file_size` bytes. Throws partita::Error naming `source` and the
// first problem: not JSON or not an object; an entry that is not an object
// of exactly dtype, shape and data_offsets; an unknown dtype; a negative
// extent; offsets that are not two integers with begin <= end; a byte
// range that does not equal the shape's volume times the dtype's size;
// ranges that overlap, leave a gap, or do not end at the end of the file;
// metadata that is not an object of strings.
Header parse_header(const std::string& json, int64_t file_size, const std::string& source);

// The file's first bytes for `tensors` laid out in the given order, each
// range right after the previous one (begin and end are filled in): the
// length, then the JSON padded with spaces to a multiple of 8 bytes, so
// the data section starts 8-byte aligned.
std::string format_header(std::vector<Entry>& tensors, const std::map<std::string, std::string>& metadata);

}  // namespace partita::safetensors
