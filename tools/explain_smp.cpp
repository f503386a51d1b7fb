// `partita explain smp --size N --partitions P [--json]`: smp's rank layout
// (docs/smp.md) for a world of N processes, from smp::Layout alone (no MPI).
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
  int size = 0, partitions = 0;
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
  config.partitions = g.partitions;
  try {
    config.validate(g.size);
  } catch (const smp::ConfigError& e) {
    err << "partita explain: " << e.what() << "\n";
    return 1;
  }
  const smp::Layout l(g.size, g.partitions);
  if (g.json) {
    json::Value doc;
    doc["layout"] = "smp";
    doc["size"] = l.size();
    doc["partitions"] = l.mp_size();
    doc["mp_size"] = l.mp_size();
    doc["dp_size"] = l.dp_size();
    doc["mp_groups"] = json::Value(l.mp_groups());
    doc["dp_groups"] = json::Value(l.dp_groups());
    json::Value ranks = json::Value::array();
    for (int r = 0; r < l.size(); ++r) {
      const smp::RankPlace p = l.place(r);
      json::Value row;
      row["rank"] = r;
      row["mp_rank"] = p.mp_rank;
      row["dp_rank"] = p.dp_rank;
      row["mp_group"] = json::Value(p.mp_group);
      row["dp_group"] = json::Value(p.dp_group);
      ranks.push_back(row);
    }
    doc["ranks"] = ranks;
    out << json::dump(doc) << "\n";
    return 0;
  }
  out << "smp: " << l.size() << " processes, " << l.mp_size() << " partitions per model replica: mp_size "
      << l.mp_size() << ", dp_size " << l.dp_size() << " (" << l.mp_groups().size() << " mp groups, "
      << l.dp_groups().size() << " dp groups)\n\n";
  std::vector<std::vector<std::string>> rows = {{"Rank", "mp_rank", "dp_rank", "mp group", "dp group"}};
  for (int r = 0; r < l.size(); ++r) {
    const smp::RankPlace p = l.place(r);
    rows.push_back({std::to_string(r), std::to_string(p.mp_rank), std::to_string(p.dp_rank), list(p.mp_group),
                    list(p.dp_group)});
  }
  print_table(rows, out);
  for (const auto& [title, groups] : {std::pair{"MP group", l.mp_groups()}, std::pair{"DP group", l.dp_groups()}}) {
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
      "smp", "partita::smp's rank layout (docs/smp.md): every rank's mp and dp rank and groups");
  c->add_option("--size", given->size, "number of processes")->required()->check(CLI::Range(1, 1 << 20));
  c->add_option("--partitions", given->partitions, "model partitions per replica (mp_size)")
      ->required()
      ->check(CLI::Range(1, 1 << 20));
  c->add_flag("--json", given->json, "print JSON instead of tables");
  c->callback([given, &action] { action = [given] { return explain_smp(*given, std::cout, std::cerr); }; });
}

}  // namespace partita::tools
