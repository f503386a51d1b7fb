#include "detail/agreement.hpp"

#include <climits>

#include "partita/mpi/runtime.hpp"

namespace partita::mpi::detail {

void agree(MPI_Comm comm, const char* what, const Fingerprint& f,
           const std::string& local_error, const char* subject, ErrorKind kind) {
  // max of {h, -h, failed} gives max(h), -min(h) and whether anyone failed.
  const int64_t h = static_cast<int64_t>(f.h >> 2);
  int64_t in[3] = {h, -h, local_error.empty() ? 0 : 1}, out[3];
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Iallreduce(in, out, 3, MPI_INT64_T, MPI_MAX, comm, &req));
  wait(req, what);
  if (out[2]) {
    // Share the first failing rank's message so every rank says the same.
    int me = 0;
    MPI_Comm_rank(comm, &me);
    int first_in = local_error.empty() ? INT_MAX : me, first = 0;
    PARTITA_MPI_CHECK(MPI_Iallreduce(&first_in, &first, 1, MPI_INT, MPI_MIN, comm, &req));
    wait(req, what);
    // The text travels with its class in front.
    std::string text = local_error.empty() ? std::string() : static_cast<char>(kind) + local_error;
    int64_t len = static_cast<int64_t>(text.size());
    PARTITA_MPI_CHECK(MPI_Ibcast(&len, 1, MPI_INT64_T, first, comm, &req));
    wait(req, what);
    text.resize(len);
    PARTITA_MPI_CHECK(MPI_Ibcast(text.data(), static_cast<int>(len), MPI_CHAR, first,
                                 comm, &req));
    wait(req, what);
    if (text.at(0) == static_cast<char>(ErrorKind::Shape)) throw ShapeError(text.substr(1));
    throw PartitionError(text.substr(1));
  }
  if (out[0] != -out[1])
    throw PartitionError(std::string(what) + ": the ranks of the collective passed different " +
                         subject);
}

}  // namespace partita::mpi::detail
