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
//
// Static shapes (Shapes::kStatic, docs/static-shapes.md): the cache also
// keeps the first call's headers and plan. Later calls compare this rank's
// header with its own first one and reuse that plan without any exchange
// (with PARTITA_CHECK_STATIC_SHAPES=1 they exchange and compare every
// rank's header with the first call's, on every rank).
#pragma once

#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "detail/layer_checks.hpp"
#include "detail/plan_check.hpp"
#include "detail/static_shapes.hpp"
#include "detail/team_comm.hpp"

namespace partita::mpi::detail {

inline bool same_headers(const std::vector<Header>& a, const std::vector<Header>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(Header)) == 0);
}

// `now` as the static-shapes promise of `first` covers it: a call under
// grad mode off keeps any promise about requires_grad (it attaches nothing
// whatever the plan says: a layer trained with grad is evaluated under
// NoGradGuard), and one made under grad mode off (a plan that attaches
// nothing) holds for an input that wants no gradient.
inline Header as_promised(Header now, const Header& first) {
  if (now.requires_grad == Header::kGradModeOff ||
      (first.requires_grad == Header::kGradModeOff && now.requires_grad == Header::kNoGrad))
    now.requires_grad = first.requires_grad;
  return now;
}

// The static-shapes pieces that are not templates (static_shapes.cpp).
std::string describe_header(const Header& h);
// exchange_headers with this rank's `promised` choice in its header: raises
// PartitionError on every rank unless every member made the same choice.
void exchange_promised_headers(const Partition& P, Header mine, bool promised,
                               const std::string& what, std::vector<Header>& headers);
// On every rank: ShapeError (input.static_shapes) for the first member
// whose header differs from its header at the first call.
void check_header_promise(const Partition& P, const std::string& what,
                          const std::vector<Header>& first, const std::vector<Header>& now);

template <typename Plan>
class PlanCache {
 public:
  static constexpr size_t kEntries = 8;

  // Shapes::kStatic (set once, at the layer's construction).
  void set_static_shapes(bool on) { static_ = on; }

  // A call's plan, or null after filling `headers` (then make the plan from
  // them, check it, and insert it; `headers` is left alone on a hit).
  // Collective over P's active members unless static shapes skip the
  // exchange.
  std::shared_ptr<const Plan> lookup(const Partition& P, Header mine, const std::string& what,
                                     std::vector<Header>& headers) const {
    mine.static_shapes = static_ ? 1 : 0;
    if (static_) {
      std::shared_ptr<const Pin> first;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        first = pin_;
      }
      if (first && (first->checked || !checked_mode())) {
        if (!check_static_shapes()) {
          const Header& was = first->headers.at(static_cast<size_t>(P.rank()));
          if (!same_statement(as_promised(mine, was), was))
            raise_broken_promise(what, "worker " + std::to_string(P.workers()[P.rank()]),
                                 describe_header(was), describe_header(mine));
          return first->plan;
        }
        exchange_promised_headers(P, mine, true, what, gathered());
        agree_attach(what, P, gathered());  // grad wanted on one rank, off on another
        check_header_promise(P, what, first->headers, gathered());
        // A first plan that attaches the adjoint attaches it on every rank
        // whose grad mode is on: then every rank's must be on, or off.
        for (const Header& h : first->headers)
          if (h.requires_grad == Header::kWantsGrad) {
            check_grad_modes_alike(what, P, gathered());
            break;
          }
        return first->plan;
      }
    }
    std::vector<Header>& now = gathered();
    exchange_promised_headers(P, mine, static_, what, now);
    auto hit = find(now);
    if (hit && static_) pin(now, hit);
    if (!hit) headers = now;
    return hit;
  }

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
    entries_.insert(entries_.begin(), Entry{headers, plan, checked_mode()});
    if (static_) pin_ = std::make_shared<const Pin>(Pin{headers, std::move(plan), checked_mode()});
  }

 private:
  // The first call's headers and plan under static shapes.
  struct Pin {
    std::vector<Header> headers;
    std::shared_ptr<const Plan> plan;
    bool checked = false;
  };
  void pin(const std::vector<Header>& headers, std::shared_ptr<const Plan> plan) const {
    std::lock_guard<std::mutex> lock(mutex_);
    pin_ = std::make_shared<const Pin>(Pin{headers, std::move(plan), checked_mode()});
  }
  bool static_ = false;
  mutable std::shared_ptr<const Pin> pin_;

  // Where a call's headers are gathered: this thread's, so that a hit, the
  // common case, allocates nothing (the capacity stays from call to call).
  static std::vector<Header>& gathered() {
    static thread_local std::vector<Header> v;
    return v;
  }

  struct Entry {
    std::vector<Header> headers;
    std::shared_ptr<const Plan> plan;
    bool checked = false;  // made with checked mode on (claims exchanged)
  };
  mutable std::mutex mutex_;
  mutable std::vector<Entry> entries_;
};

}  // namespace partita::mpi::detail
