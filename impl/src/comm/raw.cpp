// The communicator's data movement without autograd: every forward call and
// every adjoint is one of these. Each starts one non-blocking MPI collective
// and finishes it through mpi::wait (test + yield, deadline mode). Tensors
// are moved with the communicated axis in front, so that every rank's piece
// is one contiguous block (one copy when the axis is not already first).
#include <numeric>

#include "comm_internal.hpp"
#include "detail/team_comm.hpp"
#include "partita/mpi/runtime.hpp"

namespace partita::mpi::detail {

namespace {

// Elements per unit of length along `axis`.
int64_t row_volume(at::IntArrayRef sizes, int64_t axis) {
  int64_t v = 1;
  for (int64_t d = 0; d < static_cast<int64_t>(sizes.size()); ++d)
    if (d != axis) v *= sizes[d];
  return v;
}

// MPI counts and displacements of pieces of `extents` rows of `row` elements.
void counts_of(const std::vector<int64_t>& extents, int64_t row, const std::string& what,
               std::vector<int>& counts, std::vector<int>& displs) {
  counts.clear();
  displs.clear();
  int64_t at = 0;
  for (int64_t e : extents) {
    displs.push_back(mpi_count(at * row, what));
    counts.push_back(mpi_count(e * row, what));
    at += e;
  }
  mpi_count(at * row, what);
}

int64_t total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

at::Tensor front_of(const at::Tensor& x, int64_t axis) {
  return axis == 0 ? x.contiguous() : x.movedim(axis, 0).contiguous();
}
at::Tensor back_from(const at::Tensor& front, int64_t axis) {
  return axis == 0 ? front : front.movedim(0, axis).contiguous();
}

}  // namespace

at::Tensor raw_allreduce(const CommState& s, const at::Tensor& x, ReduceOp op,
                         const std::string& what) {
  // MPI reads the input and writes a fresh output: no copy of our own.
  const at::Tensor in = x.contiguous();
  if (s.size == 1 || in.numel() == 0) return in.clone();
  at::Tensor out = at::empty(in.sizes(), in.options());
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Iallreduce(in.data_ptr(), out.data_ptr(), mpi_count(in.numel(), what),
                                   comm_datatype(in.scalar_type()), comm_op(op, in.scalar_type()),
                                   s.comm, &req));
  wait(req, what.c_str());
  return out;
}

void raw_bcast(const CommState& s, at::Tensor& buf, int root, const std::string& what) {
  if (s.size == 1 || buf.numel() == 0) return;
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Ibcast(buf.data_ptr(), mpi_count(buf.numel(), what),
                               comm_datatype(buf.scalar_type()), root, s.comm, &req));
  wait(req, what.c_str());
}

void raw_reduce(const CommState& s, at::Tensor& buf, ReduceOp op, int root,
                const std::string& what) {
  if (s.size > 1 && buf.numel() > 0) {
    MPI_Request req;
    const bool me = s.rank == root;
    PARTITA_MPI_CHECK(MPI_Ireduce(me ? MPI_IN_PLACE : buf.data_ptr(), me ? buf.data_ptr() : nullptr,
                                  mpi_count(buf.numel(), what), comm_datatype(buf.scalar_type()),
                                  comm_op(op, buf.scalar_type()), root, s.comm, &req));
    wait(req, what.c_str());
  }
  if (s.rank != root) buf.zero_();  // mpi4torch: zeros off the root
}

at::Tensor reduce_sum_to(const CommState& s, const at::Tensor& x, int root,
                         const std::string& what) {
  const at::Tensor in = x.contiguous();
  if (s.size == 1) return in.clone();
  const bool me = s.rank == root;
  at::Tensor out = me ? at::empty(in.sizes(), in.options()) : at::Tensor();
  if (in.numel() > 0) {
    MPI_Request req;
    PARTITA_MPI_CHECK(MPI_Ireduce(in.data_ptr(), me ? out.data_ptr() : nullptr,
                                  mpi_count(in.numel(), what), comm_datatype(in.scalar_type()),
                                  comm_op(ReduceOp::kSum, in.scalar_type()), root, s.comm, &req));
    wait(req, what.c_str());
  }
  return me ? out : at::zeros(in.sizes(), in.options());
}

at::Tensor bcast_from(const CommState& s, const at::Tensor& x, int root, const std::string& what) {
  // The root only reads its tensor: it is returned as it is.
  at::Tensor buf = s.rank == root ? x.contiguous() : at::empty(x.sizes(), x.options());
  raw_bcast(s, buf, root, what);
  return buf;
}

at::Tensor raw_gather(const CommState& s, const at::Tensor& x, int64_t axis,
                      const std::vector<int64_t>& extents, int root, const std::string& what) {
  const at::Tensor front = front_of(x, axis);
  const int64_t row = row_volume(x.sizes(), axis);
  std::vector<int> counts, displs;
  counts_of(extents, row, what, counts, displs);
  std::vector<int64_t> out_sizes = front.sizes().vec();
  out_sizes[0] = s.rank == root ? total(extents) : 0;
  at::Tensor out = at::empty(out_sizes, front.options());
  if (s.size == 1) {
    out.copy_(front);
  } else {
    MPI_Request req;
    const MPI_Datatype type = comm_datatype(x.scalar_type());
    PARTITA_MPI_CHECK(MPI_Igatherv(front.data_ptr(), mpi_count(front.numel(), what), type,
                                   out.data_ptr(), counts.data(), displs.data(), type, root,
                                   s.comm, &req));
    wait(req, what.c_str());
  }
  return back_from(out, axis);
}

at::Tensor raw_allgather(const CommState& s, const at::Tensor& x, int64_t axis,
                         const std::vector<int64_t>& extents, const std::string& what) {
  const at::Tensor front = front_of(x, axis);
  const int64_t row = row_volume(x.sizes(), axis);
  std::vector<int> counts, displs;
  counts_of(extents, row, what, counts, displs);
  std::vector<int64_t> out_sizes = front.sizes().vec();
  out_sizes[0] = total(extents);
  at::Tensor out = at::empty(out_sizes, front.options());
  if (s.size == 1) {
    out.copy_(front);
  } else if (out.numel() > 0) {
    MPI_Request req;
    const MPI_Datatype type = comm_datatype(x.scalar_type());
    iallgather_blocks(front.data_ptr(), mpi_count(front.numel(), what), type, out.data_ptr(),
                      counts, displs, s.comm, &req);
    wait(req, what.c_str());
  }
  return back_from(out, axis);
}

at::Tensor raw_reduce_scatter(const CommState& s, const at::Tensor& x, int64_t axis,
                              const std::vector<int64_t>& extents, const std::string& what) {
  const at::Tensor front = front_of(x, axis);
  const int64_t row = row_volume(x.sizes(), axis);
  std::vector<int> counts, displs;
  counts_of(extents, row, what, counts, displs);
  std::vector<int64_t> out_sizes = front.sizes().vec();
  out_sizes[0] = extents.at(s.rank);
  at::Tensor out = at::empty(out_sizes, front.options());
  if (s.size == 1) {
    out.copy_(front);
  } else if (front.numel() > 0) {
    MPI_Request req;
    PARTITA_MPI_CHECK(MPI_Ireduce_scatter(front.data_ptr(), out.data_ptr(), counts.data(),
                                          comm_datatype(x.scalar_type()),
                                          comm_op(ReduceOp::kSum, x.scalar_type()), s.comm,
                                          &req));
    wait(req, what.c_str());
  }
  return back_from(out, axis);
}

at::Tensor raw_scatter(const CommState& s, const at::Tensor& x, int64_t axis,
                       const std::vector<int64_t>& extents, int root, const Shape& root_shape,
                       const at::TensorOptions& options, const std::string& what) {
  const int64_t row = row_volume(root_shape, axis);
  std::vector<int> counts, displs;
  counts_of(extents, row, what, counts, displs);
  // This rank's piece, axis in front.
  Shape front_shape = root_shape;
  front_shape.erase(front_shape.begin() + axis);
  front_shape.insert(front_shape.begin(), extents.at(s.rank));
  at::Tensor out = at::empty(front_shape, options);
  at::Tensor front;
  if (s.rank == root) front = front_of(x, axis);
  if (s.size == 1) {
    out.copy_(front);
  } else {
    MPI_Request req;
    const MPI_Datatype type = comm_datatype(options.dtype().toScalarType());
    PARTITA_MPI_CHECK(MPI_Iscatterv(s.rank == root ? front.data_ptr() : nullptr, counts.data(),
                                    displs.data(), type, out.data_ptr(),
                                    mpi_count(out.numel(), what), type, root, s.comm, &req));
    wait(req, what.c_str());
  }
  return back_from(out, axis);
}

at::Tensor raw_alltoall(const CommState& s, const at::Tensor& x, int64_t gather_axis,
                        int64_t scatter_axis, const std::vector<int64_t>& gextents,
                        const std::vector<int64_t>& numelem, const std::string& what) {
  const int p = s.size, me = s.rank;
  const at::Tensor front = front_of(x, scatter_axis);
  // Elements per row along scatter_axis, for rank i's tensor.
  auto row_of = [&](int i) {
    auto sizes = x.sizes().vec();
    sizes[gather_axis] = gextents[i];
    return row_volume(sizes, scatter_axis);
  };
  std::vector<int64_t> send_rows(p), send_at(p), recv_rows(p);
  if (gather_axis != scatter_axis) {
    // Piece j of every rank is rows [N_j, N_j + numelem_j) along scatter_axis.
    int64_t at = 0;
    for (int j = 0; j < p; ++j) {
      send_at[j] = at;
      send_rows[j] = numelem[j];
      recv_rows[j] = numelem[me];
      at += numelem[j];
    }
  } else {
    // The concatenation of every rank's tensor along the axis, re-split:
    // rank i's rows [C_i, C_i + g_i) overlap rank j's [N_j, N_j + n_j).
    std::vector<int64_t> C(p + 1, 0), N(p + 1, 0);
    for (int i = 0; i < p; ++i) {
      C[i + 1] = C[i] + gextents[i];
      N[i + 1] = N[i] + numelem[i];
    }
    auto overlap = [&](int i, int j, int64_t* start) {
      const int64_t lo = std::max(C[i], N[j]), hi = std::min(C[i + 1], N[j + 1]);
      if (start) *start = lo - C[i];
      return std::max<int64_t>(0, hi - lo);
    };
    for (int j = 0; j < p; ++j) {
      send_rows[j] = overlap(me, j, &send_at[j]);
      recv_rows[j] = overlap(j, me, nullptr);
    }
  }
  std::vector<int> scounts(p), sdispls(p), rcounts(p), rdispls(p);
  int64_t rtotal = 0;
  for (int j = 0; j < p; ++j) {
    scounts[j] = mpi_count(send_rows[j] * row_of(me), what);
    sdispls[j] = mpi_count(send_at[j] * row_of(me), what);
    rdispls[j] = mpi_count(rtotal, what);
    rcounts[j] = mpi_count(recv_rows[j] * (gather_axis == scatter_axis ? row_of(me) : row_of(j)),
                           what);
    rtotal += rcounts[j];
  }
  at::Tensor recv = at::empty({rtotal}, x.options());
  if (p == 1) {
    recv.copy_(front.reshape({-1}).narrow(0, send_at[0] * row_of(0), rtotal));
  } else {
    MPI_Request req;
    const MPI_Datatype type = comm_datatype(x.scalar_type());
    // Equal blocks everywhere: every rank sends every other the same
    // number of rows of the same extents (numelem and gextents are agreed).
    const bool uniform =
        gather_axis != scatter_axis &&
        std::all_of(numelem.begin(), numelem.end(), [&](int64_t n) { return n == numelem[0]; }) &&
        std::all_of(gextents.begin(), gextents.end(), [&](int64_t g) { return g == gextents[0]; });
    ialltoall_blocks(uniform, front.data_ptr(), scounts, sdispls, recv.data_ptr(), rcounts,
                     rdispls, type, s.comm, &req);
    wait(req, what.c_str());
  }
  // The received blocks, each with scatter_axis in front.
  std::vector<int64_t> fsizes = front.sizes().vec();
  if (gather_axis == scatter_axis) {
    fsizes[0] = numelem[me];
    return back_from(recv.view(fsizes), scatter_axis);
  }
  // Position of gather_axis in the front layout.
  const int64_t g_front = gather_axis < scatter_axis ? gather_axis + 1 : gather_axis;
  std::vector<at::Tensor> pieces;
  bool in_place = true;  // is the receive buffer already the output's layout?
  std::vector<int64_t> out_sizes = x.sizes().vec();
  out_sizes[scatter_axis] = numelem[me];
  out_sizes[gather_axis] = 0;
  for (int i = 0; i < p; ++i) {
    fsizes[0] = numelem[me];
    fsizes[g_front] = gextents[i];
    at::Tensor piece = recv.narrow(0, rdispls[i], rcounts[i]).view(fsizes);
    if (scatter_axis != 0) piece = piece.movedim(0, scatter_axis);
    in_place = in_place && piece.is_contiguous();
    pieces.push_back(piece);
    out_sizes[gather_axis] += gextents[i];
  }
  // The pieces follow each other in memory when every one is contiguous in
  // the output's layout and nothing outside them precedes gather_axis:
  // then the buffer is the output (no copy), else one concatenation.
  for (int64_t d = 0; d < gather_axis; ++d) in_place = in_place && out_sizes[d] == 1;
  if (in_place) return recv.view(out_sizes);
  return at::cat(pieces, gather_axis);
}

}  // namespace partita::mpi::detail
