// What the program is doing when it allocates: forward or backward of decoder layer i, the
// optimizer step, an offload copy, generation, evaluation. A per-thread label that the
// allocator stores with every trace event (engine/allocator.h), so a memory trace says which
// phase caused each allocation and which phase the live blocks at the peak came from.
//
// The model sets it (MemPhaseGuard) around each decoder layer's forward; autograd nodes keep
// the forward phase they were created in, and backward runs each node under the matching
// backward phase; the trainer marks the optimizer step and evaluation; the offloader its
// copies; generate() its whole run.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/scope_guard.h"

namespace leantune {

enum class MemPhaseKind : uint8_t {
  kNone,  // outside any marked phase (setup, data, loading)
  kForward,
  kBackward,
  kOptimizer,
  kOffload,
  kGeneration,
  kEvaluation,
};

struct MemPhase {
  MemPhaseKind kind = MemPhaseKind::kNone;
  int32_t layer = -1;  // decoder layer for forward/backward; -1: outside the layers
  bool operator==(const MemPhase&) const = default;
};

MemPhase current_mem_phase();
// "forward layer 3", "backward", "optimizer", "offload copy", "generation", "other", ...
std::string mem_phase_name(MemPhase phase);
// The backward phase matching a forward phase (other phases are returned unchanged).
MemPhase backward_phase_of(MemPhase forward);

class MemPhaseGuard : ScopeGuard {
 public:
  explicit MemPhaseGuard(MemPhase phase);
  MemPhaseGuard(MemPhaseKind kind, int32_t layer = -1) : MemPhaseGuard(MemPhase{kind, layer}) {}
  ~MemPhaseGuard();

 private:
  MemPhase prev_;
};

// The allocation site within a phase: the model's module in forward ("self_attn", "mlp",
// "lm_head"), the autograd node in backward ("mlp: LinearBackward"), stored with every trace event
// beside the phase. Sites are interned names; 0 is none. Names are only worth making while a trace
// records them: mem_sites_wanted() says so (Allocator::set_trace_enabled counts the tracers).
uint16_t mem_site_id(std::string_view name);    // interns; 0 once 65535 names exist
const std::string& mem_site_name(uint16_t id);  // "" for 0
uint16_t current_mem_site();
bool mem_sites_wanted();
void want_mem_sites(bool on);  // one more (or one fewer) recorder of sites

class MemSiteGuard : ScopeGuard {
 public:
  explicit MemSiteGuard(uint16_t site);
  // A module's name as the site (interned only while a trace records sites).
  explicit MemSiteGuard(const char* name);
  ~MemSiteGuard();

 private:
  uint16_t prev_;
};

}  // namespace leantune
