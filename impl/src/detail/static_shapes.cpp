#include "detail/static_shapes.hpp"

#include <cstdlib>

#include "detail/plan_cache.hpp"
#include "partita/tensor_rules.hpp"

namespace partita::mpi {

namespace {
bool initial_check() {
  const char* v = std::getenv("PARTITA_CHECK_STATIC_SHAPES");
  return v && std::string(v) == "1";
}
bool g_check = initial_check();
}  // namespace

bool check_static_shapes() { return g_check; }
void set_check_static_shapes(bool on) { g_check = on; }

}  // namespace partita::mpi

namespace partita::mpi::detail {

void raise_broken_promise(const std::string& what, const std::string& who,
                          const std::string& first, const std::string& now) {
  throw ShapeError(what + ": static shapes were promised, but " + who + " passed " + now +
                       " where its first call passed " + first,
                   rule_code::kStaticShapes);
}

std::string describe_header(const Header& h) {
  std::string s = h.status == Header::kOk
                      ? "a " + dtype_string(h.scalar_type()) + " tensor of shape " +
                            shape_string(h.shape())
                      : "a tensor refused by the checks (status " + std::to_string(h.status) + ")";
  if (h.requires_grad == Header::kWantsGrad) s += " that requires grad";
  if (h.requires_grad == Header::kGradModeOff) s += " under grad mode off";
  if (!h.static_shapes) s += " without static shapes";
  return s;
}

void exchange_promised_headers(const Partition& P, Header mine, bool promised,
                               const std::string& what, std::vector<Header>& headers) {
  mine.static_shapes = promised ? 1 : 0;
  exchange_headers(P, mine, what.c_str(), headers);
  for (size_t i = 1; i < headers.size(); ++i)
    if (headers[i].static_shapes != headers[0].static_shapes)
      throw PartitionError(what + ": the ranks of the layer were made with different shape "
                                  "agreements (worker " + std::to_string(P.workers()[0]) +
                               (headers[0].static_shapes ? " static" : " per call") + ", worker " +
                               std::to_string(P.workers()[i]) +
                               (headers[i].static_shapes ? " static" : " per call") + ")",
                           rule_code::kArgumentsDiffer);
}

void check_header_promise(const Partition& P, const std::string& what,
                          const std::vector<Header>& first, const std::vector<Header>& now) {
  std::vector<Header> is;
  for (size_t i = 0; i < now.size(); ++i)
    is.push_back(i < first.size() ? as_promised(now[i], first[i]) : now[i]);
  check_promise(what, first, is, describe_header,
                [&](size_t i) { return "worker " + std::to_string(P.workers()[i]); });
}

}  // namespace partita::mpi::detail
