#include "detail/box_view.hpp"

#include <ATen/Dispatch.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "detail/team_comm.hpp"
#include "partita/mpi/runtime.hpp"

namespace partita::mpi::detail {

BoxCopy box_copy(const Shape& src_full, const Box& src_box, const Shape& dst_full,
                 const Box& dst_box, int64_t elsize) {
  const size_t d = src_full.size();
  if (dst_full.size() != d || src_box.len.size() != d || dst_box.len != src_box.len ||
      src_box.start.size() != d || dst_box.start.size() != d)
    throw std::logic_error("box_copy: boxes of different shapes");
  BoxCopy c;
  if (src_box.size() <= 0) return c;  // run 0: nothing to copy
  std::vector<int64_t> ss(d), ds(d);  // strides in bytes
  int64_t s_acc = elsize, d_acc = elsize;
  for (size_t k = d; k-- > 0;) {
    ss[k] = s_acc;
    ds[k] = d_acc;
    s_acc *= src_full[k];
    d_acc *= dst_full[k];
  }
  for (size_t k = 0; k < d; ++k) {
    c.src_offset += src_box.start[k] * ss[k];
    c.dst_offset += dst_box.start[k] * ds[k];
  }
  if (d == 0) {
    c.run = elsize;
    return c;
  }
  const Shape& len = src_box.len;
  size_t inner = d - 1;  // the run spans dimensions inner..d-1
  int64_t run = len[inner];
  while (inner > 0 && len[inner] == src_full[inner] && len[inner] == dst_full[inner]) {
    --inner;
    run *= len[inner];
  }
  c.run = run * elsize;
  for (size_t k = 0; k < inner; ++k) {
    if (len[k] == 1) continue;  // a loop of one
    c.count.push_back(len[k]);
    c.src_stride.push_back(ss[k]);
    c.dst_stride.push_back(ds[k]);
  }
  return c;
}

BoxCopy box_pack(const Shape& full, const Box& box, int64_t elsize) {
  return box_copy(full, box, box.len, Box{Shape(box.len.size(), 0), box.len}, elsize);
}

BoxCopy box_unpack(const Shape& full, const Box& box, int64_t elsize) {
  return box_copy(box.len, Box{Shape(box.len.size(), 0), box.len}, full, box, elsize);
}

BoxRoute box_route(const Shape& full, const Box& box, int64_t elsize) {
  BoxRoute r;
  r.elements = box.size();
  if (r.elements <= 0) return r;
  r.offset = contiguous_offset(full, box);
  if (r.offset < 0) r.pack = box_pack(full, box, elsize);
  r.unpack = box_unpack(full, box, elsize);
  return r;
}

Staging::Staging(int64_t bytes) {
  if (bytes <= 0) return;
  if (bytes < (64 << 10)) {
    small.reset(new char[static_cast<size_t>(bytes)]);
    data = small.get();
  } else {
    large = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
    data = static_cast<char*>(large.data_ptr());
  }
}

namespace {
template <typename Run>
void run_loops(const BoxCopy& c, size_t level, const char* src, char* dst, const Run& f) {
  if (level == c.count.size()) {
    f(src, dst);
    return;
  }
  for (int64_t i = 0; i < c.count[level]; ++i)
    run_loops(c, level + 1, src + i * c.src_stride[level], dst + i * c.dst_stride[level], f);
}

void zero_loops(const BoxCopy& c, size_t level, char* dst) {
  if (level == c.count.size()) {
    std::memset(dst, 0, static_cast<size_t>(c.run));
    return;
  }
  for (int64_t i = 0; i < c.count[level]; ++i) zero_loops(c, level + 1, dst + i * c.dst_stride[level]);
}
}  // namespace

void BoxCopy::operator()(const void* src, void* dst) const {
  if (run == 0) return;
  const size_t n = static_cast<size_t>(run);
  run_loops(*this, 0, static_cast<const char*>(src) + src_offset, static_cast<char*>(dst) + dst_offset,
            [n](const char* s, char* d) { std::memcpy(d, s, n); });
}

void box_zero(const BoxCopy& c, void* dst) {
  if (c.run == 0) return;
  zero_loops(c, 0, static_cast<char*>(dst) + c.dst_offset);
}

void box_add(const BoxCopy& c, const void* src, void* dst, at::ScalarType type) {
  if (c.run == 0) return;
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, type, "box_add", [&] {
    const int64_t n = c.run / static_cast<int64_t>(sizeof(scalar_t));
    run_loops(c, 0, static_cast<const char*>(src) + c.src_offset,
              static_cast<char*>(dst) + c.dst_offset, [n](const char* s, char* d) {
                const auto* a = reinterpret_cast<const scalar_t*>(s);
                auto* b = reinterpret_cast<scalar_t*>(d);
                for (int64_t i = 0; i < n; ++i) b[i] = static_cast<scalar_t>(b[i] + a[i]);
              });
  });
}

BoxType::BoxType(const Shape& full, const Box& box, MPI_Datatype element, const std::string& what) {
  const int d = static_cast<int>(full.size());
  if (d == 0) {
    PARTITA_MPI_CHECK(MPI_Type_contiguous(1, element, &type_));
  } else {
    std::vector<int> sizes(d), subsizes(d), starts(d);
    for (int k = 0; k < d; ++k) {
      sizes[k] = mpi_count(full[k], what);
      subsizes[k] = mpi_count(box.len[k], what);
      starts[k] = mpi_count(box.start[k], what);
    }
    PARTITA_MPI_CHECK(MPI_Type_create_subarray(d, sizes.data(), subsizes.data(), starts.data(),
                                               MPI_ORDER_C, element, &type_));
  }
  PARTITA_MPI_CHECK(MPI_Type_commit(&type_));
}

BoxType::~BoxType() {
  // A layer's cached plans (plan_cache.hpp) may outlive MPI (a static
  // module destroyed at exit): MPI_Type_free is then not allowed.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (type_ != MPI_DATATYPE_NULL && !finalized) MPI_Type_free(&type_);
}

}  // namespace partita::mpi::detail
