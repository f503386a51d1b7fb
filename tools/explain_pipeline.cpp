// `partita explain pipeline --schedule NAME --stages P --microbatches M
// [--virtual V] [--csv FILE] [--costs F,I,W] [--svg FILE] [--json]`: a
// pipeline schedule (smp/schedule.hpp) verified and simulated on one
// process, printed as each rank's timeline with its bubble beside the
// theory's, and drawn as an SVG (docs/pipeline.md). No MPI.
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "explain.hpp"
#include "partita/cli.hpp"
#include "partita/errors.hpp"
#include "partita/json.hpp"
#include "partita/smp/schedule.hpp"

namespace partita::tools {

namespace {

struct PipelineGiven {
  std::string schedule, csv, costs, svg;
  int stages = 0, microbatches = 0, v = 1;
  bool json = false, no_svg = false;
};

smp::Costs parse_costs(const std::string& text) {
  smp::Costs c;
  if (text.empty()) return c;
  std::vector<double> v;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      const double x = std::stod(item, &used);
      // Relative costs: the text timeline has a column per unit of time.
      if (used != item.size() || !(x > 0 && x <= 1000)) throw std::invalid_argument(item);
      v.push_back(x);
    } catch (const std::exception&) {
      throw smp::UsageError("--costs: expected three numbers F,I,W in (0, 1000], got \"" + text + "\"");
    }
  }
  if (v.size() != 3) throw smp::UsageError("--costs: expected three numbers F,I,W in (0, 1000], got \"" + text + "\"");
  c.forward(v[0]).backward_input(v[1]).backward_weight(v[2]);
  return c;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw smp::UsageError("--csv: cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string default_svg_name(const smp::Schedule& s, int v) {
  std::string n = "pipeline-" + s.name + "-p" + std::to_string(s.ranks) + "-m" + std::to_string(s.microbatches);
  if (v > 1) n += "-v" + std::to_string(v);
  return n + ".svg";
}

int explain_pipeline(const PipelineGiven& g, std::ostream& out, std::ostream& err) {
  smp::Schedule s;
  smp::Costs costs;
  try {
    costs = parse_costs(g.costs);
    if (!g.csv.empty()) {
      s = smp::schedule_from_csv(read_all(g.csv), g.microbatches, 0, "user");
    } else {
      if (g.schedule.empty()) throw smp::UsageError("give --schedule NAME or --csv FILE");
      if (g.stages <= 0 || g.microbatches <= 0)
        throw smp::UsageError("--stages and --microbatches are required with --schedule");
      s = smp::build_schedule(g.schedule, g.stages, g.microbatches, g.v);
    }
  } catch (const Error& e) {
    err << "partita explain pipeline: " << e.what() << "\n";
    return 2;
  }
  smp::Simulation sim;
  try {
    sim = smp::verify(s, costs);
  } catch (const smp::ScheduleError& e) {
    // The schedule cannot run: what the executor would refuse before its
    // first message.
    err << "partita explain pipeline: " << s.name << " does not verify: " << e.what() << "\n";
    return 1;
  }
  const int v = s.ranks ? s.stages / s.ranks : 1;
  const bool unit = costs.forward() == 1 && costs.backward_input() == 1 && costs.backward_weight() == 1;
  const bool builtin = g.csv.empty();
  const double theory = builtin && unit ? smp::theoretical_bubble(g.schedule, s.ranks, s.microbatches, v) : -1;
  std::string svg_path;
  if (!g.no_svg) {
    svg_path = g.svg.empty() ? default_svg_name(s, v) : g.svg;
    std::ofstream f(svg_path);
    f << smp::timeline_svg(s, sim);
    if (!f) {
      err << "partita explain pipeline: cannot write " << svg_path << "\n";
      return 2;
    }
  }
  if (g.json) {
    json::Value j;
    j["schedule"] = s.name;
    j["ranks"] = s.ranks;
    j["stages"] = s.stages;
    j["microbatches"] = s.microbatches;
    j["makespan"] = sim.makespan;
    j["bubble"] = sim.bubble();
    if (theory >= 0) j["bubble_theory"] = theory;
    j["busy"] = sim.busy;
    j["peak_live"] = sim.peak_live;
    j["csv"] = smp::to_csv(smp::with_comms(s));
    if (!svg_path.empty()) j["svg"] = svg_path;
    out << j.dump(2) << "\n";
    return 0;
  }
  out << s.name << ": " << s.ranks << " ranks, " << s.stages << " stages (" << v << " per rank), "
      << s.microbatches << " microbatches; verified (every input before its use, every send "
         "received, no deadlock, live activations within bounds)\n";
  out << "costs F " << costs.forward() << ", I " << costs.backward_input() << ", W " << costs.backward_weight()
      << " (B = I + W); makespan " << sim.makespan << "\n";
  out << std::fixed << std::setprecision(4) << "bubble " << sim.bubble();
  if (theory >= 0) out << " (theory " << theory << ")";
  out << "\n" << std::defaultfloat;
  out << "peak live activations per rank:";
  for (const int p : sim.peak_live) out << " " << p;
  out << "\n\n" << smp::timeline_text(s, sim);
  out << "\nF forward, I input gradient, W weight gradient, B full backward (.c: chunk c of the rank), "
         ".. idle, ~~ the action goes on\n";
  if (!svg_path.empty()) out << "svg: " << svg_path << "\n";
  return 0;
}

}  // namespace

void add_explain_pipeline(CLI::App& explain, std::function<int()>& action) {
  auto given = std::make_shared<PipelineGiven>();
  CLI::App* c = explain.add_subcommand(
      "pipeline", "a pipeline schedule verified and simulated on one process: each rank's timeline, "
                  "the bubble beside the theory's, an SVG drawing (docs/pipeline.md)");
  std::string names;
  for (const auto& n : smp::schedule_names()) names += (names.empty() ? "" : ", ") + n;
  c->add_option("--schedule", given->schedule, "a built-in schedule: " + names);
  c->add_option("--stages", given->stages, "pipeline ranks (mp_size)")->check(CLI::Range(1, 1 << 12));
  c->add_option("--microbatches", given->microbatches, "microbatches per step")->check(CLI::Range(1, 1 << 16));
  c->add_option("--virtual", given->v, "virtual stages per rank (interleaved_1f1b)")->check(CLI::Range(1, 64));
  c->add_option("--csv", given->csv,
                "a schedule of your own in torch.distributed.pipelining's CSV format (one row per rank)");
  c->add_option("--costs", given->costs, "relative costs F,I,W of a forward, an input-gradient and a "
                                         "weight-gradient backward (default 1,1,1)");
  c->add_option("--svg", given->svg, "where to write the SVG (default pipeline-NAME-pP-mM[-vV].svg)");
  c->add_flag("--no-svg", given->no_svg, "write no SVG");
  c->add_flag("--json", given->json, "print JSON instead of the timeline");
  c->callback([given, &action] { action = [given] { return explain_pipeline(*given, std::cout, std::cerr); }; });
}

}  // namespace partita::tools
