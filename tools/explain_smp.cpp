// `partita explain smp --size N --partitions P [--tensor-parallel-degree T]
// [--json]`: smp's rank layout (docs/smp.md, docs/3d.md) for a world of N
// processes, from smp::Layout alone (no MPI). With T = 1 (the default) the
// output is the 2-D table of seed 004; with T > 1 every rank's pp and tp
// rank and groups are added.
#include <iostream>
#include <memory>
#include <sstream>

#include "explain.hpp"
#include "partita/cli.hpp"
#include "partita/json.hpp"
#include "partita/smp.hpp"

namespace partita::tools {

namespace {

struct SmpGiven {
  int size = 0, partitions = 0, tp = 1;
  bool json = false;
};

std::string list(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str() + "]";
}

// Left-aligned columns, two spaces apart, no trailing blanks.
void print_table(const std::vector<std::vector<std::string>>& rows, std::ostream& out) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], r[c].size());
    }
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

int explain_smp(const SmpGiven& g, std::ostream& out, std::ostream& err) {
  smp::Config config;
  config.partitions(g.partitions);
  config.tensor_parallel_degree(g.tp);
  try {
    config.validate(g.size);
  } catch (const smp::ConfigError& e) {
    err << "partita explain: " << e.what() << "\n";
    return 1;
  }
  const smp::Layout l(g.size, g.partitions, g.tp);
  const bool three_d = l.tp_size() > 1;
  if (g.json) {
    json::Value doc;
    doc["layout"] = "smp";
    doc["size"] = l.size();
    doc["partitions"] = l.pp_size();
    if (three_d) {
      doc["tensor_parallel_degree"] = l.tp_size();
      doc["pp_size"] = l.pp_size();
      doc["tp_size"] = l.tp_size();
    }
    doc["mp_size"] = l.mp_size();
    doc["dp_size"] = l.dp_size();
    doc["mp_groups"] = json::Value(l.mp_groups());
    doc["dp_groups"] = json::Value(l.dp_groups());
    if (three_d) {
      doc["tp_groups"] = json::Value(l.tp_groups());
      doc["pp_groups"] = json::Value(l.pp_groups());
    }
    json::Value ranks = json::Value::array();
    for (int r = 0; r < l.size(); ++r) {
      const smp::RankPlace p = l.place(r);
      json::Value row;
      row["rank"] = r;
      row["mp_rank"] = p.mp_rank;
      row["dp_rank"] = p.dp_rank;
      if (three_d) {
        row["pp_rank"] = p.pp_rank;
        row["tp_rank"] = p.tp_rank;
      }
      row["mp_group"] = json::Value(p.mp_group);
      row["dp_group"] = json::Value(p.dp_group);
      if (three_d) {
        row["tp_group"] = json::Value(p.tp_group);
        row["pp_group"] = json::Value(p.pp_group);
      }
      ranks.push_back(row);
    }
    doc["ranks"] = ranks;
    out << json::dump(doc) << "\n";
    return 0;
  }
  if (three_d) {
    out << "smp: " << l.size() << " processes = dp_size " << l.dp_size() << " x pp_size " << l.pp_size()
        << " x tp_size " << l.tp_size() << " (rank = (dp_rank * pp_size + pp_rank) * tp_size + tp_rank); mp_size "
        << l.mp_size() << " (" << l.mp_groups().size() << " mp groups, " << l.dp_groups().size() << " dp groups, "
        << l.tp_groups().size() << " tp groups, " << l.pp_groups().size() << " pp groups)\n\n";
  } else {
    out << "smp: " << l.size() << " processes, " << l.mp_size() << " partitions per model replica: mp_size "
        << l.mp_size() << ", dp_size " << l.dp_size() << " (" << l.mp_groups().size() << " mp groups, "
        << l.dp_groups().size() << " dp groups)\n\n";
  }
  std::vector<std::vector<std::string>> rows = {{"Rank", "mp_rank", "dp_rank", "mp group", "dp group"}};
  if (three_d) rows[0] = {"Rank", "dp_rank", "pp_rank", "tp_rank", "mp_rank", "tp group", "pp group", "mp group", "dp group"};
  for (int r = 0; r < l.size(); ++r) {
    const smp::RankPlace p = l.place(r);
    if (three_d)
      rows.push_back({std::to_string(r), std::to_string(p.dp_rank), std::to_string(p.pp_rank),
                      std::to_string(p.tp_rank), std::to_string(p.mp_rank), list(p.tp_group), list(p.pp_group),
                      list(p.mp_group), list(p.dp_group)});
    else
      rows.push_back({std::to_string(r), std::to_string(p.mp_rank), std::to_string(p.dp_rank), list(p.mp_group),
                      list(p.dp_group)});
  }
  print_table(rows, out);
  std::vector<std::pair<const char*, std::vector<std::vector<int>>>> tables = {{"MP group", l.mp_groups()},
                                                                              {"DP group", l.dp_groups()}};
  if (three_d) {
    tables.emplace_back("TP group", l.tp_groups());
    tables.emplace_back("PP group", l.pp_groups());
  }
  for (const auto& [title, groups] : tables) {
    out << "\n";
    std::vector<std::vector<std::string>> g_rows = {{title, "Ranks"}};
    for (size_t i = 0; i < groups.size(); ++i) g_rows.push_back({std::to_string(i), list(groups[i])});
    print_table(g_rows, out);
  }
  return 0;
}

}  // namespace

void add_explain_smp(CLI::App& explain, std::function<int()>& action) {
  auto given = std::make_shared<SmpGiven>();
  CLI::App* c = explain.add_subcommand(
      "smp", "partita::smp's rank layout (docs/smp.md, docs/3d.md): every rank's mp, dp (and with "
      "tensor parallelism pp and tp) rank and groups");
  // Every rank's row lists its groups: the output grows with the size
  // squared (about 5 MB at kMaxSize with one partition).
  constexpr int kMaxSize = 1024;
  c->add_option("--size", given->size, "number of processes (at most 1024)")
      ->required()
      ->check(CLI::Range(1, kMaxSize));
  c->add_option("--partitions", given->partitions, "pipeline stages per replica (pp_size; mp_size without tensor parallelism)")
      ->required()
      ->check(CLI::Range(1, kMaxSize));
  c->add_option("--tensor-parallel-degree", given->tp,
                 "ranks per pipeline stage (tensor_parallel_degree; default 1)")
      ->check(CLI::Range(1, kMaxSize));
  c->add_flag("--json", given->json, "print JSON instead of tables");
  c->callback([given, &action] { action = [given] { return explain_smp(*given, std::cout, std::cerr); }; });
}

}  // namespace partita::tools
