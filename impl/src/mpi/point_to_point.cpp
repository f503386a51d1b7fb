// isend / irecv / wait and the dummies (seed 003).
//
// The graph of one isend (irecv is the mirror image):
//
//   t --> [IsendBackward] --> handle.dummy --> (join_dummies ...) --> [WaitBackward] --> wait's result
//
// In backward, WaitBackward starts the adjoint message (an irecv of the
// gradient from dest; for an irecv, an isend of the gradient to source) and
// IsendBackward, which the engine runs after it, waits for it and hands the
// received gradient to t. Between the two the engine is free to run other
// nodes: that is what lets a ring of ranks post all its adjoint receives
// before any of them waits, exactly as the forward program did, when the
// program orders its graph with join_dummies_handle (docs/communicator.md).
#include <ATen/ScalarOps.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <sstream>

#include "comm_internal.hpp"
#include "detail/team_comm.hpp"
#include "partita/errors.hpp"
#include "partita/mpi/runtime.hpp"

namespace partita::mpi {

using namespace detail;

Pending::~Pending() {
  if (request != MPI_REQUEST_NULL && buffer.defined()) keep_forever(std::move(buffer));
  if (adjoint_request != MPI_REQUEST_NULL && adjoint_buffer.defined()) keep_forever(std::move(adjoint_buffer));
  if (adjoint_header_request != MPI_REQUEST_NULL && adjoint_header) keep_forever(std::move(adjoint_header));
}

namespace {

using torch::autograd::variable_list;

// A zero-dimensional zero, written straight into its storage: at::zeros goes
// through the dispatcher and a TensorIterator for its one element, which a
// profile of the 4 KiB ring put at about a microsecond per call (two per
// isend/irecv pair, on every call).
at::Tensor zero_scalar(at::ScalarType type) {
  return at::detail::scalar_tensor_static(0, type, at::kCPU);
}

// The dummy of a handle without history: the one `slot` kept, when the
// caller dropped it, written zero again (docs/output-reuse.md's rules), else
// a new one; kept for the next handle.
at::Tensor plain_dummy(const OutputSlot& slot) {
  at::Tensor d = slot.take({}, at::TensorOptions().dtype(at::kDouble));
  *static_cast<double*>(d.data_ptr()) = 0.0;
  slot.keep(d);
  return d;
}

// Posts an adjoint receive of `p`'s shape on its (peer, tag): the header,
// then the gradient (the caller holds the order's mutex). The header says
// which send of this (peer, tag) the gradient is for.
void post_adjoint_receive(const Pending& p, AdjointRoute& route) {
  const CommState& s = *p.comm;
  const int adjoint_tag = p.tag + s.max_tag;
  auto slot = std::make_shared<AdjointSlot>();
  slot->header = std::make_shared<int64_t>(-1);
  slot->buffer = at::empty(p.sizes, p.options);
  PARTITA_MPI_CHECK(MPI_Irecv(slot->header.get(), 1, MPI_INT64_T, p.peer, adjoint_tag, s.comm, &slot->header_request));
  PARTITA_MPI_CHECK(MPI_Irecv(slot->buffer.data_ptr(), mpi_count(slot->buffer.numel(), p.name),
                              mpi_datatype(slot->buffer.scalar_type()), p.peer, adjoint_tag, s.comm, &slot->request));
  route.unread.push_back(std::move(slot));
}

// A send's gradient: reads the headers of the adjoint receives of its
// (peer, tag), oldest first, handing each receive to the send its header
// names, until one names `p`; then waits for that receive's data. The
// receive was posted for another send where the two ranks ran their
// backward in different orders: the same number of bytes is that send's
// gradient all the same (copied into `p`'s dtype where it differs); any
// other size raises.
at::Tensor adjoint_of_send(Pending& p, const std::string& what) {
  const CommState& s = *p.comm;
  while (!p.slot) {
    std::shared_ptr<AdjointSlot> slot;
    {
      std::lock_guard<std::mutex> lock(s.order->mutex);
      AdjointRoute& route = s.order->route(p.peer, p.tag);
      // Every receive posted so far went to other sends (the peer ran their
      // backward first while this rank ran this one's alone): this send's
      // gradient is still to come, in the next adjoint message.
      if (route.unread.empty()) post_adjoint_receive(p, route);
      slot = route.unread.front();
    }
    wait(slot->header_request, what.c_str());
    std::lock_guard<std::mutex> lock(s.order->mutex);
    AdjointRoute& route = s.order->route(p.peer, p.tag);
    route.unread.pop_front();
    const int64_t k = *slot->header;
    const auto it = k >= 0 ? route.sends.find(static_cast<uint64_t>(k)) : route.sends.end();
    const std::shared_ptr<Pending> q = it == route.sends.end() ? nullptr : it->second.lock();
    if (!q)
      throw Error(what + ": rank " + std::to_string(p.peer) + " sent the gradient of message " +
                  std::to_string(k) + " of this (peer, tag), whose wait has no backward on this rank "
                  "(its result recorded no history, or its graph is gone): the two ranks' graphs "
                  "disagree about which messages have gradients");
    route.sends.erase(it);
    q->slot = std::move(slot);
  }
  AdjointSlot& slot = *p.slot;
  const at::ScalarType type = slot.buffer.scalar_type();
  const int64_t got = wait_received(slot.request, mpi_datatype(type), what.c_str());
  int64_t want = static_cast<int64_t>(p.options.dtype().itemsize());
  for (const int64_t d : p.sizes) want *= d;
  if (got != slot.buffer.numel() || slot.buffer.nbytes() != static_cast<size_t>(want))
    throw ShapeError(what + ": the gradient came in " +
                     (got < 0 ? std::string("more bytes than, or not whole elements of,")
                              : std::to_string(got * slot.buffer.element_size()) + " bytes, not") +
                     " the " + std::to_string(want) + " of the message's tensor: the two ranks ran the backward of "
                     "several messages of one (peer, tag) in different orders, and messages of different "
                     "sizes cannot be told apart in flight; give each message its own tag, or run their "
                     "backward in one call (docs/communicator.md, \"Adjoint messages\")",
                     rule_code::kMessageSize);
  at::Tensor g = std::move(slot.buffer);
  if (g.scalar_type() != p.options.dtype().toScalarType() || g.sizes() != at::IntArrayRef(p.sizes)) {
    at::Tensor mine = at::empty(p.sizes, p.options);
    std::memcpy(mine.data_ptr(), g.data_ptr(), g.nbytes());
    g = mine;
  }
  p.slot.reset();
  return g;
}

// Runs after WaitBackward: waits for the adjoint message and returns the
// input's gradient.
struct NonBlockingBackward : torch::autograd::Node {
  std::shared_ptr<Pending> p;
  variable_list apply(variable_list&&) override {
    if (!p->adjoint_started)
      throw Error(p->what() +
                  ": its backward ran but its wait's backward did not: the result of wait() is "
                  "not connected to the loss, so the adjoint message was never started (join "
                  "it with join_dummies, as seed 003 explains)");
    if (p->adjoint_waited) throw Error(p->what() + ": backward ran twice");
    const std::string adjoint = p->what() + " adjoint";
    at::Tensor g;
    if (p->kind == Pending::kSend) {
      g = adjoint_of_send(*p, adjoint);
    } else {
      wait(p->adjoint_header_request, adjoint.c_str());
      wait(p->adjoint_request, adjoint.c_str());
      // A received buffer is overwritten: its gradient is zero (a
      // zero-stride view, no memory).
      g = zero_scalar(p->options.dtype().toScalarType()).expand(p->sizes);
    }
    p->adjoint_waited = true;
    p->adjoint_buffer = at::Tensor();
    return {g};
  }
  std::string name() const override {
    return p->kind == Pending::kSend ? "IsendBackward" : "IrecvBackward";
  }
};

struct WaitBackward : torch::autograd::Node {
  std::shared_ptr<Pending> p;
  variable_list apply(variable_list&& grads) override {
    if (p->adjoint_started) throw Error(p->what() + ": wait's backward ran twice");
    const CommState& s = *p->comm;
    const int adjoint_tag = p->tag + s.max_tag;
    if (p->kind == Pending::kSend) {
      // An adjoint receive of this send's shape, unless another send's
      // backward already handed this one the receive its gradient came in.
      std::lock_guard<std::mutex> lock(s.order->mutex);
      if (!p->slot) post_adjoint_receive(*p, s.order->route(p->peer, p->tag));
    } else {
      at::Tensor g = grads.empty() || !grads[0].defined() ? at::zeros(p->sizes, p->options)
                                                           : grads[0];
      // Held until the send is done; the engine does not write into a
      // gradient it does not own alone (AccumulateGrad copies it then).
      p->adjoint_buffer = g.to(p->options.dtype()).contiguous();
      p->adjoint_header = std::make_shared<int64_t>(static_cast<int64_t>(p->index));
      PARTITA_MPI_CHECK(MPI_Isend(p->adjoint_header.get(), 1, MPI_INT64_T, p->peer, adjoint_tag, s.comm,
                                  &p->adjoint_header_request));
      PARTITA_MPI_CHECK(MPI_Isend(p->adjoint_buffer.data_ptr(),
                                  mpi_count(p->adjoint_buffer.numel(), p->name),
                                  mpi_datatype(p->adjoint_buffer.scalar_type()), p->peer,
                                  adjoint_tag, s.comm, &p->adjoint_request));
    }
    p->adjoint_started = true;
    // The dummy's gradient: a value nobody reads, only the edge matters.
    return {zero_scalar(at::kDouble)};
  }
  std::string name() const override { return "WaitBackward"; }
};

// Zeros to every dummy (mpi4torch's JoinDummiesBackward gives each its
// zeros_like): a leaf dummy's .grad is zeros after backward, as it is there
// (issue 33). The zeros are a zero-stride view of one scalar: nothing to
// allocate or fill; AccumulateGrad turns them into a dense .grad, and where a
// dummy is also used for its values (the ring's b) the engine adds them to
// its other gradient. The one exception is a dummy whose node is an
// isend/irecv's (a handle's dummy): that node never reads the value of its
// gradient, only waits for it, so it gets none, as before.
at::Tensor zeros_of(const std::vector<int64_t>& sizes, at::ScalarType type) {
  return zero_scalar(type).expand(sizes);
}

struct JoinDummiesBackward : torch::autograd::Node {
  std::vector<std::vector<int64_t>> sizes;
  std::vector<at::ScalarType> types;
  variable_list apply(variable_list&& grads) override {
    variable_list out(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      const auto& next = next_edge(i);
      if (!next.is_valid()) continue;
      if (i == 0 && !grads.empty() && grads[0].defined()) {
        out[0] = std::move(grads[0]);
        continue;
      }
      // The loopthrough without a gradient (this node ran because the join
      // is in the graph, e.g. as another join's dummy) is zero, like a dummy.
      if (dynamic_cast<const NonBlockingBackward*>(next.function.get())) continue;
      out[i] = zeros_of(sizes[i], types[i]);
    }
    return out;
  }
  std::string name() const override { return "JoinDummiesBackward"; }
};

void check_peer(const CommState& s, int peer, int tag, const char* call, const char* role) {
  if (peer < 0 || peer >= s.size)
    throw ShapeError(std::string("Communicator::") + call + ": " + role + " " +
                     std::to_string(peer) + " is out of range for a communicator of " +
                     std::to_string(s.size) + " ranks");
  if (tag < 0 || tag >= s.max_tag)
    throw ShapeError(std::string("Communicator::") + call + ": tag " + std::to_string(tag) +
                     " is out of range [0, " + std::to_string(s.max_tag) + ")");
}

WaitHandle start(const std::shared_ptr<CommState>& state, const at::Tensor& t, int peer, int tag,
                 Pending::Kind kind) {
  const CommState& s = *state;
  const char* call = kind == Pending::kSend ? "isend" : "irecv";
  check_peer(s, peer, tag, call, kind == Pending::kSend ? "dest" : "source");
  Record r = make_record(t);
  if (r.status) raise_record(std::string("Communicator::") + call, s.rank, r);
  auto p = std::make_shared<Pending>();
  {
    std::lock_guard<std::mutex> lock(s.order->mutex);
    AdjointRoute& route = s.order->route(peer, tag);
    p->index = kind == Pending::kSend ? route.sent++ : route.received++;
  }
  p->kind = kind;
  p->comm = state;
  p->peer = peer;
  p->tag = tag;
  p->set_name(kind, peer, tag);
  p->sizes = at::DimVector(t.sizes());
  p->options = t.options().requires_grad(false);
  const MPI_Datatype type = mpi_datatype(t.scalar_type());
  // Before the buffer is allocated (issue 35 item 5). The peer cannot see
  // this rank's count, so a message still travels in place of the data
  // (docs/bad-inputs.md): a send above the limit posts an empty notice and
  // raises here, so that its receive, if it fits, raises input.message_size
  // at its wait instead of waiting for data that never comes; a receive
  // above the limit posts a receive of nothing, which takes whatever its
  // send posted (the notice, or data, truncated) off the communicator, and
  // raises input.count_overflow at its wait.
  int n = 0;
  try {
    n = mpi_count(t.numel(), p->name);
  } catch (const ShapeError&) {
    if (kind == Pending::kSend) {
      MPI_Request notice = MPI_REQUEST_NULL;
      PARTITA_MPI_CHECK(MPI_Isend(nullptr, 0, type, peer, tag, s.comm, &notice));
      MPI_Request_free(&notice);  // no data: nothing to wait for
      throw;
    }
    p->overflow = p->what() + ": a count of " + std::to_string(t.numel()) +
                  " elements, above the MPI count limit (INT_MAX = 2147483647); nothing was "
                  "received (the receive of nothing took its send's message off the "
                  "communicator)";
    PARTITA_MPI_CHECK(MPI_Irecv(nullptr, 0, type, peer, tag, s.comm, &p->request));
    return WaitHandle(p, zero_scalar(at::kDouble));
  }
  {
    // The send holds the input itself (its storage is what matters; wait
    // returns a detached alias), not a detached copy of its TensorImpl.
    at::NoGradGuard no_grad;
    p->buffer = kind == Pending::kSend ? t.contiguous() : s.irecv_out.take(p->sizes, p->options);
  }
  if (kind == Pending::kSend)
    PARTITA_MPI_CHECK(MPI_Isend(p->buffer.data_ptr(), n, type, peer, tag, s.comm, &p->request));
  else
    PARTITA_MPI_CHECK(MPI_Irecv(p->buffer.data_ptr(), n, type, peer, tag, s.comm, &p->request));
  if (!torch::autograd::compute_requires_grad(t))
    return WaitHandle(p, plain_dummy(kind == Pending::kSend ? s.send_dummy : s.recv_dummy));
  at::Tensor dummy = zero_scalar(at::kDouble);
  {
    auto node = std::shared_ptr<NonBlockingBackward>(new NonBlockingBackward(),
                                                     torch::autograd::deleteNode);
    node->p = p;
    node->set_next_edges(torch::autograd::collect_next_edges(t));
    torch::autograd::set_history(dummy, node);
  }
  return WaitHandle(p, dummy);
}

// A receive whose message did not fill its tensor exactly (docs/bad-inputs.md,
// "A receive of another size than its send"). `got`: the elements that came,
// -1 when the message was larger than the tensor (MPI truncated it).
[[noreturn]] void throw_message_size(const Pending& p, int64_t got) {
  std::ostringstream os;
  os << "Communicator::wait: " << p.what() << ": ";
  if (got < 0)
    os << "the message was larger than";
  else if (got == 0)
    os << "the message was empty (as is the notice a send above MPI's count limit posts "
          "in place of its data, while it raises input.count_overflow), smaller than";
  else
    os << "the message held " << got << " elements, fewer than";
  os << " the receive's tensor of shape " << at::IntArrayRef(p.sizes) << " ("
     << p.buffer.numel() << " elements of " << p.options.dtype()
     << "): a receive's tensor must have the shape and dtype of its send's";
  if (got != 0)
    os << " (rank " << p.peer << "'s send was of another size; MPI tells a sender nothing of "
       << "its receive, so that rank's send completed as usual)";
  throw ShapeError(os.str(), rule_code::kMessageSize);
}

}  // namespace

WaitHandle Communicator::isend(const at::Tensor& t, int dest, int tag) const {
  state_of(s_, "isend");
  return start(s_, t, dest, tag, Pending::kSend);
}

WaitHandle Communicator::irecv(const at::Tensor& t, int source, int tag) const {
  state_of(s_, "irecv");
  return start(s_, t, source, tag, Pending::kRecv);
}

at::Tensor Communicator::wait(const WaitHandle& handle) const {
  state_of(s_, "wait");
  if (!handle.valid()) throw Error("Communicator::wait: the handle was not made by isend or irecv");
  const auto& p = handle.pending();
  if (p->waited)
    throw Error("Communicator::wait: " + p->what() +
                " was already waited on (a handle, or one joined from it with "
                "join_dummies_handle, is waited on once)");
  p->waited = true;
  if (p->kind == Pending::kRecv) {
    const MPI_Datatype type = mpi_datatype(p->options.dtype().toScalarType());
    const int64_t got = wait_received(p->request, type, p->name);
    if (!p->overflow.empty()) throw ShapeError(p->overflow, rule_code::kCountOverflow);
    if (got != p->buffer.numel()) throw_message_size(*p, got);
  } else {
    mpi::wait(p->request, p->name);
  }
  // An isend's wait returns the sent values (mpi4torch); an irecv's what came.
  // A receive's buffer is fresh and nobody else's: it is the result. A
  // send's buffer that does not require grad, in a wait without history, is
  // returned itself (the input, when it was contiguous), as the in-place
  // calls return theirs; otherwise a detached alias of it.
  const bool history = torch::autograd::compute_requires_grad(handle.dummy());
  at::Tensor out;
  if (p->kind == Pending::kRecv) {
    out = std::move(p->buffer);
    p->buffer = at::Tensor();
  } else if (!history && !p->buffer.requires_grad()) {
    out = p->buffer;
  } else {
    at::NoGradGuard no_grad;
    out = alias_of(p->buffer);
  }
  if (history) {
    if (p->kind == Pending::kSend) {
      // Its gradient will come with its index (adjoint_of_send), on the
      // communicator the send was made on; sends whose graph is gone are
      // forgotten each time the list has doubled.
      const CommState& sent_on = *p->comm;
      std::lock_guard<std::mutex> lock(sent_on.order->mutex);
      AdjointRoute& route = sent_on.order->route(p->peer, p->tag);
      if (route.sends.size() >= 2 * std::max<size_t>(route.swept_at, 16)) {
        for (auto it = route.sends.begin(); it != route.sends.end();)
          it = it->second.expired() ? route.sends.erase(it) : std::next(it);
        route.swept_at = route.sends.size();
      }
      route.sends.emplace(p->index, p);
    }
    auto node = std::shared_ptr<WaitBackward>(new WaitBackward(), torch::autograd::deleteNode);
    node->p = p;
    node->set_next_edges(torch::autograd::collect_next_edges(handle.dummy()));
    torch::autograd::set_history(out, node);
  } else if (p->kind == Pending::kRecv) {
    p->comm->irecv_out.keep(out);  // for the next irecv, when the caller drops it
  }
  return out;
}

at::Tensor Communicator::send(const at::Tensor& t, int dest, int tag) const {
  return wait(isend(t, dest, tag));
}

at::Tensor Communicator::recv(const at::Tensor& t, int source, int tag) const {
  return wait(irecv(t, source, tag));
}

at::Tensor join_dummies(const at::Tensor& loopthrough, const std::vector<at::Tensor>& dummies) {
  bool any = false;
  for (const auto& d : dummies) any = any || torch::autograd::compute_requires_grad(d);
  if (!any) return loopthrough;
  auto node = std::shared_ptr<JoinDummiesBackward>(new JoinDummiesBackward(),
                                                   torch::autograd::deleteNode);
  torch::autograd::edge_list edges;
  edges.push_back(torch::autograd::impl::gradient_edge(loopthrough));
  node->sizes.push_back(loopthrough.sizes().vec());
  node->types.push_back(loopthrough.scalar_type());
  for (const auto& d : dummies) {
    // Only a dummy that requires grad gets an edge (and so a gradient).
    const bool edge = d.defined() && torch::autograd::compute_requires_grad(d);
    edges.push_back(edge ? torch::autograd::impl::gradient_edge(d) : torch::autograd::Edge());
    node->sizes.push_back(d.defined() ? d.sizes().vec() : std::vector<int64_t>{});
    node->types.push_back(d.defined() ? d.scalar_type() : at::kDouble);
  }
  node->set_next_edges(std::move(edges));
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = alias_of(loopthrough);
  }
  torch::autograd::set_history(out, node);
  return out;
}

WaitHandle join_dummies_handle(const WaitHandle& handle, const std::vector<at::Tensor>& dummies) {
  if (!handle.valid())
    throw Error("join_dummies_handle: the handle was not made by isend or irecv");
  return WaitHandle(handle.pending(), join_dummies(handle.dummy(), dummies));
}

}  // namespace partita::mpi
