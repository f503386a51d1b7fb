// Partition::broadcast_data / allgather_data for tensors: a tensor travels
// as one payload, a header (dtype, number of dimensions, sizes) followed by
// its contiguous bytes, through the byte versions.
#include <ATen/ATen.h>

#include <cstring>

#include "partita/errors.hpp"
#include "partita/mpi/partition.hpp"

namespace partita::mpi {

namespace {

Bytes encode(const at::Tensor& t) {
  if (!t.defined()) return pack(std::vector<int64_t>{-1});
  // (Its values, not its bits: a conjugate or negative view's flags do not
  // travel.)
  const at::Tensor c = t.detach().resolve_conj().resolve_neg().contiguous();
  std::vector<int64_t> header{static_cast<int64_t>(c.scalar_type()), c.dim()};
  for (int64_t s : c.sizes()) header.push_back(s);
  Bytes out = pack(header);
  out.append(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  return out;
}

at::Tensor decode(const Bytes& bytes, const char* what) {
  auto fail = [&] { throw Error(std::string(what) + ": a payload that is not a tensor"); };
  if (bytes.size() < sizeof(int64_t)) fail();
  int64_t head[2] = {0, 0};
  std::memcpy(head, bytes.data(), std::min(sizeof head, bytes.size()));
  if (head[0] == -1) return at::Tensor();  // the root passed an undefined tensor
  if (bytes.size() < sizeof head || head[1] < 0 ||
      bytes.size() < (2 + static_cast<size_t>(head[1])) * sizeof(int64_t))
    fail();
  std::vector<int64_t> sizes(static_cast<size_t>(head[1]));
  if (!sizes.empty())
    std::memcpy(sizes.data(), bytes.data() + sizeof head, sizes.size() * sizeof(int64_t));
  const auto dtype = static_cast<at::ScalarType>(head[0]);
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype));
  const size_t offset = (2 + sizes.size()) * sizeof(int64_t);
  if (bytes.size() - offset != static_cast<size_t>(t.numel()) * t.element_size()) fail();
  if (t.numel() > 0) std::memcpy(t.data_ptr(), bytes.data() + offset, bytes.size() - offset);
  return t;
}

}  // namespace

at::Tensor Partition::broadcast_data(const at::Tensor& data, int root) const {
  if (!active()) return at::Tensor();
  // Only the root's tensor is read: the others need not encode theirs.
  const Bytes mine = rank() == root ? encode(data) : Bytes();
  return decode(broadcast_data(mine, root), "broadcast_data");
}

at::Tensor Partition::broadcast_data(const at::Tensor& data, int root,
                                     const Partition& P_data) const {
  if (!active()) return at::Tensor();
  const bool is_root = P_data.active() && P_data.rank() == root;
  return decode(broadcast_data(is_root ? encode(data) : Bytes(), root, P_data), "broadcast_data");
}

std::vector<at::Tensor> Partition::allgather_data(const at::Tensor& data) const {
  std::vector<at::Tensor> out;
  if (!active()) return out;
  for (const Bytes& b : allgather_data(encode(data))) out.push_back(decode(b, "allgather_data"));
  return out;
}

}  // namespace partita::mpi
