// smp::stage_partitions (docs/3d.md): a stage's ranks as the partitions of
// partita's distributed layers.
#include "partita/smp/tensor_parallel.hpp"

#include <string>

#include "partita/smp.hpp"

namespace partita::smp {

std::vector<int> stage_workers(int stage) {
  const Layout& l = layout();
  if (stage < 0 || stage >= l.pp_size())
    throw UsageError("smp::stage_partitions: stage " + std::to_string(stage) + " does not exist (pp_size " +
                     std::to_string(l.pp_size()) + ")");
  std::vector<int> workers;
  for (int d = 0; d < l.dp_size(); ++d)
    for (int t = 0; t < l.tp_size(); ++t) workers.push_back((d * l.pp_size() + stage) * l.tp_size() + t);
  return workers;
}

StagePartitions stage_partitions(int stage, int dims) {
  if (dims < 3)
    throw UsageError("smp::stage_partitions: the activations need at least 3 dimensions (batch, tokens, "
                     "features), got " + std::to_string(dims));
  const std::vector<int> workers = stage_workers(stage);
  const Layout& l = layout();
  const mpi::Partition team = mpi::Partition::world().create_partition_inclusive(workers);
  Shape features(static_cast<size_t>(dims), 1), tokens(static_cast<size_t>(dims), 1);
  features[0] = tokens[0] = l.dp_size();
  features[dims - 1] = l.tp_size();
  tokens[dims - 2] = l.tp_size();
  return {team.create_cartesian_topology_partition(features), team.create_cartesian_topology_partition(tokens)};
}

}  // namespace partita::smp
