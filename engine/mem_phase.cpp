// The per-thread allocation phase label (engine/mem_phase.h).
#include "engine/mem_phase.h"

#include <atomic>
#include <deque>
#include <mutex>
#include <unordered_map>

namespace leantune {

namespace {
thread_local MemPhase t_phase;
thread_local uint16_t t_site = 0;
std::atomic<int> g_site_recorders{0};

struct SiteTable {
  std::mutex mu;
  std::unordered_map<std::string, uint16_t> ids;
  std::deque<std::string> names{""};  // deque: references stay valid as it grows
};
SiteTable& sites() {
  static SiteTable* t = new SiteTable;  // never destroyed: threads may trace during exit
  return *t;
}
}  // namespace

uint16_t mem_site_id(std::string_view name) {
  if (name.empty()) return 0;
  SiteTable& t = sites();
  std::lock_guard<std::mutex> lk(t.mu);
  const std::string key(name);
  if (auto it = t.ids.find(key); it != t.ids.end()) return it->second;
  if (t.names.size() >= 0xffff) return 0;  // 0xffff stays free (autograd.h)
  const auto id = static_cast<uint16_t>(t.names.size());
  t.names.push_back(key);
  t.ids.emplace(key, id);
  return id;
}

const std::string& mem_site_name(uint16_t id) {
  SiteTable& t = sites();
  std::lock_guard<std::mutex> lk(t.mu);
  return id < t.names.size() ? t.names[id] : t.names[0];
}

uint16_t current_mem_site() { return t_site; }
bool mem_sites_wanted() { return g_site_recorders.load(std::memory_order_relaxed) > 0; }
void want_mem_sites(bool on) { g_site_recorders.fetch_add(on ? 1 : -1); }

MemSiteGuard::MemSiteGuard(uint16_t site) : prev_(t_site) { t_site = site; }
MemSiteGuard::MemSiteGuard(const char* name)
    : MemSiteGuard(mem_sites_wanted() ? mem_site_id(name) : uint16_t{0}) {}
MemSiteGuard::~MemSiteGuard() { t_site = prev_; }

MemPhase current_mem_phase() { return t_phase; }

MemPhaseGuard::MemPhaseGuard(MemPhase phase) : prev_(t_phase) { t_phase = phase; }
MemPhaseGuard::~MemPhaseGuard() { t_phase = prev_; }

MemPhase backward_phase_of(MemPhase forward) {
  if (forward.kind == MemPhaseKind::kForward) return {MemPhaseKind::kBackward, forward.layer};
  return forward;
}

std::string mem_phase_name(MemPhase p) {
  std::string base;
  switch (p.kind) {
    case MemPhaseKind::kNone:
      return "other";
    case MemPhaseKind::kForward:
      base = "forward";
      break;
    case MemPhaseKind::kBackward:
      base = "backward";
      break;
    case MemPhaseKind::kOptimizer:
      return "optimizer";
    case MemPhaseKind::kOffload:
      return "offload copy";
    case MemPhaseKind::kGeneration:
      return "generation";
    case MemPhaseKind::kEvaluation:
      return "evaluation";
  }
  return p.layer >= 0 ? base + " layer " + std::to_string(p.layer) : base;
}

}  // namespace leantune
