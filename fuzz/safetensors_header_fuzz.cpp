// libFuzzer target: the safetensors header reader that partita's checkpoint
// loads go through (common/src/safetensors.cpp), on arbitrary bytes taken
// as the first bytes of a file of some size. Its promise
// (partita/safetensors.hpp): anything that is not a valid header raises
// partita::Error. Any other exception, a crash or a sanitizer report is a
// finding; so is a broken property of what it accepts:
//  - the tensors' ranges tile the data section from 0 to the end of the
//    file, in order, each the size of its shape times its dtype;
//  - format_header() of the accepted tensors reads back as the same
//    tensors (names, dtypes, shapes, ranges) and metadata.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "partita/errors.hpp"
#include "partita/safetensors.hpp"

namespace {

namespace st = partita::safetensors;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "safetensors_header_fuzz: %s\n", what.c_str());
  std::abort();
}

bool same(const st::Entry& a, const st::Entry& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin && a.end == b.end;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first 8 bytes pick how much data the file holds after the input.
  if (size < 8) return 0;
  uint64_t extra = 0;
  for (int b = 7; b >= 0; --b) extra = (extra << 8) | data[b];
  extra %= 1 << 20;
  const std::string bytes(reinterpret_cast<const char*>(data) + 8, size - 8);
  const int64_t file_size = static_cast<int64_t>(bytes.size() + extra);
  st::Header h;
  try {
    const int64_t n = st::header_length(bytes.substr(0, 8), file_size, "fuzz");
    if (8 + n > static_cast<int64_t>(bytes.size())) return 0;  // the header is not all in the input
    h = st::parse_header(bytes.substr(8, static_cast<size_t>(n)), file_size, "fuzz");
  } catch (const partita::Error&) {
    return 0;
  }
  int64_t at = 0;
  for (const auto& e : h.tensors) {
    if (e.begin != at) finding("a gap or an overlap before \"" + e.name + "\"");
    int64_t v = 1;
    for (int64_t d : e.shape) v *= d;
    if (e.end - e.begin != v * st::dtype_size(e.dtype)) finding("\"" + e.name + "\" has the wrong number of bytes");
    at = e.end;
  }
  if (h.data_start + at != file_size) finding("the ranges do not end at the end of the file");
  std::vector<st::Entry> again = h.tensors;
  const std::string prefix = st::format_header(again, h.metadata);
  st::Header back;
  try {
    back = st::parse_header(prefix.substr(8), static_cast<int64_t>(prefix.size()) + at, "fuzz again");
  } catch (const partita::Error& e) {
    finding(std::string("format_header wrote what parse_header refuses: ") + e.what());
  }
  if (back.tensors.size() != h.tensors.size() || back.metadata != h.metadata) finding("format_header lost something");
  for (size_t i = 0; i < h.tensors.size(); ++i)
    if (!same(back.tensors[i], h.tensors[i]) && h.tensors[i].begin != h.tensors[i].end)
      finding("\"" + h.tensors[i].name + "\" read back otherwise");
  return 0;
}
