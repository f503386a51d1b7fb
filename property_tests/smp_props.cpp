// Lockstep properties of partita::smp's object communication: random nested
// IValues (None, bools, ints, doubles with NaN/inf/-0, byte strings, tensors
// of every supported dtype with empty, non-contiguous and requires_grad
// cases, undefined tensors, typed and generic lists, tuples, dicts) sent
// through broadcast, send and allgather arrive equal to the original, bit for
// bit, with their types, on random layouts and groups.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <map>
#include <random>
#include <sstream>

#include "partita/testing/ivalue_compare.hpp"
#include "partita/testing/lockstep.hpp"
#include "partita/mpi/runtime.hpp"
#include "partita/smp.hpp"
#include "partita/smp/message.hpp"

namespace partita::testing {
namespace {

// A description of an object; every rank builds the same IValue from it
// (plus a salt, so that allgather's members differ).
struct Node {
  enum Kind { None, Bool, Int, Double, String, Tensor, UndefinedTensor, IntList, DoubleList, TensorList, AnyList, Tuple,
              StrDict, IntDict };
  int kind = None;
  int64_t i = 0;
  double d = 0;
  std::string s;
  int dtype = 0;
  std::vector<int64_t> shape;
  bool transposed = false, grad = false;
  std::vector<Node> children;
};

const char* kKindNames[] = {"none", "bool", "int", "double", "string", "tensor", "undefined_tensor", "int_list",
                            "double_list", "tensor_list", "any_list", "tuple", "str_dict", "int_dict"};
const at::ScalarType kTypes[] = {at::kDouble, at::kFloat, at::kLong,  at::kInt,   at::kBool,          at::kByte,
                                 at::kBFloat16, at::kHalf, at::kChar, at::kShort, at::kComplexFloat, at::kComplexDouble};

void print(std::ostream& os, const Node& n) {
  os << "{\"" << kKindNames[n.kind] << "\"";
  switch (n.kind) {
    case Node::Bool:
    case Node::Int: os << ", " << n.i; break;
    case Node::Double: os << ", \"" << n.d << "\""; break;
    case Node::String: os << ", " << n.s.size() << " bytes, seed " << n.i; break;
    case Node::Tensor:
      os << ", \"" << c10::toString(kTypes[n.dtype]) << "\", [";
      for (size_t k = 0; k < n.shape.size(); ++k) os << (k ? ", " : "") << n.shape[k];
      os << "], seed " << n.i << (n.transposed ? ", transposed" : "") << (n.grad ? ", grad" : "");
      break;
    default: break;
  }
  for (const Node& c : n.children) {
    os << ", ";
    print(os, c);
  }
  os << "}";
}

at::Tensor make_tensor(const Node& n, int64_t salt) {
  const at::ScalarType t = kTypes[n.dtype];
  std::mt19937_64 rng(static_cast<uint64_t>(n.i + 1000003 * salt));
  std::vector<int64_t> shape = n.shape;
  if (n.transposed) std::reverse(shape.begin(), shape.end());
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  std::vector<double> v(static_cast<size_t>(numel));
  std::normal_distribution<double> normal(0, 3);
  for (auto& x : v) x = normal(rng);
  at::Tensor real = at::tensor(v, at::kDouble).reshape(shape);
  at::Tensor out = c10::isComplexType(t) ? at::complex(real, real.flip(0)).to(t) : real.to(t);
  if (n.transposed && out.dim() >= 2) out = out.transpose(0, out.dim() - 1);
  if (n.grad && (c10::isFloatingType(t) || c10::isComplexType(t))) out.set_requires_grad(true);
  return out;
}

c10::IValue build(const Node& n, int64_t salt) {
  switch (n.kind) {
    case Node::None: return c10::IValue();
    case Node::Bool: return c10::IValue(((n.i + salt) & 1) != 0);
    case Node::Int: return c10::IValue(n.i + salt);
    case Node::Double: return c10::IValue(std::isfinite(n.d) ? n.d + salt : n.d);
    case Node::String: {
      std::mt19937_64 rng(static_cast<uint64_t>(n.i + salt));
      std::string s = n.s;
      for (auto& c : s) c = static_cast<char>(rng() & 0xff);  // any bytes, NUL and non-UTF-8 included
      return c10::IValue(s);
    }
    case Node::Tensor: return c10::IValue(make_tensor(n, salt));
    case Node::UndefinedTensor: return c10::IValue(at::Tensor());
    case Node::IntList: {
      std::vector<int64_t> v;
      for (const Node& c : n.children) v.push_back(c.i * (salt + 1));
      return c10::IValue(v);
    }
    case Node::DoubleList: {
      std::vector<double> v;
      for (const Node& c : n.children) v.push_back(c.d);
      return c10::IValue(v);
    }
    case Node::TensorList: {
      std::vector<at::Tensor> v;
      for (const Node& c : n.children) v.push_back(make_tensor(c, salt));
      return c10::IValue(v);
    }
    case Node::AnyList: {
      c10::impl::GenericList l(c10::AnyType::get());
      for (const Node& c : n.children) l.push_back(build(c, salt));
      return c10::IValue(l);
    }
    case Node::Tuple: {
      std::vector<c10::IValue> v;
      for (const Node& c : n.children) v.push_back(build(c, salt));
      return c10::ivalue::Tuple::create(std::move(v));
    }
    case Node::StrDict:
    case Node::IntDict: {
      const bool str = n.kind == Node::StrDict;
      const c10::TypePtr key_type = str ? c10::TypePtr(c10::StringType::get()) : c10::TypePtr(c10::IntType::get());
      c10::impl::GenericDict d(key_type, c10::AnyType::get());
      int64_t k = 0;
      for (const Node& c : n.children) {
        const c10::IValue key = str ? c10::IValue("k" + std::to_string(k)) : c10::IValue(k * 7 - 3);
        d.insert(key, build(c, salt));
        ++k;
      }
      return c10::IValue(d);
    }
  }
  return c10::IValue();
}

// A vector whose length is drawn from `count`.
template <typename T>
rc::Gen<std::vector<T>> sized_vector(rc::Gen<int> count, rc::Gen<T> element) {
  return rc::gen::mapcat(count, [element](int n) { return rc::gen::container<std::vector<T>>(n, element); });
}

rc::Gen<Node> gen_tensor_node() {
  return rc::gen::apply(
      [](int dtype, std::vector<int64_t> shape, int64_t seed, bool transposed, bool grad) {
        Node n;
        n.kind = Node::Tensor;
        n.dtype = dtype;
        n.shape = shape;
        n.i = seed;
        n.transposed = transposed && shape.size() >= 2;
        n.grad = grad;
        return n;
      },
      rc::gen::inRange(0, static_cast<int>(std::size(kTypes))),
      sized_vector(rc::gen::inRange(0, 4), rc::gen::inRange<int64_t>(0, 7)),
      rc::gen::inRange<int64_t>(0, 1 << 20), rc::gen::arbitrary<bool>(), rc::gen::weightedElement<bool>({{3, false}, {1, true}}));
}

rc::Gen<Node> gen_leaf() {
  return rc::gen::oneOf(
      rc::gen::just(Node{}),
      rc::gen::map(rc::gen::arbitrary<bool>(), [](bool b) { Node n; n.kind = Node::Bool; n.i = b; return n; }),
      rc::gen::map(rc::gen::arbitrary<int64_t>(), [](int64_t v) { Node n; n.kind = Node::Int; n.i = v / 2; return n; }),
      rc::gen::map(rc::gen::oneOf(rc::gen::arbitrary<double>(),
                                  rc::gen::element(std::numeric_limits<double>::quiet_NaN(),
                                                   std::numeric_limits<double>::infinity(),
                                                   -std::numeric_limits<double>::infinity(), -0.0, 1e-310)),
                   [](double v) { Node n; n.kind = Node::Double; n.d = v; return n; }),
      rc::gen::apply([](int len, int64_t seed) { Node n; n.kind = Node::String; n.s.assign(len, 'x'); n.i = seed; return n; },
                     rc::gen::inRange(0, 40), rc::gen::inRange<int64_t>(0, 1 << 20)),
      gen_tensor_node(),
      rc::gen::just([] { Node n; n.kind = Node::UndefinedTensor; return n; }()));
}

rc::Gen<Node> gen_node(int depth) {
  if (depth == 0) return gen_leaf();
  auto children = [depth](rc::Gen<Node> g) {
    return sized_vector(rc::gen::inRange(0, 5), g);
  };
  auto container = rc::gen::mapcat(rc::gen::inRange(static_cast<int>(Node::IntList), static_cast<int>(Node::IntDict) + 1),
                                    [depth, children](int kind) {
    rc::Gen<Node> child = gen_node(depth - 1);
    if (kind == Node::IntList)
      child = rc::gen::map(rc::gen::arbitrary<int64_t>(), [](int64_t v) { Node n; n.kind = Node::Int; n.i = v / 4; return n; });
    if (kind == Node::DoubleList)
      child = rc::gen::map(rc::gen::arbitrary<double>(), [](double v) { Node n; n.kind = Node::Double; n.d = v; return n; });
    if (kind == Node::TensorList) child = gen_tensor_node();
    return rc::gen::map(children(child), [kind](std::vector<Node> c) {
      Node n;
      n.kind = kind;
      n.children = std::move(c);
      return n;
    });
  });
  return rc::gen::weightedOneOf<Node>({{1, gen_leaf()}, {2, container}});
}

// The object sent: a container most of the time, so that nesting is the
// common case rather than the exception.
rc::Gen<Node> gen_object() { return rc::gen::weightedOneOf<Node>({{1, gen_leaf()}, {4, gen_node(3)}}); }

struct ObjectCase {
  int partitions = 1;
  std::string op;  // broadcast, send, allgather
  int group = 0;   // CommGroup
  int a = 0, b = 0;  // broadcast: root's group rank; send: source and destination world ranks
  Node obj;
};

std::ostream& operator<<(std::ostream& os, const ObjectCase& c) {
  os << "{\"partitions\": " << c.partitions << ", \"op\": \"" << c.op << "\", \"group\": \""
     << smp::name(static_cast<smp::CommGroup>(c.group)) << "\", \"a\": " << c.a << ", \"b\": " << c.b << ", \"obj\": ";
  print(os, c.obj);
  return os << "}";
}

rc::Gen<ObjectCase> gen_case(int world, int partitions) {
  std::vector<std::string> ops = {"broadcast", "allgather"};
  if (world > 1) ops.push_back("send");
  return rc::gen::apply(
      [world, partitions](std::string op, int group, int a, int b, Node obj) {
        ObjectCase c;
        c.partitions = partitions;
        c.op = op;
        c.group = group;
        c.a = a;
        c.b = b == a ? (b + 1) % world : b;
        c.obj = std::move(obj);
        return c;
      },
      rc::gen::elementOf(ops), rc::gen::inRange(0, 3), rc::gen::inRange(0, world),
      rc::gen::inRange(0, world), gen_object());
}

// What the objects held, counted on rank 0, so that a generator drawing only
// trivial objects shows itself.
struct Seen {
  std::map<std::string, long> kinds;
  long cases = 0, bytes = 0;
  int depth = 0;
  void count(const c10::IValue& x, int d = 1) {
    depth = std::max(depth, d);
    if (x.isTensor() && x.toTensor().defined()) {
      const at::Tensor& t = x.toTensor();
      ++kinds[std::string("tensor ") + c10::toString(t.scalar_type())];
      if (t.numel() == 0) ++kinds["tensor empty"];
      if (!t.is_contiguous()) ++kinds["tensor non-contiguous"];
      if (t.requires_grad()) ++kinds["tensor requires_grad"];
      return;
    }
    ++kinds[x.isList() ? x.type()->str() : x.isGenericDict() ? x.type()->str() : x.tagKind()];
    if (x.isTuple())
      for (const auto& e : x.toTupleRef().elements()) count(e, d + 1);
    if (x.isList())
      for (const auto& e : x.toListRef()) count(e, d + 1);
    if (x.isGenericDict())
      for (const auto& kv : x.toGenericDict()) count(kv.value(), d + 1);
  }
  void print(const std::string& what) const {
    if (mpi::world_rank() != 0) return;
    std::cout << "  " << what << ": rank 0 saw " << cases << " objects, " << bytes << " bytes encoded, depth up to "
              << depth << ";";
    for (const auto& [k, n] : kinds) std::cout << " " << k << " " << n << ";";
    std::cout << std::endl;
  }
};

void run_case(const ObjectCase& c, Verdict& v) {
  const auto group = static_cast<smp::CommGroup>(c.group);
  const int me = smp::rank();
  if (c.op == "broadcast") {
    const auto members = smp::layout().members(me, group);
    const int root = c.a % static_cast<int>(members.size());
    const auto type = group == smp::WORLD ? smp::WORLD_RANK : group == smp::MP_GROUP ? smp::MP_RANK : smp::DP_RANK;
    if (members[root] == me) {
      smp::broadcast(build(c.obj, me), group);
    } else {
      const std::string d = ivalue_difference(smp::recv_from(root, type), build(c.obj, members[root]));
      v.expect(d.empty(), "broadcast from world rank " + std::to_string(members[root]) + ": " + d);
    }
  } else if (c.op == "send") {
    if (me == c.a) smp::send(build(c.obj, c.a), c.b, smp::WORLD_RANK);
    if (me == c.b) {
      const std::string d = ivalue_difference(smp::recv_from(c.a, smp::WORLD_RANK), build(c.obj, c.a));
      v.expect(d.empty(), "send " + std::to_string(c.a) + " -> " + std::to_string(c.b) + ": " + d);
    }
  } else {
    const auto members = smp::layout().members(me, group);
    const auto got = smp::allgather(build(c.obj, me), group);
    if (!v.expect(got.size() == members.size(), "allgather returned " + std::to_string(got.size()) + " objects"))
      return;
    for (size_t i = 0; i < got.size(); ++i) {
      const std::string d = ivalue_difference(got[i], build(c.obj, members[i]));
      v.expect(d.empty(), "allgather member " + std::to_string(i) + ": " + d);
    }
  }
}

// One run per layout of this world (communicators are made once per init).
TEST(SmpProperty, ObjectsRoundTrip) {
  torch::set_num_threads(1);
  const int n = mpi::world_size();
  for (int p = 1; p <= n; ++p) {
    if (n % p) continue;
    smp::Config cfg;
    cfg.partitions(p);
    smp::init(cfg);
    Seen seen;
    EXPECT_TRUE(check_lockstep<ObjectCase>("smp objects round-trip, " + std::to_string(p) + " partitions",
                                           gen_case(n, p), [&seen](const ObjectCase& c, Verdict& v) {
                                             const c10::IValue x = build(c.obj, 0);
                                             ++seen.cases;
                                             seen.count(x);
                                             seen.bytes += smp::message::encode_ivalue(x).size();
                                             run_case(c, v);
                                           }));
    seen.print(std::to_string(p) + " partitions");
  }
}

// The codec alone (no MPI): decode(encode(x)) == x.
TEST(SmpProperty, CodecRoundTrip) {
  EXPECT_TRUE(check_lockstep<ObjectCase>("smp codec round-trip", gen_case(mpi::world_size(), 1),
                                         [](const ObjectCase& c, Verdict& v) {
                                           const c10::IValue x = build(c.obj, mpi::world_rank());
                                           const std::string f = smp::message::encode_ivalue(x);
                                           const std::string d =
                                               ivalue_difference(smp::message::decode_ivalue(f.data(), f.size()), x);
                                           v.expect(d.empty(), d);
                                         }));
}

}  // namespace
}  // namespace partita::testing
