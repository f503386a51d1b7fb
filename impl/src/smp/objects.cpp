// The IValue overloads of smp's object communication: encode with LibTorch's
// pickler (message.cpp), move frames (runtime.cpp), decode.
//
// An object the sender cannot encode still travels, as an error frame: every
// receiver raises MessageError with the sender's reason instead of waiting
// for a message that never comes, and the sender raises it too.
#include <ATen/core/ivalue.h>

#include <optional>

#include "partita/smp.hpp"
#include "partita/smp/message.hpp"

namespace partita::smp {

namespace {

struct Encoded {
  detail::Frame frame;
  std::optional<MessageError> error;
};

Encoded encode(const c10::IValue& obj) {
  std::string frame;
  try {
    frame = message::encode_ivalue(obj);
  } catch (const MessageError& e) {
    return {message::error_frame(e.what()), e};
  }
  // One message carries at most INT_MAX bytes (MPI's int count).
  message::OneMessage m = message::one_message(std::move(frame));
  if (!m.error.empty()) return {std::move(m.frame), MessageError(m.error)};
  return {std::move(m.frame), std::nullopt};
}

c10::IValue decode(const detail::Frame& f, const std::string& context) {
  try {
    return message::decode_ivalue(f.data(), f.size());
  } catch (const MessageError& e) {
    throw MessageError(context + ": " + e.what());
  }
}

}  // namespace

void broadcast(const c10::IValue& obj, CommGroup group) {
  const Encoded e = encode(obj);
  detail::broadcast_frame(e.frame, group);
  if (e.error) throw MessageError(std::string("smp::broadcast(") + name(group) + "): " + e.error->what());
}

void send(const c10::IValue& obj, int dest_rank, RankType rank_type) {
  const Encoded e = encode(obj);
  detail::send_frame(e.frame, dest_rank, rank_type);
  if (e.error) throw MessageError("smp::send: " + std::string(e.error->what()));
}

c10::IValue recv_from(int src_rank, RankType rank_type) {
  std::string context;
  const detail::Frame f = detail::recv_frame(src_rank, rank_type, &context);
  return decode(f, context);
}

std::vector<c10::IValue> allgather(const c10::IValue& obj, CommGroup group) {
  const Encoded e = encode(obj);
  std::string context;
  const auto frames = detail::allgather_frames(e.frame, group, &context);
  std::vector<c10::IValue> out;
  out.reserve(frames.size());
  for (size_t i = 0; i < frames.size(); ++i)
    out.push_back(decode(frames[i], context + ", member " + std::to_string(i)));
  return out;
}

}  // namespace partita::smp
