#include "detail/box_view.hpp"

#include <vector>

#include "detail/team_comm.hpp"
#include "partita/mpi/runtime.hpp"

namespace partita::mpi::detail {

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
