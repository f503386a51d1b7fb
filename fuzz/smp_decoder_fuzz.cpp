// libFuzzer target: partita::smp's decoder on arbitrary bytes. The decoder's
// promise (partita/smp/message.hpp) is that anything that is not a valid
// message raises partita::smp::MessageError: any other exception, a crash or
// an AddressSanitizer report is a finding.
//
// Each input is tried three ways: as a whole frame (IValue, string, and a
// plain int64_t requested), and as the payload of an IValue frame with a
// valid header and checksum, so that mutations reach the tensor table and
// LibTorch's unpickler instead of stopping at the checksum.
//
// PARTITA_FUZZ_WRITE_CORPUS=DIR writes the seed corpus (valid frames of each
// kind) into DIR and exits: how fuzz/corpus/smp_decoder was made.
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "partita/smp.hpp"
#include "partita/smp/message.hpp"

namespace {

namespace msg = partita::smp::message;

void write_corpus(const std::string& dir) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("lr", 0.125);
  d.insert("steps", std::vector<int64_t>{1, 2, 3});
  c10::impl::GenericList any(c10::AnyType::get());
  any.push_back(c10::IValue("mixed"));
  any.push_back(c10::IValue(int64_t{7}));
  any.push_back(c10::IValue());
  const std::vector<std::pair<std::string, std::string>> frames = {
      {"int", msg::encode_ivalue(c10::IValue(int64_t{42}))},
      {"string", msg::encode_ivalue(c10::IValue("hello"))},
      {"tensor_double", msg::encode_ivalue(c10::IValue(at::arange(6, at::kDouble).reshape({2, 3})))},
      {"tensor_empty_int", msg::encode_ivalue(c10::IValue(at::zeros({0, 3}, at::kInt)))},
      {"tuple_nested",
       msg::encode_ivalue(c10::ivalue::Tuple::create({c10::IValue(at::ones({2}, at::kFloat).requires_grad_()),
                                                      c10::IValue(d), c10::IValue(any), c10::IValue(true)}))},
      {"tensor_list", msg::encode_ivalue(c10::IValue(std::vector<at::Tensor>{at::ones({1}), at::zeros({2, 2}, at::kBFloat16)}))},
      {"plain_int64", partita::smp::detail::frame_of(int64_t{-5})},
      {"typed_string", partita::smp::detail::frame_of(std::string("typed"))},
      {"error", msg::error_frame("sender failed")},
  };
  for (const auto& [name, bytes] : frames) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
    // The payload alone seeds the second way of reading an input.
    if (bytes.size() > msg::kHeaderSize && bytes[6] == static_cast<char>(msg::Kind::IValue))
      std::ofstream(dir + "/" + name + ".payload", std::ios::binary) << bytes.substr(msg::kHeaderSize);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("PARTITA_FUZZ_WRITE_CORPUS")) {
    write_corpus(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  const std::string bytes(p, size);
  try {
    (void)msg::decode_ivalue(p, size);
  } catch (const partita::smp::MessageError&) {
  }
  try {
    (void)partita::smp::detail::unframe<std::string>(bytes, "fuzz");
  } catch (const partita::smp::MessageError&) {
  }
  try {
    (void)partita::smp::detail::unframe<int64_t>(bytes, "fuzz");
  } catch (const partita::smp::MessageError&) {
  }
  try {
    (void)msg::decode_ivalue_payload(p, size);
  } catch (const partita::smp::MessageError&) {
  }
  return 0;
}
