#include "explain.hpp"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <tuple>

#include "partita/errors.hpp"
#include "partita/json.hpp"
#include "partita/reference/partition.hpp"
#include "partita/cli.hpp"
#include "partita/tiling.hpp"
#include "partita/testing/primitive_table.hpp"

namespace partita::tools {

using testing::ExplainView;
using testing::primitive_table;

namespace {

struct Options {
  std::string primitive;  // the subcommand: broadcast, sum-reduce, ...
  ExplainView view = ExplainView::kNone;  // what its table entry says to show
  Ranks px_ranks, py_ranks;
  Shape px_shape, py_shape, global_shape;
  std::vector<int> axes;
  bool transpose_src = false, transpose_dest = false, json = false;
};

// The text options as given; turned into Options once CLI11 has checked them.
struct Given {
  std::string px_ranks, px_shape, py_ranks, py_shape, global_shape, axes;
  bool transpose_src = false, transpose_dest = false, json = false;
};

Options options_of(const std::string& primitive, const Given& g) {
  Options o;
  o.primitive = primitive;
  for (const auto& e : primitive_table())
    if (e.explain_command == primitive) o.view = e.explain;
  o.px_ranks = parse_ranks(g.px_ranks);
  o.px_shape = parse_shape(g.px_shape);
  if (!g.py_ranks.empty()) o.py_ranks = parse_ranks(g.py_ranks);
  if (!g.py_shape.empty()) o.py_shape = parse_shape(g.py_shape);
  if (!g.global_shape.empty()) o.global_shape = parse_shape(g.global_shape);
  if (!g.axes.empty())  // --axes "" reduces over no dimension
    for (int a : parse_ranks(g.axes)) o.axes.push_back(a);
  o.transpose_src = g.transpose_src;
  o.transpose_dest = g.transpose_dest;
  o.json = g.json;
  return o;
}

reference::Partition cartesian(int world, const Ranks& ranks, const Shape& shape) {
  return reference::Partition::world(world)
      .create_partition_inclusive(ranks)
      .create_cartesian_topology_partition(shape);
}

std::string label(int l) { return l < 0 ? "n/a" : "P_" + std::to_string(l); }

// The two tables: partitions with their workers (root first, in bold as the
// seed prints it) and, per worker, its partition(s).
struct Tables {
  std::vector<reference::Partition> parts;
  bool rooted = true;
  std::vector<std::string> worker_columns;
  std::vector<std::pair<int, std::vector<int>>> rows;  // worker -> labels
};

Tables build(const Options& o) {
  int world = 0;
  for (int r : o.px_ranks) world = std::max(world, r + 1);
  for (int r : o.py_ranks) world = std::max(world, r + 1);
  const auto px = cartesian(world, o.px_ranks, o.px_shape);
  Tables t;
  std::set<int> workers(o.px_ranks.begin(), o.px_ranks.end());
  if (o.view == ExplainView::kAllReduction) {
    const auto fam = px.create_allreduction_partition(o.axes);
    t.parts = fam.parts;
    t.rooted = false;
    t.worker_columns = {"Partition"};
    for (int w : workers) t.rows.push_back({w, {fam.label_of(w)}});
    return t;
  }
  const auto py = cartesian(world, o.py_ranks, o.py_shape);
  workers.insert(o.py_ranks.begin(), o.py_ranks.end());
  const auto sr = o.primitive == "broadcast"
                      ? px.create_broadcast_partition_to(py, o.transpose_src, o.transpose_dest)
                      : px.create_reduction_partition_to(py, o.transpose_src, o.transpose_dest);
  t.parts = sr.parts;
  t.worker_columns = {"P_send", "P_recv"};
  for (int w : workers) t.rows.push_back({w, {sr.send_label[w], sr.recv_label[w]}});
  return t;
}

// "0-11", "1,2,3": runs of three or more consecutive ranks as a range.
std::string ranks_text(const Ranks& r) {
  std::ostringstream os;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    os << (i ? "," : "");
    if (j >= i + 2) {
      os << r[i] << "-" << r[j];
    } else {
      for (size_t k = i; k <= j; ++k) os << (k > i ? "," : "") << r[k];
    }
    i = j + 1;
  }
  return os.str();
}

// Columns padded to a fixed width, the last one not (no trailing blanks).
void print_row(std::ostream& out, const std::vector<std::string>& cells, size_t width) {
  for (size_t c = 0; c < cells.size(); ++c) {
    out << cells[c];
    if (c + 1 < cells.size()) out << std::string(width > cells[c].size() ? width - cells[c].size() : 1, ' ');
  }
  out << "\n";
}

void print_text(const Options& o, const Tables& t, std::ostream& out) {
  out << o.primitive << ": P_x " << shape_string(o.px_shape) << " on workers "
      << ranks_text(o.px_ranks);
  if (o.view == ExplainView::kAllReduction) {
    out << ", reduced over dimensions {" << ranks_text(Ranks(o.axes.begin(), o.axes.end()))
        << "}";
  } else {
    out << (o.transpose_src ? " (transposed)" : "") << " -> P_y "
        << shape_string(o.py_shape) << " on workers " << ranks_text(o.py_ranks)
        << (o.transpose_dest ? " (transposed)" : "");
  }
  out << "\n\n";
  print_row(out, {"Partition", t.rooted ? "Workers (root first, in bold)" : "Workers"}, 11);
  for (size_t l = 0; l < t.parts.size(); ++l) {
    std::ostringstream ws;
    const auto& w = t.parts[l].workers();
    for (size_t i = 0; i < w.size(); ++i) {
      ws << (i ? ", " : "");
      if (t.rooted && i == 0) ws << "**" << w[i] << "**";
      else ws << w[i];
    }
    print_row(out, {label(static_cast<int>(l)), ws.str()}, 11);
  }
  out << "\n";
  std::vector<std::string> head{"Worker"};
  head.insert(head.end(), t.worker_columns.begin(), t.worker_columns.end());
  print_row(out, head, 11);
  for (const auto& [w, labels] : t.rows) {
    std::vector<std::string> cells{std::to_string(w)};
    for (int l : labels) cells.push_back(label(l));
    print_row(out, cells, 11);
  }
}

void print_json(const Options& o, const Tables& t, std::ostream& out) {
  json::Value doc;
  doc["primitive"] = o.primitive;
  json::Value px;
  px["ranks"] = json::Value(o.px_ranks);
  px["shape"] = json::Value(o.px_shape);
  doc["P_x"] = px;
  if (o.view == ExplainView::kAllReduction) {
    doc["axes"] = json::Value(o.axes);
  } else {
    json::Value py;
    py["ranks"] = json::Value(o.py_ranks);
    py["shape"] = json::Value(o.py_shape);
    doc["P_y"] = py;
    json::Value opts;
    opts["transpose_src"] = o.transpose_src;
    opts["transpose_dest"] = o.transpose_dest;
    doc["options"] = opts;
  }
  json::Value parts = json::Value::array();
  for (size_t l = 0; l < t.parts.size(); ++l) {
    json::Value p;
    p["label"] = label(static_cast<int>(l));
    if (t.rooted) p["root"] = t.parts[l].workers()[0];
    p["workers"] = json::Value(t.parts[l].workers());
    parts.push_back(p);
  }
  doc["partitions"] = parts;
  json::Value rows = json::Value::array();
  for (const auto& [w, labels] : t.rows) {
    json::Value r;
    r["worker"] = w;
    for (size_t c = 0; c < labels.size(); ++c)
      r[t.worker_columns[c]] = labels[c] < 0 ? json::Value() : json::Value(label(labels[c]));
    rows.push_back(r);
  }
  doc["workers"] = rows;
  out << json::dump(doc) << "\n";
}

// Repartition: every worker's (slice, size, partner) send and receive
// lists (seed 000), slices in the worker's own input / output coordinates,
// computed from the balanced decomposition of the global shape over P_x.
struct WorkerLists {
  int worker;
  RepartitionPlan plan;
};

std::vector<WorkerLists> repartition_lists(const Options& o) {
  // Validates the partitions (ranks, shapes) the way every layer does.
  int world = 0;
  for (int r : o.px_ranks) world = std::max(world, r + 1);
  for (int r : o.py_ranks) world = std::max(world, r + 1);
  cartesian(world, o.px_ranks, o.px_shape);
  cartesian(world, o.py_ranks, o.py_shape);
  const size_t d = o.global_shape.size();
  if (d < o.px_shape.size() || d < o.py_shape.size())
    throw PartitionError("repartition: a global shape of " + std::to_string(d) +
                         " dimensions cannot be split over these partitions");
  const Shape sx = padded_shape(o.px_shape, d);
  std::vector<Shape> pieces;
  for (size_t r = 0; r < o.px_ranks.size(); ++r) {
    const Index ix = unravel(static_cast<int64_t>(r), sx);
    Shape s;
    for (size_t k = 0; k < d; ++k) s.push_back(local_length(o.global_shape[k], sx[k], ix[k]));
    pieces.push_back(s);
  }
  const Tiling t = tile("repartition", sx, pieces, o.px_ranks);
  std::set<int> workers(o.px_ranks.begin(), o.px_ranks.end());
  workers.insert(o.py_ranks.begin(), o.py_ranks.end());
  std::vector<WorkerLists> out;
  for (int w : workers)
    out.push_back({w, plan_repartition(t, o.px_ranks, padded_shape(o.py_shape, d), o.py_ranks, w)});
  return out;
}

void print_repartition_text(const Options& o, const std::vector<WorkerLists>& lists,
                            std::ostream& out) {
  out << "repartition: global " << shape_string(o.global_shape) << ", P_x "
      << shape_string(o.px_shape) << " on workers " << ranks_text(o.px_ranks) << " -> P_y "
      << shape_string(o.py_shape) << " on workers " << ranks_text(o.py_ranks) << "\n";
  out << "(slice, size, partner): slices of the worker's own input (send) or output (recv)\n";
  for (const auto& [w, p] : lists) {
    out << "\nworker " << w << ": input "
        << (p.in_shape.empty() ? "zero-volume" : shape_string(p.in_shape)) << ", output "
        << (p.out_shape.empty() ? "zero-volume" : shape_string(p.out_shape)) << "\n";
    auto line = [&](const char* kind, const Transfer& t, const char* dir) {
      std::string partner = std::string(dir) + " " + std::to_string(t.partner);
      if (t.partner == w) partner += " (local copy)";
      print_row(out, {std::string("  ") + kind, box_string(t.slice),
                      "size " + std::to_string(t.slice.size()), partner}, 0);
    };
    for (const auto& t : p.sends) line("send", t, "to");
    for (const auto& t : p.recvs) line("recv", t, "from");
  }
}

void print_repartition_json(const Options& o, const std::vector<WorkerLists>& lists,
                            std::ostream& out) {
  json::Value doc;
  doc["primitive"] = o.primitive;
  doc["global_shape"] = json::Value(o.global_shape);
  for (const auto& [key, ranks, shape] :
       {std::make_tuple("P_x", o.px_ranks, o.px_shape), std::make_tuple("P_y", o.py_ranks, o.py_shape)}) {
    json::Value p;
    p["ranks"] = json::Value(ranks);
    p["shape"] = json::Value(shape);
    doc[key] = p;
  }
  auto entries = [](const std::vector<Transfer>& ts) {
    json::Value a = json::Value::array();
    for (const auto& t : ts) {
      json::Value e;
      e["start"] = json::Value(t.slice.start);
      e["length"] = json::Value(t.slice.len);
      e["size"] = t.slice.size();
      e["partner"] = t.partner;
      a.push_back(e);
    }
    return a;
  };
  json::Value rows = json::Value::array();
  for (const auto& [w, p] : lists) {
    json::Value r;
    r["worker"] = w;
    r["input_shape"] = p.in_shape.empty() ? json::Value() : json::Value(p.in_shape);
    r["output_shape"] = p.out_shape.empty() ? json::Value() : json::Value(p.out_shape);
    r["sends"] = entries(p.sends);
    r["recvs"] = entries(p.recvs);
    rows.push_back(r);
  }
  doc["workers"] = rows;
  out << json::dump(doc) << "\n";
}

}  // namespace

namespace {

int explain(const Options& o, std::ostream& out, std::ostream& err) {
  try {
    if (o.view == ExplainView::kRepartition) {
      const auto lists = repartition_lists(o);
      if (o.json) print_repartition_json(o, lists, out);
      else print_repartition_text(o, lists, out);
      return 0;
    }
    const Tables t = build(o);
    if (o.json) print_json(o, t, out);
    else print_text(o, t, out);
    return 0;
  } catch (const PartitionError& e) {  // the partitions given cannot pair
    err << "partita explain: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

void add_explain(CLI::App& app, std::function<int()>& action) {
  CLI::App* group = app.add_subcommand(
      "explain", "print the teams of a broadcast, sum-reduce or all-sum-reduce as seed 000 "
                 "tabulates them, or repartition's send/receive lists (computed by the reference), "
                 "or partita::smp's rank layout, or a pipeline schedule's timeline");
  group->require_subcommand(1);
  group->footer("RANKS: world ranks, e.g. 0-11 or 1,2,3;  SHAPE: e.g. 2,3,2;  AXES: e.g. 0,2");
  auto given = std::make_shared<Given>();
  auto primitive = [&](const std::string& name, const std::string& what) {
    CLI::App* c = group->add_subcommand(name, what);
    c->add_option("--px-ranks", given->px_ranks, "world ranks of P_x")
        ->required()
        ->check(cli::ranks_list());
    c->add_option("--px-shape", given->px_shape, "shape of P_x")->required()->check(cli::shape_list());
    c->add_flag("--json", given->json, "print JSON instead of tables");
    c->callback([c, given, &action] {
      action = [name = c->get_name(), given] {
        return explain(options_of(name, *given), std::cout, std::cerr);
      };
    });
    return c;
  };
  auto partner = [&](CLI::App* c) {
    c->add_option("--py-ranks", given->py_ranks, "world ranks of P_y")
        ->required()
        ->check(cli::ranks_list());
    c->add_option("--py-shape", given->py_shape, "shape of P_y")->required()->check(cli::shape_list());
  };
  // One subcommand per primitive the table gives a view (primitive_table.hpp).
  for (const auto& e : primitive_table()) {
    if (e.explain == ExplainView::kNone) continue;
    CLI::App* c = primitive(e.explain_command, e.explain_help);
    if (e.explain == ExplainView::kTeams) {
      partner(c);
      c->add_flag("--transpose-src", given->transpose_src, "P_x's shape is read reversed");
      c->add_flag("--transpose-dest", given->transpose_dest, "P_y's shape is read reversed");
    } else if (e.explain == ExplainView::kAllReduction) {
      c->add_option("--axes", given->axes, "the dimensions reduced over (may be empty: \"\")")
          ->required()
          ->check(cli::ranks_list() | CLI::IsMember({""}));
    } else if (e.explain == ExplainView::kRepartition) {
      partner(c);
      c->add_option("--global-shape", given->global_shape, "the global tensor's shape")
          ->required()
          ->check(cli::shape_list());
    }
  }
  add_explain_smp(*group, action);
  add_explain_pipeline(*group, action);
}

}  // namespace partita::tools
