#include "dashboard.hpp"

#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>

#include "partita/errors.hpp"

namespace partita::perf {

extern const char* const kDashboardTemplate;  // dashboard_template.html, embedded at build time

std::string dashboard_html(const std::vector<Run>& runs) {
  json::Value list = json::Value::array();
  for (const auto& r : runs) list.push_back(to_json(r));
  std::string data = json::dump(list);
  // Inside <script>, "</" could close the element.
  for (size_t at = data.find("</"); at != std::string::npos; at = data.find("</", at + 3))
    data.replace(at, 2, "<\\/");
  std::string html = kDashboardTemplate;
  const std::string marker = "/*PARTITA_RUNS*/";
  const auto at = html.find(marker);
  if (at == std::string::npos) throw Error("dashboard template has no " + marker);
  html.replace(at, marker.size(), data);
  return html;
}

std::vector<std::string> verify_dashboard_dom(const std::string& dom, const std::vector<Run>& runs) {
  std::vector<std::string> problems;
  // What must be drawn: "plot|series-or-run|key" -> value.
  std::map<std::string, double> expected;
  if (!runs.empty()) {
    for (const auto& b : runs.back().benchmarks) {
      expected["time|partita|" + b.key()] = b.time_us.summary.median;
      expected["time|mpi|" + b.key()] = b.mpi_time_us.summary.median;
      if (!b.peer.empty()) expected["time|peer|" + b.key()] = b.peer_time_us.summary.median;
    }
  }
  for (size_t i = 0; i < runs.size(); ++i)
    for (const auto& b : runs[i].benchmarks)
      expected["ratio|" + std::to_string(i) + "|" + b.key()] = b.ratio.summary.median;

  const std::regex circle("<circle\\b[^>]*>"), attr("([a-zA-Z-]+)=\"([^\"]*)\"");
  std::map<std::string, int> seen;
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), circle); it != std::sregex_iterator(); ++it) {
    const std::string tag = it->str();
    std::map<std::string, std::string> a;
    for (auto m = std::sregex_iterator(tag.begin(), tag.end(), attr); m != std::sregex_iterator(); ++m)
      a[(*m)[1]] = (*m)[2];
    if (a["class"] != "point") continue;
    const std::string id = a["data-plot"] == "time" ? "time|" + a["data-series"] + "|" + a["data-key"]
                                                    : "ratio|" + a["data-run"] + "|" + a["data-key"];
    ++seen[id];
    const auto want = expected.find(id);
    if (want == expected.end()) {
      problems.push_back("a point that is not in the data: " + id);
      continue;
    }
    const double got = std::strtod(a["data-value"].c_str(), nullptr);
    if (std::abs(got - want->second) > 1e-9 * std::max(1.0, std::abs(want->second)))
      problems.push_back(id + " drawn with value " + a["data-value"] + ", the data has " +
                         std::to_string(want->second));
    for (const char* c : {"cx", "cy"}) {
      const double v = std::strtod(a[c].c_str(), nullptr);
      if (a[c].empty() || !std::isfinite(v) || v < 0 || v > 2000)
        problems.push_back(id + " has " + c + "=\"" + a[c] + "\"");
    }
  }
  for (const auto& [id, value] : expected) {
    if (!seen.count(id)) problems.push_back("missing point " + id);
    else if (seen[id] > 1) problems.push_back("point " + id + " drawn " + std::to_string(seen[id]) + " times");
  }
  return problems;
}

}  // namespace partita::perf
