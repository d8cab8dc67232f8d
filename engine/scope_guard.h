// ScopeGuard: the base of the engine's scope objects, which set something for their lifetime
// (a memory tag, a stream, a phase, a capture) and put the previous state back when they end.
// Such an object cannot be copied: the copy would restore the previous state a second time.
#pragma once

namespace leantune {

class ScopeGuard {
 public:
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 protected:
  ScopeGuard() = default;
  ~ScopeGuard() = default;
};

}  // namespace leantune
