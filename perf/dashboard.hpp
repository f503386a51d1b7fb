// The static dashboard: one self-contained HTML file (data, script and
// styles inline; opens from a file, no server) drawn from stored runs, and
// the check that a browser-rendered copy of it shows every data point.
#pragma once

#include <string>
#include <vector>

#include "results.hpp"

namespace partita::perf {

std::string dashboard_html(const std::vector<Run>& runs);

// Checks the DOM a browser produced from dashboard_html(runs) (e.g.
// `chromium --headless --dump-dom`): the time plot has a partita and a raw
// MPI point for every benchmark of the latest run, the ratio plot a point
// for every benchmark of every run, each at its value, at finite
// coordinates, and nothing else. Returns the problems (empty: all there).
std::vector<std::string> verify_dashboard_dom(const std::string& dom, const std::vector<Run>& runs);

}  // namespace partita::perf
