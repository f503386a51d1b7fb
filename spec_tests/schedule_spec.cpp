// Pipeline schedules as data (issue 31, docs/pipeline.md "Schedules as
// data"): the built-ins written out by hand, the simulator against the
// theory's bubble at 1-8 stages, 1-16 microbatches and 1-4 virtual stages,
// the declared live-activation bounds, the CSV format, and every bad
// schedule the verifier must reject with the first offending action named.
// One process, no MPI.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "expect_raises.hpp"
#include "partita/smp/schedule.hpp"

namespace partita::spec {
namespace {

using smp::Action;
using smp::ActionKind;
using smp::Schedule;
using smp::ScheduleError;

std::string row(const Schedule& s, int r) {
  std::string out;
  for (const Action& a : s.actions[r]) out += (out.empty() ? "" : " ") + smp::to_string(a);
  return out;
}

Schedule from_rows(const std::vector<std::string>& rows, int microbatches = 0) {
  std::string csv;
  for (const auto& r : rows) csv += r + "\n";
  return smp::schedule_from_csv(csv, microbatches);
}

TEST(Schedule, BuiltinsByHand) {
  // 1F1B at 4 stages x 8 microbatches, as docs/pipeline.md draws it.
  const Schedule f = smp::build_schedule("1f1b", 4, 8);
  EXPECT_EQ(row(f, 0), "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7");
  EXPECT_EQ(row(f, 3), "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7");
  EXPECT_EQ(row(smp::build_schedule("gpipe", 2, 3), 1), "1F0 1F1 1F2 1B0 1B1 1B2");
  // Megatron's interleaved order, 2 ranks, v = 2 (stages r and r + 2), 4
  // microbatches: rank 0 warms up with (p - 1 - r) * 2 + (v - 1) * p = 4
  // forwards, groups of p microbatches per chunk, backwards from the last
  // chunk.
  const Schedule i = smp::build_schedule("interleaved_1f1b", 2, 4, 2);
  EXPECT_EQ(i.stages, 4);
  EXPECT_EQ(row(i, 0), "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
  EXPECT_EQ(row(i, 1), "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3");
  // ZB-H1: rank r postpones its first r weight gradients to the drain.
  const Schedule z = smp::build_schedule("zb_h1", 2, 3);
  EXPECT_EQ(row(z, 0), "0F0 0F1 0I0 0W0 0F2 0I1 0W1 0I2 0W2");
  EXPECT_EQ(row(z, 1), "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1W2");
  // smp's configuration names are the same schedules.
  EXPECT_EQ(smp::build_schedule("simple", 3, 5).actions, smp::build_schedule("gpipe", 3, 5).actions);
  EXPECT_EQ(smp::build_schedule("interleaved", 3, 5).actions, smp::build_schedule("1f1b", 3, 5).actions);
  EXPECT_EQ(smp::build_schedule("zero_bubble", 3, 5).actions, smp::build_schedule("zb_h1", 3, 5).actions);
  EXPECT_EQ(smp::build_schedule("interleaved_virtual", 2, 4, 2).actions, i.actions);
  // v == 1 interleaved is 1F1B.
  EXPECT_EQ(smp::build_schedule("interleaved_1f1b", 3, 5, 1).actions, smp::build_schedule("1f1b", 3, 5).actions);
}

TEST(Schedule, LoweringAddsTheMessages) {
  const Schedule s = smp::with_comms(smp::build_schedule("1f1b", 2, 2));
  EXPECT_EQ(row(s, 0), "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1");
  EXPECT_EQ(row(s, 1), "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1");
  // Stages on the same rank exchange nothing: one rank, two chunks.
  const Schedule one = smp::with_comms(smp::build_schedule("interleaved_1f1b", 1, 2, 2));
  EXPECT_FALSE(one.has_comms());
}

// The simulator with unit costs (F = I = W = 1, a full backward 2)
// reproduces the theory for every built-in schedule it applies to.
TEST(Schedule, SimulatedBubbleIsTheTheory) {
  int checked = 0;
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const double one_f_one_b = smp::verify(smp::build_schedule("1f1b", p, m)).bubble();
      EXPECT_NEAR(one_f_one_b, (p - 1.0) / (m + p - 1.0), 1e-12) << p << " x " << m;
      EXPECT_NEAR(smp::verify(smp::build_schedule("gpipe", p, m)).bubble(), (p - 1.0) / (m + p - 1.0), 1e-12)
          << p << " x " << m;
      const double zb = smp::verify(smp::build_schedule("zb_h1", p, m)).bubble();
      // The paper's (p-1)/(3m+p-1) holds once the pipeline has a steady
      // state (m >= p); below it ZB-H1 still beats 1F1B.
      if (m >= p) {
        EXPECT_NEAR(zb, (p - 1.0) / (3.0 * m + p - 1), 1e-12) << p << " x " << m;
      }
      if (p > 1) {
        EXPECT_LT(zb, one_f_one_b) << p << " x " << m;
      } else {
        EXPECT_EQ(zb, 0.0);
      }
      for (int v = 1; v <= 4; ++v) {
        if (v > 1 && m % p != 0) {
          EXPECT_THROW(smp::build_schedule("interleaved_1f1b", p, m, v), ScheduleError);
          continue;
        }
        const double b = smp::verify(smp::build_schedule("interleaved_1f1b", p, m, v)).bubble();
        EXPECT_NEAR(b, (p - 1.0) / (static_cast<double>(v) * m + p - 1), 1e-12) << p << " x " << m << " v " << v;
        EXPECT_NEAR(b, smp::theoretical_bubble("interleaved_1f1b", p, m, v), 1e-15);
        ++checked;
      }
    }
  EXPECT_EQ(checked, 128 + 3 * (16 + 8 + 5 + 4 + 3 + 2 + 2 + 2));  // v = 1 everywhere, v > 1 where m % p == 0
}

// What the verifier computes as live activations is what each schedule
// declares: GPipe m, 1F1B min(p - r, m), interleaved its warm-up + 1, ZB-H1
// min(p, m) on every rank (its postponed W's keep graphs alive).
TEST(Schedule, LiveActivationBounds) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const auto g = smp::verify(smp::build_schedule("gpipe", p, m));
      const auto f = smp::verify(smp::build_schedule("1f1b", p, m));
      const auto z = smp::verify(smp::build_schedule("zb_h1", p, m));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(g.peak_live[r], m);
        EXPECT_EQ(f.peak_live[r], std::min(p - r, m));
        EXPECT_EQ(z.peak_live[r], std::min(p, m));
      }
    }
  const Schedule i = smp::build_schedule("interleaved_1f1b", 4, 8, 2);
  const auto sim = smp::verify(i);
  EXPECT_EQ(sim.peak_live, (std::vector<int>{11, 9, 7, 5}));  // (p - r - 1) * 2 + (v - 1) * p + 1
  // A bound lower than what the schedule holds is an error naming where.
  Schedule tight = smp::build_schedule("1f1b", 4, 8);
  tight.live_bound[1] = 2;
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(tight); }),
                  "rank 1, action 2 (1F2): rank 1 holds 3 live activations, above the schedule's bound of 2");
  // A bound of 0 is no bound the schedule could keep, not "no bound".
  tight.live_bound[1] = 0;
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(tight); }),
                  "rank 1's live-activation bound is 0 (at least 1; an empty list states no bound)");
}

TEST(Schedule, CsvRoundTripAndPytorchCells) {
  for (const char* name : {"gpipe", "1f1b", "zb_h1"}) {
    const Schedule s = smp::build_schedule(name, 3, 4);
    const Schedule back = smp::schedule_from_csv(smp::to_csv(s), 4);
    EXPECT_EQ(back.actions, s.actions) << name;
    EXPECT_EQ(back.stages, 3);
    EXPECT_EQ(smp::to_csv(smp::with_comms(s)), smp::to_csv(smp::with_comms(back)));
  }
  EXPECT_EQ(smp::to_csv(smp::build_schedule("1f1b", 2, 2)), "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  // torch.distributed.pipelining writes idle slots as empty cells; they
  // are skipped. Communication actions are read as given.
  const Schedule t = from_rows({"0F0,,0F1,, 0B0 ,0B1", "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1"});
  EXPECT_EQ(row(t, 0), "0F0 0F1 0B0 0B1");
  EXPECT_EQ(t.microbatches, 2);
  EXPECT_EQ(smp::parse_action("12SEND_B3"), (Action{ActionKind::kSendB, 12, 3}));
  EXPECT_EQ(smp::parse_action("0I7"), (Action{ActionKind::kBackwardInput, 0, 7}));
  EXPECT_CONTAINS(raised<ScheduleError>([] { from_rows({"0F0,0X1"}); }), "CSV row 0 (rank 0), column 1");
  EXPECT_CONTAINS(raised<ScheduleError>([] { smp::parse_action("1UNSHARD"); }), "no microbatch number");
  EXPECT_CONTAINS(raised<ScheduleError>([] { smp::parse_action("F0"); }), "no stage number");
  // Anything after a cell's microbatch is refused, naming the cell, never
  // read as the cell's first action.
  EXPECT_CONTAINS(raised<ScheduleError>([] { from_rows({"0F0;0F1"}); }),
                  "CSV row 0 (rank 0), column 0: cannot read the action \"0F0;0F1\": trailing characters");
  EXPECT_CONTAINS(raised<ScheduleError>([] { from_rows({"0F0,1B2x"}); }),
                  "CSV row 0 (rank 0), column 1: cannot read the action \"1B2x\": trailing characters");
  EXPECT_CONTAINS(raised<ScheduleError>([] { smp::parse_action("0F0 0B0"); }), "trailing characters");
}

// torch.distributed.pipelining's schedule names build smp's schedules
// (either case); smp::Config stores smp's names for them.
TEST(Schedule, TorchNamesBuildTheSameSchedules) {
  EXPECT_EQ(smp::build_schedule("GPipe", 3, 4).actions, smp::build_schedule("gpipe", 3, 4).actions);
  EXPECT_EQ(smp::build_schedule("1F1B", 3, 4).actions, smp::build_schedule("1f1b", 3, 4).actions);
  EXPECT_EQ(smp::build_schedule("ZBH1", 3, 4).actions, smp::build_schedule("zb_h1", 3, 4).actions);
  EXPECT_EQ(smp::build_schedule("Interleaved1F1B", 2, 4, 2).actions,
            smp::build_schedule("interleaved_1f1b", 2, 4, 2).actions);
  // smp's own words too: "interleaved" is plain 1F1B, not torch's Interleaved1F1B.
  EXPECT_EQ(smp::build_schedule("interleaved", 3, 4).actions, smp::build_schedule("1f1b", 3, 4).actions);
  EXPECT_NE(smp::build_schedule("Interleaved1F1B", 2, 4, 2).actions, smp::build_schedule("1F1B", 2, 4).actions);
  EXPECT_CONTAINS(raised<ScheduleError>([] { smp::build_schedule("LoopedBFS", 2, 4); }),
                  "unknown schedule \"LoopedBFS\"");
}

// Each bad input raises, naming the first offending action.
TEST(Schedule, BadSchedulesNameTheFirstOffendingAction) {
  // A cycle: rank 0 waits for a gradient before sending the activation
  // that rank 1 needs to produce it.
  const Schedule cycle = from_rows({"0F0,0RECV_B0,0SEND_F0,0B0", "1RECV_F0,1F0,1B0,1SEND_B0"});
  const std::string c = raised<ScheduleError>([&] { smp::verify(cycle); });
  EXPECT_CONTAINS(c, "rank 0, action 1 (0RECV_B0): the schedule deadlocks");
  EXPECT_CONTAINS(c, "rank 1, action 0 (1RECV_F0) waits for 0SEND_F0 on rank 0");
  EXPECT_CONTAINS(c, "(a cycle)");
  // The same cycle in compute-only form: rank 1 runs the backward of
  // microbatch 1 before its forward of microbatch 0... and rank 0 waits.
  const Schedule order = from_rows({"0F0,0B0,0F1,0B1", "1F1,1B1,1F0,1B0"});
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(order); }),
                  "rank 1, 1RECV_F1 (the message before action 0, 1F1): activation number 1 from rank 0 is 0SEND_F0");
  // A send without its receive.
  const Schedule lonely = from_rows({"0F0,0SEND_F0,0SEND_F0", "1RECV_F0,1F0,1B0"});
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(lonely); }),
                  "rank 0, action 2 (0SEND_F0): a send without its receive");
  // A W before its I.
  const Schedule early_w = from_rows({"0F0,0W0,0I0"});
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(early_w); }), "rank 0, action 1 (0W0): a W before its I (0I0)");
  // A W after a full backward.
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(from_rows({"0F0,0B0,0W0"})); }),
                  "rank 0, action 2 (0W0): a W after the full backward 0B0");
  // A backward before its forward; a forward before its input.
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(from_rows({"0B0,0F0"})); }),
                  "rank 0, action 0 (0B0): a backward before its forward 0F0");
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(from_rows({"1F0,0F0,1B0,0B0"})); }),
                  "rank 0, action 0 (1F0): its input comes from 0F0 on this rank");
  // A microbatch count the schedule cannot take: a user schedule for 2
  // microbatches given 3, one for 2 given 1, the interleaved rule.
  const std::string two = "0F0,0F1,0B0,0B1\n";
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(smp::schedule_from_csv(two, 3)); }),
                  "rank 0 never runs 0F2");
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(smp::schedule_from_csv(two, 1)); }),
                  "rank 0, action 1 (0F1): microbatch 1 is outside 0..0");
  EXPECT_CONTAINS(raised<ScheduleError>([] { smp::build_schedule("interleaved_1f1b", 4, 6, 2); }),
                  "cannot take 6 microbatches on 4 ranks");
  // Virtual stages where the schedule has none; unknown names; bad counts.
  EXPECT_CONTAINS(raised<ScheduleError>([] { smp::build_schedule("zb_h1", 2, 4, 2); }),
                  "zb_h1 has one stage per rank; it cannot take 2 virtual stages");
  EXPECT_CONTAINS(raised<ScheduleError>([] { smp::build_schedule("zigzag", 2, 4); }), "unknown schedule \"zigzag\"");
  EXPECT_CONTAINS(raised<ScheduleError>([] { smp::build_schedule("gpipe", 0, 4); }), "0 ranks");
  // A stage on two ranks; a missing W; a receive out of order.
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(from_rows({"0F0,0B0", "0F0,0B0"})); }),
                  "rank 1, action 0 (0F0): stage 0 runs on rank 0 and on rank 1");
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(from_rows({"0F0,0I0"})); }),
                  "rank 0 never runs 0W0 after 0I0");
  // Virtual stages: stages 0 and 1 on one rank. Stage 0's backward needs
  // stage 1's input gradient, made on this rank, first.
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(from_rows({"0F0,1F0,0B0,1B0"})); }),
                  "rank 0, action 2 (0B0): its output's gradient comes from the backward of stage 1 on this rank, "
                  "which has not run yet");
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(from_rows({"0F0,1F0,0I0,1I0,0W0,1W0"})); }),
                  "rank 0, action 2 (0I0): its output's gradient comes from the backward of stage 1 on this rank");
  EXPECT_NO_THROW(smp::verify(from_rows({"0F0,1F0,1B0,0B0"})));
  // What the executor needs: forwards in microbatch order, and (one stage
  // per rank) a stage's first forward followed at once by its SEND_F.
  EXPECT_CONTAINS(raised<ScheduleError>([&] { smp::verify(from_rows({"0F1,0F0,0B1,0B0", "1F1,1B1,1F0,1B0"})); }),
                  "rank 0, action 1 (0F0): stage 0's forwards must run in microbatch order");
  EXPECT_CONTAINS(raised<ScheduleError>([&] {
                    smp::verify(from_rows({"0F0,0F1,0SEND_F0,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1",
                                           "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1"}));
                  }),
                  "rank 0, action 0 (0F0): the stage's first forward must be followed at once by its SEND_F");
  EXPECT_NO_THROW(smp::verify(from_rows({"0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1",
                                         "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1"})));
  // A schedule too large to hold, and timelines too large to draw.
  EXPECT_CONTAINS(raised<ScheduleError>([] { smp::build_schedule("gpipe", 4096, 65536); }),
                  "4096 ranks x 65536 microbatches x 1 virtual stages is above 2^24 computations");
  {
    // 64 ranks x 64 microbatches at costs of 1000: a makespan of about
    // 254,000 units, 16 million cells; 64 x 2100 microbatches: 268,800 boxes.
    const Schedule costly = smp::build_schedule("1f1b", 64, 64);
    const smp::Simulation sim = smp::verify(costly, smp::Costs().forward(1000).backward_input(1000).backward_weight(1000));
    EXPECT_CONTAINS(smp::timeline_text(costly, sim), "(no timeline: 64 ranks x a makespan of");
    EXPECT_EQ(smp::timeline_text(costly, smp::verify(costly)).find("no timeline"), std::string::npos);
    const Schedule many = smp::build_schedule("1f1b", 64, 2100);
    EXPECT_CONTAINS(smp::timeline_svg(many, smp::verify(many)), "no timeline: 268800 actions, above 262144");
  }
  // Virtual stages whose counts would overflow int.
  EXPECT_CONTAINS(raised<ScheduleError>([] { smp::build_schedule("interleaved_1f1b", 2, 2, 1 << 30); }),
                  "2 ranks x 2 microbatches x 1073741824 virtual stages is above 2^24 computations");
  // The verifier takes the user's schedule as it is: the same order as
  // 1F1B written with explicit messages passes.
  EXPECT_NO_THROW(smp::verify(smp::with_comms(smp::build_schedule("1f1b", 4, 8))));
}

TEST(Schedule, TimelinePictures) {
  const Schedule s = smp::build_schedule("zb_h1", 2, 2);
  const auto sim = smp::verify(s);
  EXPECT_EQ(smp::timeline_text(s, sim),
            "t         0  1  2  3  4  5  6\n"
            "rank 0   F0 F1 .. I0 W0 I1 W1\n"
            "rank 1   .. F0 I0 F1 I1 W0 W1\n");
  const std::string svg = smp::timeline_svg(s, sim);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  size_t boxes = 0;
  for (size_t at = svg.find("class=\"action\""); at != std::string::npos; at = svg.find("class=\"action\"", at + 1)) ++boxes;
  EXPECT_EQ(boxes, 12u);  // one per compute action
}

}  // namespace
}  // namespace partita::spec
