// The smp message format (partita/smp/message.hpp): frames, the IValue
// codec around LibTorch's pickler, and the typed payloads. Received bytes are
// untrusted: every length, count and code is checked against what is left
// before it is used, and LibTorch's own errors while unpickling become
// MessageError. fuzz/smp_decoder_fuzz.cpp drives decode_* under libFuzzer.
#include "partita/smp/message.hpp"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <cxxabi.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "partita/smp.hpp"

namespace partita::smp::message {

namespace {

const char kMagic[4] = {'P', 'S', 'M', 'P'};

void put_u16(std::string& out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint16_t get_u16(const char* p) {
  return static_cast<uint16_t>(static_cast<unsigned char>(p[0]) |
                               (static_cast<unsigned char>(p[1]) << 8));
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// Reads a payload front to back; every read checks what is left.
class Reader {
 public:
  Reader(const char* data, std::size_t n, const char* what) : p_(data), left_(n), what_(what) {}
  const char* take(std::size_t n, const char* field) {
    if (n > left_)
      throw MessageError(std::string(what_) + ": truncated: " + field + " needs " +
                         std::to_string(n) + " bytes, " + std::to_string(left_) + " left");
    const char* at = p_;
    p_ += n;
    left_ -= n;
    return at;
  }
  uint8_t u8(const char* field) { return static_cast<unsigned char>(*take(1, field)); }
  uint16_t u16(const char* field) { return get_u16(take(2, field)); }
  uint32_t u32(const char* field) {
    const char* p = take(4, field);
    return static_cast<uint32_t>(get_u16(p)) | (static_cast<uint32_t>(get_u16(p + 2)) << 16);
  }
  uint64_t u64(const char* field) { return get_u64(take(8, field)); }
  std::size_t left() const { return left_; }

 private:
  const char* p_;
  std::size_t left_;
  const char* what_;
};

// partita's own dtype codes (not c10's enum values, which may change).
struct DtypeCode {
  uint8_t code;
  at::ScalarType type;
};
const DtypeCode kDtypes[] = {
    {1, at::kDouble}, {2, at::kFloat},        {3, at::kHalf},         {4, at::kBFloat16},
    {5, at::kLong},   {6, at::kInt},          {7, at::kShort},        {8, at::kChar},
    {9, at::kByte},   {10, at::kBool},        {11, at::kComplexFloat}, {12, at::kComplexDouble},
};
constexpr uint8_t kUndefinedTensor = 0;
constexpr int kMaxDims = 32;

uint8_t dtype_code(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.code;
  throw MessageError(std::string("smp: cannot send a tensor of dtype ") + c10::toString(t));
}

// Which IValues can travel: what the pickler writes and the unpickler reads
// back without a class resolver.
void check_sendable(const c10::IValue& v, const std::string& path) {
  if (v.isNone() || v.isDouble() || v.isInt() || v.isBool() || v.isString() || v.isDevice())
    return;
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return;
    if (t.layout() != at::kStrided || !t.device().is_cpu() || t.is_quantized())
      throw MessageError("smp: cannot send the tensor at " + path +
                         ": only dense CPU tensors travel (layout " + c10::str(t.layout()) +
                         ", device " + t.device().str() + ")");
    dtype_code(t.scalar_type());
    if (t.dim() > kMaxDims)
      throw MessageError("smp: cannot send the tensor at " + path + ": more than " +
                         std::to_string(kMaxDims) + " dimensions");
    return;
  }
  if (v.isTuple()) {
    const auto& e = v.toTupleRef().elements();
    for (size_t i = 0; i < e.size(); ++i) check_sendable(e[i], path + "[" + std::to_string(i) + "]");
    return;
  }
  if (v.isList()) {
    const auto l = v.toListRef();
    for (size_t i = 0; i < l.size(); ++i) check_sendable(l[i], path + "[" + std::to_string(i) + "]");
    return;
  }
  if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) {
      check_sendable(kv.key(), path + " key");
      check_sendable(kv.value(), path + "[" + kv.key().tagKind() + " key]");
    }
    return;
  }
  throw MessageError("smp: cannot send the " + v.tagKind() + " at " + path +
                     ": objects travel as IValues of None, bool, int, double, string, device, "
                     "tensor, and lists, tuples and dicts of them");
}

void put_tensor(std::string& out, const at::Tensor& tensor) {
  if (!tensor.defined()) {
    out.push_back(static_cast<char>(kUndefinedTensor));
    return;
  }
  const at::Tensor t = tensor.detach().resolve_conj().resolve_neg().contiguous();
  out.push_back(static_cast<char>(dtype_code(t.scalar_type())));
  out.push_back(tensor.requires_grad() ? 1 : 0);
  out.push_back(static_cast<char>(t.dim()));
  for (int64_t s : t.sizes()) put_u64(out, static_cast<uint64_t>(s));
  const std::size_t nbytes = t.numel() * t.element_size();
  put_u64(out, nbytes);
  if (nbytes) out.append(static_cast<const char*>(t.data_ptr()), nbytes);
}

at::Tensor take_tensor(Reader& r, size_t index) {
  const std::string which = "tensor " + std::to_string(index);
  const uint8_t code = r.u8("tensor dtype");
  if (code == kUndefinedTensor) return at::Tensor();
  const DtypeCode* dtype = nullptr;
  for (const auto& d : kDtypes)
    if (d.code == code) dtype = &d;
  if (!dtype) throw MessageError("smp message: " + which + " has unknown dtype code " + std::to_string(code));
  const uint8_t grad = r.u8("tensor requires_grad");
  if (grad > 1) throw MessageError("smp message: " + which + " has requires_grad byte " + std::to_string(grad));
  if (grad && !c10::isFloatingType(dtype->type) && !c10::isComplexType(dtype->type))
    throw MessageError("smp message: " + which + " of dtype " + c10::toString(dtype->type) +
                       " requires grad (only floating and complex tensors can)");
  const uint8_t ndim = r.u8("tensor dimension count");
  if (ndim > kMaxDims)
    throw MessageError("smp message: " + which + " has " + std::to_string(ndim) + " dimensions (at most " +
                       std::to_string(kMaxDims) + ")");
  std::vector<int64_t> sizes(ndim);
  uint64_t numel = 1;
  for (auto& s : sizes) {
    const uint64_t v = r.u64("tensor size");
    if (v > static_cast<uint64_t>(kMaxFrame))
      throw MessageError("smp message: " + which + " has an extent of " + std::to_string(v));
    s = static_cast<int64_t>(v);
    if (__builtin_mul_overflow(numel, v, &numel) || numel > kMaxFrame)
      throw MessageError("smp message: " + which + " has more elements than a message can hold");
  }
  const uint64_t nbytes = r.u64("tensor byte count");
  const uint64_t expected = numel * c10::elementSize(dtype->type);
  if (nbytes != expected)
    throw MessageError("smp message: " + which + " holds " + std::to_string(nbytes) + " bytes, its shape and dtype need " +
                       std::to_string(expected));
  const char* bytes = r.take(nbytes, "tensor data");
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype->type));
  if (nbytes) std::memcpy(t.data_ptr(), bytes, nbytes);
  if (grad) t.set_requires_grad(true);
  return t;
}

// LibTorch's unpickler trusts its input: a string length of 4 GB is
// allocated before it finds the bytes missing, a memo index of 2^32 reserves
// that many slots, an opcode without its operands underflows the stack. So
// the pickle is walked first: only the opcodes torch::jit::pickle writes,
// every operand inside the pickle, memo slots numbered as the pickler numbers
// them (0, 1, 2, ...), globals from LibTorch's own list, the stack and marks
// simulated so that no opcode finds fewer items than it takes, and STOP as
// the last byte.
void validate_pickle(const char* data, std::size_t n) {
  Reader r(data, n, "smp message: pickle");
  auto bad = [](const std::string& why) -> MessageError { return MessageError("smp message: the pickle is not a valid object: " + why); };
  // Each item on the simulated stack is its nesting depth (0: a scalar, a
  // string, a global; a container: one more than its deepest item): the
  // unpickler builds any depth without recursing, but the object it
  // returns is destroyed one level per call, so a message of a million
  // nested tuples (a few megabytes) would overflow the receiver's stack.
  constexpr uint32_t kMaxDepth = 1000;
  std::vector<uint32_t> stack, memo_depths;
  std::vector<std::size_t> marks;
  auto push = [&](uint32_t depth) {
    if (depth > kMaxDepth) throw bad("objects nested deeper than " + std::to_string(kMaxDepth) + " levels");
    stack.push_back(depth);
  };
  auto need = [&](std::size_t k, const char* op) {
    const std::size_t floor = marks.empty() ? 0 : marks.back();
    if (stack.size() < floor + k) throw bad(std::string(op) + " finds too few items on the stack");
  };
  // Pops the top k items; returns the deepest one's depth (0 for none).
  auto pop = [&](std::size_t k) {
    uint32_t deepest = 0;
    for (std::size_t i = 0; i < k; ++i) {
      deepest = std::max(deepest, stack.back());
      stack.pop_back();
    }
    return deepest;
  };
  auto line = [&]() {
    std::string s;
    for (;;) {
      const char c = *r.take(1, "global name");
      if (c == '\n') return s;
      s.push_back(c);
      if (s.size() > 256) throw bad("a global name longer than 256 bytes");
    }
  };
  auto to_mark = [&](const char* op) {
    if (marks.empty()) throw bad(std::string(op) + " without a MARK");
    const std::size_t m = marks.back();
    marks.pop_back();
    return stack.size() - m;  // items above the mark
  };
  // The container on top of the stack takes items of depth `deepest`.
  auto fill = [&](uint32_t deepest) {
    const uint32_t container = stack.back();
    stack.pop_back();
    push(std::max(container, deepest + 1));
  };
  const uint8_t proto = r.u8("PROTO");
  if (proto != 0x80 || r.u8("protocol") != 2) throw bad("it does not start with PROTO 2");
  for (;;) {
    const uint8_t op = r.u8("opcode");
    switch (op) {
      case '.':  // STOP
        if (stack.size() != 1 || !marks.empty()) throw bad("STOP with " + std::to_string(stack.size()) + " items on the stack");
        if (r.left() != 0) throw bad(std::to_string(r.left()) + " bytes after STOP");
        return;
      case '(': marks.push_back(stack.size()); break;  // MARK
      case 'c': {  // GLOBAL
        const std::string module = line(), name = line();
        const bool known =
            (module == "torch.jit._pickle" &&
             (name == "build_tensor_from_id" || name == "build_intlist" || name == "build_doublelist" ||
              name == "build_boollist" || name == "build_tensorlist" || name == "restore_type_tag")) ||
            (module == "torch" && name == "device");
        if (!known) throw bad("global " + module + "." + name + " is not one LibTorch's pickler writes");
        push(0);
        break;
      }
      case 'J': r.take(4, "BININT"); push(0); break;
      case 'K': r.take(1, "BININT1"); push(0); break;
      case 'M': r.take(2, "BININT2"); push(0); break;
      case 0x8a: {  // LONG1
        const uint8_t len = r.u8("LONG1 length");
        if (len > 8) throw bad("an integer of " + std::to_string(len) + " bytes");
        r.take(len, "LONG1");
        push(0);
        break;
      }
      case 'G': r.take(8, "BINFLOAT"); push(0); break;
      case 'X': {  // BINUNICODE
        r.take(r.u32("BINUNICODE length"), "BINUNICODE");
        push(0);
        break;
      }
      case 'q':
      case 'r': {  // BINPUT, LONG_BINPUT
        const uint64_t id = op == 'q' ? r.u8("BINPUT") : r.u32("LONG_BINPUT");
        need(1, "BINPUT");
        if (id != memo_depths.size())
          throw bad("memo slot " + std::to_string(id) + " where the pickler writes " + std::to_string(memo_depths.size()));
        memo_depths.push_back(stack.back());
        break;
      }
      case 'h':
      case 'j': {  // BINGET, LONG_BINGET
        const uint64_t id = op == 'h' ? r.u8("BINGET") : r.u32("LONG_BINGET");
        if (id >= memo_depths.size()) throw bad("memo slot " + std::to_string(id) + " read before it was written");
        push(memo_depths[id]);
        break;
      }
      case ']':
      case ')':
      case '}': push(1); break;  // EMPTY_LIST/TUPLE/DICT
      case 'N':
      case 0x88:
      case 0x89: push(0); break;  // NONE, NEWTRUE, NEWFALSE
      case 'a': need(2, "APPEND"); fill(pop(1)); break;
      case 's': need(3, "SETITEM"); fill(pop(2)); break;
      case 'e':
      case 'u': {  // APPENDS, SETITEMS: a container below the mark
        const std::size_t items = to_mark(op == 'e' ? "APPENDS" : "SETITEMS");
        if (op == 'u' && items % 2) throw bad("SETITEMS with an odd number of items");
        const uint32_t deepest = pop(items);
        if (stack.size() < 1 + (marks.empty() ? 0 : marks.back())) throw bad("APPENDS/SETITEMS without a container");
        if (items > 0) fill(deepest);
        break;
      }
      case 't': push(pop(to_mark("TUPLE")) + 1); break;
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1-3
        const std::size_t k = op - 0x84u;
        need(k, "TUPLEn");
        push(pop(k) + 1);
        break;
      }
      case 'R': need(2, "REDUCE"); push(pop(2)); break;  // callable(args): as deep as its arguments
      case 'b': {  // BUILD: the object below takes its state
        need(2, "BUILD");
        const uint32_t state = pop(1), object = pop(1);
        push(std::max(object, state));
        break;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        throw bad(std::string("opcode ") + hex + " is not one LibTorch's pickler writes");
      }
    }
  }
}

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(mangled);
}

uint64_t plain_tag(const std::string& mangled, std::size_t size) {
  const uint64_t s = size;
  return fnv1a(&s, sizeof s, fnv1a(mangled.data(), mangled.size()));
}

std::string describe(const Checked& c) {
  return std::string("a message holding ") + kind_name(static_cast<uint16_t>(c.kind));
}

}  // namespace

const char* kind_name(uint16_t kind) {
  switch (kind) {
    case 1: return "an IValue";
    case 2: return "a trivially copyable value";
    case 3: return "a std::string";
    case 4: return "an error";
    default: return "an unknown kind";
  }
}

uint64_t fnv1a(const void* data, std::size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string frame(Kind kind, uint64_t type_tag, const std::string& payload) {
  if (payload.size() > kMaxFrame - kHeaderSize)
    throw MessageError("smp: an object of " + std::to_string(payload.size()) +
                       " bytes is too large for one message (at most 2 GiB)");
  std::string out(kMagic, 4);
  put_u16(out, kVersion);
  put_u16(out, static_cast<uint16_t>(kind));
  put_u64(out, payload.size());
  put_u64(out, type_tag);
  put_u64(out, fnv1a(payload.data(), payload.size(), fnv1a(out.data(), out.size())));
  out += payload;
  return out;
}

Checked check(const char* data, std::size_t n) {
  if (n < kHeaderSize)
    throw MessageError("not a partita smp message: " + std::to_string(n) +
                       " bytes, shorter than the 32-byte header (truncated)");
  if (std::memcmp(data, kMagic, 4) != 0)
    throw MessageError("not a partita smp message: bad magic (the bytes do not start with \"PSMP\")");
  const uint16_t version = get_u16(data + 4);
  if (version != kVersion)
    throw MessageError("smp message of version " + std::to_string(version) + ", this build reads version " +
                       std::to_string(kVersion));
  const uint16_t kind = get_u16(data + 6);
  if (kind < 1 || kind > 4) throw MessageError("smp message of unknown kind " + std::to_string(kind));
  const uint64_t length = get_u64(data + 8);
  if (length != n - kHeaderSize)
    throw MessageError("smp message " + std::string(length > n - kHeaderSize ? "truncated" : "with trailing bytes") +
                       ": the header announces " + std::to_string(length) + " payload bytes, " +
                       std::to_string(n - kHeaderSize) + " arrived");
  const uint64_t sum = fnv1a(data + kHeaderSize, length, fnv1a(data, 24));
  if (sum != get_u64(data + 24))
    throw MessageError("smp message corrupted: checksum mismatch over " + std::to_string(n) + " bytes");
  Checked c{static_cast<Kind>(kind), get_u64(data + 16), data + kHeaderSize, static_cast<std::size_t>(length)};
  if (c.kind == Kind::Error)
    throw MessageError("the sender could not encode its object: " + std::string(c.payload, c.length));
  return c;
}

std::string encode_ivalue(const c10::IValue& value) {
  check_sendable(value, "the object");
  std::vector<at::Tensor> tensors;
  std::vector<char> pickle;
  try {
    pickle = torch::jit::pickle(value, &tensors);
  } catch (const std::exception& e) {
    throw MessageError(std::string("smp: LibTorch's pickler cannot encode the object: ") + e.what());
  }
  std::string payload;
  put_u64(payload, pickle.size());
  payload.append(pickle.data(), pickle.size());
  put_u64(payload, tensors.size());
  for (const auto& t : tensors) put_tensor(payload, t);
  return frame(Kind::IValue, 0, payload);
}

c10::IValue decode_ivalue_payload(const char* payload, std::size_t length) {
  Reader r(payload, length, "smp message");
  const uint64_t pickle_len = r.u64("pickle length");
  const char* pickle = r.take(pickle_len, "pickle");
  const uint64_t count = r.u64("tensor count");
  // Each tensor takes at least one byte: a count beyond what is left is a lie.
  if (count > r.left())
    throw MessageError("smp message: announces " + std::to_string(count) + " tensors in " +
                       std::to_string(r.left()) + " bytes");
  std::vector<at::Tensor> tensors;
  tensors.reserve(count);
  for (uint64_t i = 0; i < count; ++i) tensors.push_back(take_tensor(r, i));
  if (r.left() != 0)
    throw MessageError("smp message: " + std::to_string(r.left()) + " bytes after the last tensor");
  validate_pickle(pickle, pickle_len);
  try {
    return torch::jit::unpickle(pickle, pickle_len, nullptr, tensors);
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (const auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);  // c10 appends a backtrace
    throw MessageError("smp message: the pickle is not a valid object: " + what);
  }
}

c10::IValue decode_ivalue(const char* data, std::size_t n) {
  const Checked c = check(data, n);
  if (c.kind != Kind::IValue)
    throw MessageError("wrong type requested: " + describe(c) + ", an IValue was asked for");
  return decode_ivalue_payload(c.payload, c.length);
}

std::string error_frame(const std::string& text) { return frame(Kind::Error, 0, text); }

std::string too_large_for_one_message(std::size_t bytes, std::size_t limit) {
  if (bytes <= limit) return {};
  return "the object's message is " + std::to_string(bytes) + " bytes, above MPI's count limit (" +
         std::to_string(limit) + " bytes in one message); nothing was sent";
}

OneMessage one_message(std::string frame, const std::string& context, std::size_t limit) {
  const std::string why = too_large_for_one_message(frame.size(), limit);
  if (why.empty()) return {std::move(frame), {}};
  const std::string error = context + why;
  return {error_frame(error), error};
}

}  // namespace partita::smp::message

namespace partita::smp::detail {

using namespace partita::smp::message;

Frame frame_plain(const TypeName& type, const void* value) {
  const std::string name = type.mangled;
  std::string payload;
  put_u16(payload, static_cast<uint16_t>(name.size()));
  payload += name;
  payload.append(static_cast<const char*>(value), type.size);
  return frame(Kind::Plain, plain_tag(name, type.size), payload);
}

Frame frame_string(const std::string& value) { return frame(Kind::String, 0, value); }

namespace {
[[noreturn]] void rethrow_with(const std::string& context, const MessageError& e) {
  throw MessageError(context + ": " + e.what());
}
}  // namespace

void unframe_plain(const Frame& f, const TypeName& type, void* out, const std::string& context) {
  try {
    const Checked c = check(f.data(), f.size());
    const std::string wanted = demangle(type.mangled) + " (" + std::to_string(type.size) + " bytes)";
    if (c.kind != Kind::Plain)
      throw MessageError("wrong type requested: " + describe(c) + ", " + wanted + " was asked for");
    Reader r(c.payload, c.length, "smp message");
    const uint16_t name_len = r.u16("type name length");
    const std::string name(r.take(name_len, "type name"), name_len);
    const std::size_t size = r.left();
    if (c.type_tag != plain_tag(name, size))
      throw MessageError("smp message corrupted: the type tag does not match the type name and size");
    if (name != type.mangled || size != type.size)
      throw MessageError("wrong type requested: the message holds " + demangle(name.c_str()) + " (" +
                         std::to_string(size) + " bytes), " + wanted + " was asked for");
    std::memcpy(out, r.take(size, "value"), size);
  } catch (const MessageError& e) {
    rethrow_with(context, e);
  }
}

std::string unframe_string(const Frame& f, const std::string& context) {
  try {
    const Checked c = check(f.data(), f.size());
    if (c.kind != Kind::String)
      throw MessageError("wrong type requested: " + describe(c) + ", a std::string was asked for");
    return std::string(c.payload, c.length);
  } catch (const MessageError& e) {
    rethrow_with(context, e);
  }
}

}  // namespace partita::smp::detail
