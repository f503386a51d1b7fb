#include "detail/agreement.hpp"

#include <climits>
#include <memory>
#include <string>

#include "partita/mpi/runtime.hpp"

namespace partita::mpi::detail {

void agree(MPI_Comm comm, const char* what, const Fingerprint& f, const LocalError& local,
           const char* subject) {
  // max of {h, -h, failed} gives max(h), -min(h) and whether anyone failed.
  // Every buffer on the heap, kept where a wait gives its operation up.
  struct Held {
    int64_t in[3], out[3];
    int first_in = INT_MAX, first = 0;
    int64_t len = 0;
    std::string text;
  };
  const auto held = std::make_shared<Held>();
  const int64_t h = static_cast<int64_t>(f.h >> 2);
  const bool failed = !local.text.empty();
  held->in[0] = h;
  held->in[1] = -h;
  held->in[2] = failed ? 1 : 0;
  MPI_Request req;
  PARTITA_MPI_CHECK(MPI_Iallreduce(held->in, held->out, 3, MPI_INT64_T, MPI_MAX, comm, &req));
  wait_holding(req, what, held);
  if (held->out[2]) {
    // Share the first failing rank's message so every rank says the same.
    int me = 0;
    MPI_Comm_rank(comm, &me);
    held->first_in = failed ? me : INT_MAX;
    PARTITA_MPI_CHECK(MPI_Iallreduce(&held->first_in, &held->first, 1, MPI_INT, MPI_MIN, comm, &req));
    wait_holding(req, what, held);
    // The text travels as <class><rule code>'\n'<message>.
    held->text = failed ? static_cast<char>(local.kind) + local.rule + '\n' + local.text : std::string();
    held->len = static_cast<int64_t>(held->text.size());
    PARTITA_MPI_CHECK(MPI_Ibcast(&held->len, 1, MPI_INT64_T, held->first, comm, &req));
    wait_holding(req, what, held);
    held->text.resize(held->len);
    PARTITA_MPI_CHECK(MPI_Ibcast(held->text.data(), static_cast<int>(held->len), MPI_CHAR, held->first,
                                 comm, &req));
    wait_holding(req, what, held);
    const std::string& text = held->text;
    const size_t eol = text.find('\n');
    const std::string rule = text.substr(1, eol - 1), message = text.substr(eol + 1);
    if (text.at(0) == static_cast<char>(ErrorKind::Shape)) throw ShapeError(message, rule);
    throw PartitionError(message, rule);
  }
  if (held->out[0] != -held->out[1])
    throw PartitionError(std::string(what) + ": the ranks of the collective passed different " +
                         subject, rule_code::kArgumentsDiffer);
}

}  // namespace partita::mpi::detail
