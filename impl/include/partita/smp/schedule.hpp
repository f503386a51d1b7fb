// Pipeline schedules as data (docs/pipeline.md "Schedules as
// data"): for every rank of the pipeline an ordered list of actions, the
// built-in schedules (GPipe, 1F1B, Megatron's interleaved 1F1B with v
// virtual stages per rank, ZB-H1), torch.distributed.pipelining's CSV
// format, and a one-process verifier and simulator that every schedule
// passes before the executor (pipeline.cpp) sends its first message.
//
//   smp::Schedule s = smp::build_schedule("interleaved_1f1b", /*ranks=*/4, /*microbatches=*/8, /*v=*/2);
//   smp::verify(s);                                   // ScheduleError naming the first bad action
//   smp::Simulation t = smp::simulate(s);             // unit costs: bubble 3/19
//   std::string csv = smp::to_csv(s);                 // "0F0,0F1,..." one row per rank
//
// Pure code: no MPI, no LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "partita/arg.hpp"
#include "partita/smp.hpp"

namespace partita::smp {

// A schedule that cannot run: a malformed action, a missing or repeated
// computation, an input used before it exists, a send without its
// receive, a deadlock, too many live activations, a microbatch count the
// schedule cannot take. The message names the first offending action
// ("rank 1, action 4 (1W0): ...").
struct ScheduleError : UsageError {
  using UsageError::UsageError;
};

// torch.distributed.pipelining's computation types and letters. Beware the
// letters: "I" is the input-gradient backward (what the zero-bubble paper
// calls B), "B" the full backward (input and weight gradients at
// once), "W" the weight-gradient backward.
enum class ActionKind : uint8_t {
  kForward,         // F
  kBackwardInput,   // I
  kBackwardWeight,  // W
  kFullBackward,    // B
  kSendF,           // SEND_F: stage s sends its output to stage s + 1
  kRecvF,           // RECV_F: stage s receives its input from stage s - 1
  kSendB,           // SEND_B: stage s sends its input's gradient to stage s - 1
  kRecvB,           // RECV_B: stage s receives its output's gradient from stage s + 1
};

// One action: `stage` is the (virtual) stage index over the whole model,
// 0 .. stages - 1; a rank holds one or more stages.
struct Action {
  ActionKind kind = ActionKind::kForward;
  int stage = 0;
  int microbatch = 0;
  bool operator==(const Action& o) const {
    return kind == o.kind && stage == o.stage && microbatch == o.microbatch;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
  bool is_compute() const { return kind <= ActionKind::kFullBackward; }
};

// "2F0", "3SEND_F1", "0I5" (torch.distributed.pipelining's _Action repr).
std::string to_string(const Action& a);
const char* letters(ActionKind k);
// The reverse; ScheduleError for anything else (UNSHARD, RESHARD,
// REDUCE_GRAD and OVERLAP_F_B, which partita does not run, included).
Action parse_action(const std::string& text);

struct Schedule {
  std::string name;           // "gpipe", ..., or "user"
  int ranks = 0;              // pipeline ranks (mp_size)
  int stages = 0;             // stages of the model: ranks * virtual stages per rank for the built-ins
  int microbatches = 0;
  std::vector<std::vector<Action>> actions;  // [rank], in order
  // Most live activations a rank may hold (empty: no bound). An activation
  // is a (stage, microbatch) whose forward ran and whose weight gradient
  // (W or B) has not: its graph is alive.
  std::vector<int> live_bound;

  // Which rank holds each stage, from the schedule's compute actions
  // (ScheduleError when a stage appears on two ranks or on none).
  std::vector<int> stage_ranks() const;
  bool has_comms() const;
};

// --- the built-ins (pure; every rank computes the whole schedule) -----------

// GPipe: every forward, then every full backward, in microbatch order.
Schedule gpipe(int ranks, int microbatches);
// 1F1B: rank r runs min(p - 1 - r, m) forwards ahead, then alternates one
// forward and one full backward, then drains the backwards.
Schedule one_f_one_b(int ranks, int microbatches);
// Megatron-LM's interleaved 1F1B: rank r holds stages r, r + p, ..., r +
// (v - 1) p; forwards go through the chunks in groups of p microbatches.
// Needs microbatches % ranks == 0 when v > 1 (Megatron's rule); v == 1 is
// one_f_one_b.
Schedule interleaved_1f1b(int ranks, int microbatches, int v);
// ZB-H1 (Qi et al., ICLR 2024): 1F1B with the backward split into I and W;
// rank r postpones its first r weight gradients into the drain, where 1F1B
// leaves rank r idle.
Schedule zb_h1(int ranks, int microbatches);

// By name: "gpipe", "1f1b", "interleaved_1f1b" (with v), "zb_h1", and smp's
// configuration names "simple" (GPipe), "interleaved" (1F1B),
// "interleaved_virtual" (interleaved_1f1b) and "zero_bubble" (ZB-H1). v
// must be 1 for the schedules without virtual stages. ScheduleError for an
// unknown name or a count the schedule cannot take (ranks x microbatches x
// v above 2^24 among them: the whole schedule is held on every rank).
Schedule build_schedule(const std::string& name, int ranks, int microbatches, int v = 1);
std::vector<std::string> schedule_names();
// Virtual stages per rank a named schedule allows (v == 1 only, or any v >= 1).
bool schedule_takes_virtual_stages(const std::string& name);

// The communication actions the executor runs, added to a schedule of
// compute actions only: RECV_F(s, mb) right before F(s, mb) and SEND_F(s, mb)
// right after it when stage s - 1 / s + 1 is on another rank; RECV_B(s, mb)
// right before I or B (s, mb) and SEND_B(s, mb) right after it likewise.
// A schedule that already has communication actions is returned unchanged.
Schedule with_comms(Schedule compute_only);

// --- CSV (torch.distributed.pipelining's _dump_csv / _load_csv) -------------

// One row per rank, one action per cell, comma-separated; empty cells are
// idle slots (skipped).
std::string to_csv(const Schedule& s);
// `stages` 0: one more than the largest stage index; `microbatches` 0: one
// more than the largest microbatch index. ScheduleError for a bad cell,
// naming its row and column.
Schedule schedule_from_csv(const std::string& text, int microbatches = 0, int stages = 0,
                           const std::string& name = "user");

// --- verification and simulation ---------------------------------------------

// Relative costs of the actions (the simulator's time units). Communication
// takes no time. A full backward costs input + weight.
// Set in LibTorch's style: Costs().forward(1).backward_input(1).backward_weight(2).
struct Costs {
  PARTITA_ARG(double, forward) = 1;
  PARTITA_ARG(double, backward_input) = 1;
  PARTITA_ARG(double, backward_weight) = 1;

 public:
  double full_backward() const { return backward_input_ + backward_weight_; }
};

struct TimedAction {
  Action action;
  int index = 0;        // position in its rank's list
  double start = 0, end = 0;
};

struct Simulation {
  double makespan = 0;
  std::vector<double> busy;             // per rank
  std::vector<int> peak_live;           // per rank
  std::vector<std::vector<TimedAction>> timeline;  // per rank, compute actions only
  // 1 - sum(busy) / (ranks * makespan): the share of the ranks' time idle.
  double bubble() const;
};

// The checks, in order, each naming the first offending action:
//  1. every action's stage and microbatch in range, every stage on one rank,
//     communication actions on the rank of their stage and only where the
//     neighbouring stage is on another rank;
//  2. on every rank, in order: each (stage, microbatch) runs F once and then
//     either B once or I once then W once; F's input is there (stage 0, the
//     previous stage's F on this rank, or an earlier RECV_F); I's or B's
//     output gradient is there (the last stage, the next stage's I/B on this
//     rank, or an earlier RECV_B); a send after the computation it sends;
//     nothing missing at the end;
//  3. every send has exactly one receive: on each (sender, receiver, kind)
//     channel the sends and the receives name the same stages and
//     microbatches in the same order (MPI matches them in posting order);
//  4. no deadlock when every rank runs its list in order with the
//     executor's semantics: RECV_F and RECV_B block until the matching send
//     was posted; sends never block (MPI_Isend, completed at the end of the
//     step);
//  5. each rank's live activations within live_bound;
//  6. (checked before 5) what partita's executor needs: each stage's
//     forwards in microbatch order, and with one stage per rank, each
//     stage's first forward but the last stage's followed at once by its
//     SEND_F.
// A compute-only schedule is checked as with_comms lowers it. Returns the
// simulation with `costs`, so that one call does both.
Simulation verify(const Schedule& s, const Costs& costs = {});
// The simulation alone (verify first: this assumes a valid schedule).
Simulation simulate(const Schedule& s, const Costs& costs = {});

// The theory's bubble for a built-in schedule at unit costs (docs/pipeline.md):
// GPipe and 1F1B (p-1)/(m+p-1), interleaved (p-1)/(v m+p-1), ZB-H1
// (p-1)/(3m+p-1).
double theoretical_bubble(const std::string& name, int ranks, int microbatches, int v = 1);

// Text: one row per rank, one column per time unit of the simulation,
// "F0" / "I3" / "W3" / "B3" (with ".c" for the chunk c when ranks hold several
// stages), ".." for idle. SVG: the same, one box per action. Above 2^22
// cells (ranks x time units) or 2^18 boxes each says so instead.
std::string timeline_text(const Schedule& s, const Simulation& sim);
std::string timeline_svg(const Schedule& s, const Simulation& sim);

// --- the pipeline's interface ----------------------------------------------------------------

enum class Pipeline { kSimple, kInterleaved };
// "simple" / "interleaved" (the Config's pipeline field); ConfigError otherwise.
Pipeline pipeline_from_name(const std::string& name);
const char* name(Pipeline p);

struct PipelineAction {
  enum Kind { kForward, kBackward };
  Kind kind;
  int microbatch;
  bool operator==(const PipelineAction& o) const { return kind == o.kind && microbatch == o.microbatch; }
};

// Pure (no MPI): the order in which `stage` of `stages` runs the forward and
// backward passes of `microbatches` microbatches. Forwards come in
// microbatch order, and so do backwards, on every stage.
std::vector<PipelineAction> schedule(Pipeline p, int stage, int stages, int microbatches);
// The most microbatches whose forward has run and backward has not, along
// `actions`.
int peak_live(const std::vector<PipelineAction>& actions);
// Contiguous stages of at least one layer each minimising the largest
// stage's parameter count; returns the stage bounds (stages + 1 numbers,
// stage s holds layers [b[s], b[s+1])). Among equal maxima, the earliest
// split points. UsageError when there are fewer layers than stages.
std::vector<int> balance_by_parameters(const std::vector<int64_t>& params_per_layer, int stages);

}  // namespace partita::smp
