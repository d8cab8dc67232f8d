// The rendering budget (see budget.h).
#include "loaders/jinja/budget.h"

namespace leantune::jinja {

namespace {
thread_local RenderBudget* t_current = nullptr;
}  // namespace

void eval_fail(const std::string& what) { throw EvalError{what}; }
void limit_fail(const std::string& what) { throw EvalError{what, true}; }

RenderBudget::RenderBudget() : outer_(t_current) { t_current = this; }
RenderBudget::~RenderBudget() { t_current = outer_; }

void charge_work(uint64_t units) {
  RenderBudget* b = t_current;
  if (b == nullptr) return;
  b->work_ += units;
  if (b->work_ > kMaxWorkUnits)
    limit_fail("template exceeds the evaluation step limit of " + std::to_string(kMaxWorkUnits) +
               " units of work per rendering (" + std::to_string(kStepUnits) +
               " per step, 1 per item compared, 1 per " + std::to_string(kBytesPerUnit) +
               " bytes built or searched; about a second)");
}

void charge_bytes(uint64_t bytes) {
  RenderBudget* b = t_current;
  if (b == nullptr) return;
  b->bytes_ += bytes;
  if (b->bytes_ > kMaxBuiltBytes)
    limit_fail("the values the template built exceed the size limit of " +
               std::to_string(kMaxBuiltBytes >> 20) +
               " MiB per rendering (strings, their copies, list items and dict entries)");
  charge_work(bytes / kBytesPerUnit);
}

}  // namespace leantune::jinja
