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

}  // namespace leantune
