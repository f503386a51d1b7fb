// Internal: plans made once (issue 15). A layer's plan (who sends what to
// whom, the datatypes that address it, the outcome of the per-call checks
// and of checked mode's claim exchange) is a pure function of the headers
// every rank of the layer gathers per call. A layer keeps the plans of the
// last few header sets it saw; a call whose gathered headers equal one of
// them reuses that plan and skips the checks and the claim exchange, so the
// only collective left before the data moves is the header exchange itself.
//
// Every rank of the layer gathers the same headers and runs the same calls
// in the same order, so every rank hits or misses alike: a plan is stored
// only after its checks passed on every rank (they agree or throw on all),
// never after a failure. A plan made with checked mode off (its claims
// never exchanged) is not reused once checked mode is on.
#pragma once

#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "detail/plan_check.hpp"
#include "detail/team_comm.hpp"

namespace partita::mpi::detail {

inline bool same_headers(const std::vector<Header>& a, const std::vector<Header>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(Header)) == 0);
}

template <typename Plan>
class PlanCache {
 public:
  static constexpr size_t kEntries = 8;

  // The plan made from these headers, or null (then make it, check it, and
  // insert it).
  std::shared_ptr<const Plan> find(const std::vector<Header>& headers) const {
    const bool need_checked = checked_mode();
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (!same_headers(entries_[i].headers, headers)) continue;
      if (need_checked && !entries_[i].checked) return nullptr;
      if (i > 0) std::swap(entries_[i], entries_[0]);  // most recent first
      return entries_[0].plan;
    }
    return nullptr;
  }

  // After the plan's checks passed (on every rank).
  void insert(const std::vector<Header>& headers, std::shared_ptr<const Plan> plan) const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < entries_.size(); ++i)
      if (same_headers(entries_[i].headers, headers)) {
        entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    if (entries_.size() == kEntries) entries_.pop_back();
    entries_.insert(entries_.begin(), Entry{headers, std::move(plan), checked_mode()});
  }

 private:
  struct Entry {
    std::vector<Header> headers;
    std::shared_ptr<const Plan> plan;
    bool checked = false;  // made with checked mode on (claims exchanged)
  };
  mutable std::mutex mutex_;
  mutable std::vector<Entry> entries_;
};

}  // namespace partita::mpi::detail
