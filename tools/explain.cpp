#include "explain.hpp"

#include <algorithm>
#include <iomanip>
#include <set>
#include <sstream>

#include "partita/errors.hpp"
#include "partita/json.hpp"
#include "partita/reference/partition.hpp"

namespace partita::tools {

namespace {

const char* kUsage =
    "usage: partita explain broadcast|sum-reduce --px-ranks R --px-shape S\n"
    "                       --py-ranks R --py-shape S [--transpose-src] [--transpose-dest] [--json]\n"
    "       partita explain all-sum-reduce --px-ranks R --px-shape S --axes A [--json]\n"
    "  R: world ranks, e.g. 0-11 or 1,2,3;  S: a shape, e.g. 2,3,2;  A: axes, e.g. 0,2\n";

struct Options {
  std::string primitive;
  Ranks px_ranks, py_ranks;
  Shape px_shape, py_shape;
  std::vector<int> axes;
  bool has_axes = false, transpose_src = false, transpose_dest = false, json = false;
};

Options parse(const std::vector<std::string>& args) {
  if (args.empty()) throw Error("missing primitive");
  Options o;
  o.primitive = args[0];
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw Error(a + " needs a value");
      return args[++i];
    };
    if (a == "--px-ranks") o.px_ranks = parse_ranks(value());
    else if (a == "--py-ranks") o.py_ranks = parse_ranks(value());
    else if (a == "--px-shape") o.px_shape = parse_shape(value());
    else if (a == "--py-shape") o.py_shape = parse_shape(value());
    else if (a == "--axes") {
      o.has_axes = true;
      const std::string& v = value();
      if (!v.empty())
        for (int r : parse_ranks(v)) o.axes.push_back(r);
    } else if (a == "--transpose-src") o.transpose_src = true;
    else if (a == "--transpose-dest") o.transpose_dest = true;
    else if (a == "--json") o.json = true;
    else throw Error("unknown option " + a);
  }
  if (o.px_ranks.empty() || o.px_shape.empty()) throw Error("--px-ranks and --px-shape are required");
  if (o.primitive == "all-sum-reduce") {
    if (!o.has_axes) throw Error("all-sum-reduce needs --axes");
  } else if (o.primitive == "broadcast" || o.primitive == "sum-reduce") {
    if (o.py_ranks.empty() || o.py_shape.empty())
      throw Error(o.primitive + " needs --py-ranks and --py-shape");
  } else {
    throw Error("unknown primitive '" + o.primitive + "'");
  }
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
  if (o.primitive == "all-sum-reduce") {
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
  if (o.primitive == "all-sum-reduce") {
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
  doc.set("primitive", o.primitive);
  json::Value px;
  px.set("ranks", json::Value::array_of(o.px_ranks));
  px.set("shape", json::Value::array_of(o.px_shape));
  doc.set("P_x", px);
  if (o.primitive == "all-sum-reduce") {
    doc.set("axes", json::Value::array_of(o.axes));
  } else {
    json::Value py;
    py.set("ranks", json::Value::array_of(o.py_ranks));
    py.set("shape", json::Value::array_of(o.py_shape));
    doc.set("P_y", py);
    json::Value opts;
    opts.set("transpose_src", o.transpose_src);
    opts.set("transpose_dest", o.transpose_dest);
    doc.set("options", opts);
  }
  json::Value parts = json::Value::Array{};
  for (size_t l = 0; l < t.parts.size(); ++l) {
    json::Value p;
    p.set("label", label(static_cast<int>(l)));
    if (t.rooted) p.set("root", t.parts[l].workers()[0]);
    p.set("workers", json::Value::array_of(t.parts[l].workers()));
    parts.push_back(p);
  }
  doc.set("partitions", parts);
  json::Value rows = json::Value::Array{};
  for (const auto& [w, labels] : t.rows) {
    json::Value r;
    r.set("worker", w);
    for (size_t c = 0; c < labels.size(); ++c)
      r.set(t.worker_columns[c], labels[c] < 0 ? json::Value() : json::Value(label(labels[c])));
    rows.push_back(r);
  }
  doc.set("workers", rows);
  out << doc.dump() << "\n";
}

}  // namespace

int explain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  try {
    const Options o = parse(args);
    const Tables t = build(o);
    if (o.json) print_json(o, t, out);
    else print_text(o, t, out);
    return 0;
  } catch (const PartitionError& e) {
    err << "partita explain: " << e.what() << "\n";
    return 1;
  } catch (const Error& e) {
    err << "partita explain: " << e.what() << "\n" << kUsage;
    return 2;
  }
}

}  // namespace partita::tools
