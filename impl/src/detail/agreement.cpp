#include "detail/agreement.hpp"

#include <climits>

#include "partita/mpi/runtime.hpp"

namespace partita::mpi::detail {

void agree(MPI_Comm comm, const char* what, const Fingerprint& f, const LocalError& local,
           const char* subject) {
  // max of {h, -h, failed} gives max(h), -min(h) and whether anyone failed.
  const int64_t h = static_cast<int64_t>(f.h >> 2);
  const bool failed = !local.text.empty();
  int64_t in[3] = {h, -h, failed ? 1 : 0}, out[3];
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Iallreduce(in, out, 3, MPI_INT64_T, MPI_MAX, comm, &req));
  wait(req, what);
  if (out[2]) {
    // Share the first failing rank's message so every rank says the same.
    int me = 0;
    MPI_Comm_rank(comm, &me);
    int first_in = failed ? me : INT_MAX, first = 0;
    PARTITA_MPI_CHECK(MPI_Iallreduce(&first_in, &first, 1, MPI_INT, MPI_MIN, comm, &req));
    wait(req, what);
    // The text travels as <class><rule code>'\n'<message>.
    std::string text =
        failed ? static_cast<char>(local.kind) + local.rule + '\n' + local.text : std::string();
    int64_t len = static_cast<int64_t>(text.size());
    PARTITA_MPI_CHECK(MPI_Ibcast(&len, 1, MPI_INT64_T, first, comm, &req));
    wait(req, what);
    text.resize(len);
    PARTITA_MPI_CHECK(MPI_Ibcast(text.data(), static_cast<int>(len), MPI_CHAR, first,
                                 comm, &req));
    wait(req, what);
    const size_t eol = text.find('\n');
    const std::string rule = text.substr(1, eol - 1), message = text.substr(eol + 1);
    if (text.at(0) == static_cast<char>(ErrorKind::Shape)) throw ShapeError(message, rule);
    throw PartitionError(message, rule);
  }
  if (out[0] != -out[1])
    throw PartitionError(std::string(what) + ": the ranks of the collective passed different " +
                         subject, rule_code::kArgumentsDiffer);
}

}  // namespace partita::mpi::detail
