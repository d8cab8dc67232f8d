// The budget of one rendering (Template::render): a runaway or hostile template is stopped by
// deterministic counts, never by the clock, so that a template renders the same way on every
// machine and under any load, within about a second and a bounded amount of memory.
//
//   size  the bytes of every value the rendering builds or copies: strings (and each copy of
//         one), list items, dict entries, the per-code-point pieces behind iterating a string,
//         and the output. Summed over the rendering, freed values included (so it also bounds
//         the live memory): at most kMaxBuiltBytes.
//   work  kStepUnits per evaluation step (a node), kLoopUnits more per loop iteration (its
//         frame and loop object), one unit per element compared, searched or serialised (list
//         items, dict entries) and one per kBytesPerUnit bytes built, copied, compared or
//         searched: at most kMaxWorkUnits. A unit is tens of nanoseconds at most, measured on
//         a loaded 2-core machine (tests/loaders/test_jinja.cpp, JinjaBudget), so that the limit
//         stops any template within about a second.
// Exceeding either throws EvalError naming the limit; the interpreter adds the template's name
// and the position. Outside a rendering (parsing, building the context) nothing is counted.
#pragma once

#include <cstdint>
#include <string>

#include "engine/scope_guard.h"

namespace leantune::jinja {

// A failed evaluation: the interpreter turns it into Error(kInput) with the template position
// (a TemplateLimitError when `limit`: the budget, or the longest string or list, was exceeded).
struct EvalError {
  std::string what;
  bool limit = false;
};
[[noreturn]] void eval_fail(const std::string& what);
[[noreturn]] void limit_fail(const std::string& what);

constexpr uint64_t kMaxBuiltBytes = uint64_t{256} << 20;
constexpr uint64_t kMaxWorkUnits = uint64_t{1} << 24;
constexpr uint64_t kStepUnits = 16;
constexpr uint64_t kLoopUnits = 96;
constexpr uint64_t kBytesPerUnit = 64;

// Counts against the rendering in progress on this thread (no-ops outside one).
void charge_work(uint64_t units);
// Bytes read by a search or comparison: work only.
inline void charge_scan(uint64_t bytes) { charge_work(bytes / kBytesPerUnit); }
// Bytes built or copied: the size budget, and work.
void charge_bytes(uint64_t bytes);

// The budget of one rendering, current on this thread while it lives.
class RenderBudget : ScopeGuard {
 public:
  RenderBudget();
  ~RenderBudget();
  uint64_t work() const { return work_; }
  uint64_t built_bytes() const { return bytes_; }

 private:
  friend void charge_work(uint64_t units);
  friend void charge_bytes(uint64_t bytes);
  uint64_t work_ = 0, bytes_ = 0;
  RenderBudget* outer_;
};

}  // namespace leantune::jinja
