// The rank layout of partita::smp (docs/smp.md), as pure arithmetic: no MPI,
// computable for every rank of any world on one process (explain, tests).
//
// World = dp_size x mp_size, and a model replica's mp_size = pp_size x
// tp_size (pipeline stages, each a tensor-parallel group; docs/3d.md). A
// world rank r has
//   mp_rank = r % mp_size     (its position in its model replica)
//   dp_rank = r / mp_size     (which replica it belongs to)
//   tp_rank = mp_rank % tp_size, pp_rank = mp_rank / tp_size
// so r = (dp_rank * pp_size + pp_rank) * tp_size + tp_rank: tp varies
// fastest, then pp, then dp. The mp group of r is the mp_size consecutive
// ranks [dp_rank*mp_size, dp_rank*mp_size + mp_size); its dp group is
// {mp_rank, mp_rank + mp_size, ..., mp_rank + (dp_size-1)*mp_size}: the ranks
// that hold the same partition of the model in every replica; its tp group
// the tp_size consecutive ranks of its stage; its pp group the ranks of its
// replica with its tp_rank, one per stage. With tp_size 1 (the default)
// pp == mp and the tp group is the rank alone.
#pragma once

#include <string>
#include <vector>

namespace partita::smp {

// Which processes a communication involves (seed 004's smp.CommGroup).
// TP_GROUP and PP_GROUP are SageMaker's names for the groups the tensor
// parallelism of its later versions added (docs/3d.md).
enum class CommGroup { WORLD, MP_GROUP, DP_GROUP, TP_GROUP, PP_GROUP };
// How a rank argument is to be read (seed 004's smp.RankType).
enum class RankType { WORLD_RANK, MP_RANK, DP_RANK, TP_RANK, PP_RANK };

inline constexpr CommGroup WORLD = CommGroup::WORLD;
inline constexpr CommGroup MP_GROUP = CommGroup::MP_GROUP;
inline constexpr CommGroup DP_GROUP = CommGroup::DP_GROUP;
inline constexpr CommGroup TP_GROUP = CommGroup::TP_GROUP;
inline constexpr CommGroup PP_GROUP = CommGroup::PP_GROUP;
inline constexpr RankType WORLD_RANK = RankType::WORLD_RANK;
inline constexpr RankType MP_RANK = RankType::MP_RANK;
inline constexpr RankType DP_RANK = RankType::DP_RANK;
inline constexpr RankType TP_RANK = RankType::TP_RANK;
inline constexpr RankType PP_RANK = RankType::PP_RANK;

const char* name(CommGroup group);
const char* name(RankType type);

// What one rank is in the layout.
struct RankPlace {
  int rank = 0;
  int mp_rank = 0;
  int dp_rank = 0;
  int tp_rank = 0;
  int pp_rank = 0;
  std::vector<int> mp_group;  // world ranks, in mp-rank order
  std::vector<int> dp_group;  // world ranks, in dp-rank order
  std::vector<int> tp_group;  // world ranks, in tp-rank order
  std::vector<int> pp_group;  // world ranks, in pp-rank order (stage order)
};

class Layout {
 public:
  // Throws ConfigError unless size >= 1, mp_size >= 1 and mp_size divides size.
  // tp_size 1: every mp rank is a pipeline stage.
  Layout(int size, int mp_size);
  // mp_size = pp_size x tp_size; ConfigError unless all are >= 1 and
  // pp_size x tp_size divides size.
  Layout(int size, int pp_size, int tp_size);

  int size() const { return size_; }
  int mp_size() const { return mp_size_; }
  int dp_size() const { return size_ / mp_size_; }
  int tp_size() const { return tp_size_; }
  int pp_size() const { return mp_size_ / tp_size_; }

  RankPlace place(int rank) const;
  // The world rank that `rank` (read as `type`) names, seen from world rank
  // `from`: an MP_RANK is a position in from's mp group, a DP_RANK one in
  // its dp group, a TP_RANK in its tp group, a PP_RANK in its pp group.
  // Throws UsageError when out of range for that type.
  int world_rank(int from, int rank, RankType type) const;
  // The members of `group` as seen from world rank `from`, in group-rank order.
  std::vector<int> members(int from, CommGroup group) const;
  // Every mp group (dp_size of them) and every dp group (mp_size of them).
  std::vector<std::vector<int>> mp_groups() const;
  std::vector<std::vector<int>> dp_groups() const;
  // Every tp group (dp_size x pp_size, replica by replica, stage by stage)
  // and every pp group (dp_size x tp_size, replica by replica).
  std::vector<std::vector<int>> tp_groups() const;
  std::vector<std::vector<int>> pp_groups() const;

 private:
  int size_, mp_size_, tp_size_ = 1;
};

}  // namespace partita::smp
