// The per-thread allocation phase label (engine/mem_phase.h).
#include "engine/mem_phase.h"

namespace leantune {

namespace {
thread_local MemPhase t_phase;
}

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
