// partita::smp: seed 004's model-parallel common API in C++ (docs/smp.md).
//
//   partita::mpi::Environment env(&argc, &argv);
//   smp::init(smp::Config().partitions(2).microbatches(4));  // or smp::init()
//                                                           // from PARTITA_SMP_CONFIG
//   if (smp::rank() == 0) smp::broadcast(obj, smp::WORLD);
//   else obj = smp::recv_from(0, smp::WORLD_RANK);
//
// The world is dp_size x mp_size processes laid out as partita/smp/layout.hpp
// states (mp groups are consecutive ranks). Objects are c10::IValue (pickled
// with LibTorch's pickler; tensors travel beside the pickle in partita's own
// checked format), or trivially copyable values and std::string through the
// typed overloads. Every message is framed (magic, kind, type, length,
// checksum): bytes that are not the message the receiver asked for raise
// MessageError, never crash. Every wait follows partita's waiting policy,
// deadline and watchdog (docs/mpi-runtime.md).
//
// Synchronous, as the seed says: send and broadcast return only after every
// receiver has matched them with recv_from; allgather and barrier are
// collectives over the group.
//
// This header stays light: it does not include LibTorch (c10::IValue is
// declared, not defined; callers of the IValue overloads include torch).
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "partita/arg.hpp"
#include "partita/errors.hpp"
#include "partita/smp/layout.hpp"

namespace c10 {
struct IValue;
}

namespace partita::smp {

// A configuration that cannot run: not valid JSON, unknown or mistyped
// fields, partitions not dividing the world, zero microbatches, an unknown
// pipeline. Raised on every rank (init agrees on it).
struct ConfigError : Error {
  using Error::Error;
};
// Bytes that are not a valid message, or not the kind the receiver asked for
// (truncated, corrupted, wrong type), or an object that cannot be encoded.
struct MessageError : Error {
  using Error::Error;
};
// A call that cannot be right: before init, a rank out of range for its rank
// type, sending to or receiving from oneself.
struct UsageError : Error {
  using Error::Error;
};

// What a launcher passes (SageMaker's "mp_parameters"), set in LibTorch's
// style:
//   smp::Config().partitions(2).tensor_parallel_degree(2).microbatches(4)
// and read the same way (config.partitions()). JSON form:
//   {"partitions": 2, "tensor_parallel_degree": 2, "microbatches": 4,
//    "pipeline": "interleaved", "ddp": true}
// (and "virtual_pipeline_model_parallel_size": V with "interleaved_virtual")
// every field optional, no others allowed. Its fields are private: a braced
// list (`smp::init({2, 4})`) does not compile, so no positional value can
// land in another field than the one meant.
struct Config {
  // pipeline stages per replica: pp_size
  PARTITA_ARG(int, partitions) = 1;
  // ranks per stage: tp_size (SageMaker's key); mp_size = partitions x
  // tensor_parallel_degree
  PARTITA_ARG(int, tensor_parallel_degree) = 1;
  // pieces smp::step splits a batch into
  PARTITA_ARG(int, microbatches) = 1;
  // data parallelism: dp_size = world / mp_size; off: the world must be
  // exactly mp_size
  PARTITA_ARG(bool, ddp) = true;
  // Megatron-LM's name: model chunks (virtual stages) per pipeline rank,
  // more than 1 only with "interleaved_virtual" (docs/pipeline.md).
  PARTITA_ARG(int, virtual_pipeline_model_parallel_size) = 1;

 public:
  // The schedule, by smp's name or torch.distributed.pipelining's (either
  // case): "interleaved" = "1F1B" (plain 1F1B; SageMaker's word), "simple" =
  // "GPipe", "zero_bubble" = "ZBH1" (ZB-H1), "interleaved_virtual" =
  // "Interleaved1F1B" (Megatron's interleaved 1F1B with virtual stages).
  // Stored as smp's name; a name neither knows is kept as given and
  // refused by validate() and init().
  Config& pipeline(const std::string& name);
  const std::string& pipeline() const noexcept { return pipeline_; }

  // Throws ConfigError naming `source`, the field and what was expected.
  static Config from_json(const std::string& text, const std::string& source = "smp config");
  static Config from_json_file(const std::string& path);
  // The JSON held by the environment variable PARTITA_SMP_CONFIG; the
  // defaults when it is unset.
  static Config from_environment();
  std::string to_json() const;
  // Throws ConfigError unless this configuration can run on `world_size`
  // processes.
  void validate(int world_size) const;
  int mp_size() const;  // partitions x tensor_parallel_degree

 private:
  std::string pipeline_ = "interleaved";
};

// smp's name of a schedule given by either name (Config::pipeline), or ""
// when neither knows it.
std::string canonical_pipeline(const std::string& name);
// Every accepted schedule name, smp's and torch.distributed.pipelining's.
const char* pipeline_names();

inline constexpr const char* kConfigVariable = "PARTITA_SMP_CONFIG";

// Collective over MPI_COMM_WORLD (a partita::mpi::Environment must exist).
// Every rank checks its configuration; if any rank's is bad or the ranks'
// differ, every rank raises ConfigError. Calling init again replaces the
// configuration and the group communicators (also the way back after a
// DeadlineError in an smp call).
void init(const Config& config);
void init_from_file(const std::string& path);
void init();  // from PARTITA_SMP_CONFIG
bool initialized();
const Config& config();
const Layout& layout();

int rank();
int size();
int mp_rank();
int mp_size();
int dp_rank();
int dp_size();
int tp_rank();  // position in this stage's tensor-parallel group
int tp_size();  // tensor_parallel_degree
int pp_rank();  // this rank's pipeline stage
int pp_size();  // partitions
int local_rank();  // among the processes on this node (MPI shared-memory split)
int local_size();
std::vector<int> get_mp_group();  // world ranks of this rank's mp group, in mp-rank order
std::vector<int> get_dp_group();  // world ranks of this rank's dp group, in dp-rank order
std::vector<int> get_tp_group();  // world ranks of this rank's tp group, in tp-rank order
std::vector<int> get_pp_group();  // world ranks of this rank's pp group, in stage order

// --- object communication ---------------------------------------------------

// Sends `obj` to every other member of `group`; each must call recv_from.
// Returns when all of them have matched it.
void broadcast(const c10::IValue& obj, CommGroup group);
// Sends `obj` to `dest_rank` (read as `rank_type`); returns when the
// destination has matched it with recv_from.
void send(const c10::IValue& obj, int dest_rank, RankType rank_type);
// The next object from `src_rank` (read as `rank_type`), sent by send or
// broadcast.
c10::IValue recv_from(int src_rank, RankType rank_type);
// Every member's object, in group-rank order.
std::vector<c10::IValue> allgather(const c10::IValue& obj, CommGroup group);

void barrier(CommGroup group = CommGroup::WORLD);
void mp_barrier();
void dp_barrier();
void tp_barrier();
void pp_barrier();

// Typed overloads: trivially copyable values (bytes as they are, identified
// by type name and size: sender and receiver must be the same build) and
// std::string. recv_from<T> / allgather<T> raise MessageError when the
// message holds anything but a T.
template <typename T>
inline constexpr bool is_plain_v = std::is_trivially_copyable_v<T> && !std::is_pointer_v<T> &&
                                   !std::is_array_v<T> && !std::is_member_pointer_v<T>;
template <typename T>
inline constexpr bool is_typed_v = is_plain_v<T> || std::is_same_v<T, std::string>;

namespace detail {
using Frame = std::string;  // one framed message (partita/smp/message.hpp)
struct TypeName {
  const char* mangled;
  std::size_t size;
};
template <typename T>
TypeName type_name() {
  return {typeid(T).name(), sizeof(T)};
}
Frame frame_plain(const TypeName& type, const void* value);
Frame frame_string(const std::string& value);
void unframe_plain(const Frame& frame, const TypeName& type, void* out, const std::string& context);
std::string unframe_string(const Frame& frame, const std::string& context);

template <typename T>
Frame frame_of(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) return frame_string(value);
  else return frame_plain(type_name<T>(), &value);
}
template <typename T>
T unframe(const Frame& frame, const std::string& context) {
  if constexpr (std::is_same_v<T, std::string>) {
    return unframe_string(frame, context);
  } else {
    T out;
    unframe_plain(frame, type_name<T>(), &out, context);
    return out;
  }
}

// Transport of frames; `context` receives what the call was, for errors.
void broadcast_frame(const Frame& frame, CommGroup group);
void send_frame(const Frame& frame, int dest_rank, RankType rank_type);
Frame recv_frame(int src_rank, RankType rank_type, std::string* context);
std::vector<Frame> allgather_frames(const Frame& frame, CommGroup group, std::string* context);
}  // namespace detail

template <typename T, typename = std::enable_if_t<is_typed_v<T>>>
void broadcast(const T& obj, CommGroup group) {
  detail::broadcast_frame(detail::frame_of(obj), group);
}
template <typename T, typename = std::enable_if_t<is_typed_v<T>>>
void send(const T& obj, int dest_rank, RankType rank_type) {
  detail::send_frame(detail::frame_of(obj), dest_rank, rank_type);
}
template <typename T, typename = std::enable_if_t<is_typed_v<T>>>
T recv_from(int src_rank, RankType rank_type) {
  std::string context;
  const detail::Frame f = detail::recv_frame(src_rank, rank_type, &context);
  return detail::unframe<T>(f, context);
}
template <typename T, typename = std::enable_if_t<is_typed_v<T>>>
std::vector<T> allgather(const T& obj, CommGroup group) {
  std::string context;
  const auto frames = detail::allgather_frames(detail::frame_of(obj), group, &context);
  std::vector<T> out;
  out.reserve(frames.size());
  for (size_t i = 0; i < frames.size(); ++i)
    out.push_back(detail::unframe<T>(frames[i], context + ", member " + std::to_string(i)));
  return out;
}

}  // namespace partita::smp
