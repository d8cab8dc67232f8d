// See blas_kernels.h. The OpenBLAS entry points are weak references, as in host_memory.cpp: with
// another BLAS they are null, nothing is chosen and the report says the kernels were not
// inspected.
//
// LEANTUNE_BLAS_STATE carries the start-up step's decision into the restarted process:
//   "chosen <family> <detected> <auto|option>"    leantune set OPENBLAS_CORETYPE=<family>
//   "fallback <family> <detected> <auto|option>"  <family> failed the self-check (its message in
//                                                 LEANTUNE_BLAS_SELF_CHECK); the library's
//                                                 <detected> kernels were restored
// A state that no longer matches OPENBLAS_CORETYPE (inherited by a process whose user changed
// the variable) is ignored and the choice made anew.
#include "engine/blas_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "engine/blas_self_check.h"
#include "engine/check.h"
#include "engine/host_memory.h"
#include "engine/log.h"

extern "C" {
char* openblas_get_corename(void) __attribute__((weak));
char* openblas_get_config(void) __attribute__((weak));
}

namespace leantune {

namespace {

constexpr const char* kState = "LEANTUNE_BLAS_STATE";
constexpr const char* kSelfCheck = "LEANTUNE_BLAS_SELF_CHECK";
constexpr const char* kSimulated = ", simulated by LEANTUNE_BLAS_SIMULATE_DETECTED";

// Set by prepare_blas_kernels(): this process is trainer_bin, which has dealt with the kernels.
bool g_startup_ran = false;
bool g_self_checked = false;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
bool iequals(const std::string& a, const std::string& b) { return lower(a) == lower(b); }

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool avx512(const CpuFeatures& c) {
  return c.avx512f && c.avx512dq && c.avx512cd && c.avx512bw && c.avx512vl;
}

// The families' kernels are compiled for these instruction sets (OpenBLAS's Makefile.x86_64:
// -march=skylake-avx512 for SkylakeX, plus -mavx512bf16 for Cooperlake; Haswell and Zen use AVX2
// and FMA; Sandybridge AVX; Prescott SSE3).
const std::vector<BlasKernelFamily> kFamilies = {
    {"Cooperlake", [](const CpuFeatures& c) { return avx512(c) && c.avx512_bf16; }},
    {"SkylakeX", avx512},
    {"Zen", [](const CpuFeatures& c) { return c.is_amd() && c.avx2 && c.fma; }},
    {"Haswell", [](const CpuFeatures& c) { return c.avx2 && c.fma; }},
    {"Sandybridge", [](const CpuFeatures& c) { return c.avx; }},
    {"Prescott", [](const CpuFeatures& c) { return c.sse3; }},
};

const BlasKernelFamily* family_named(const std::string& name) {
  for (const BlasKernelFamily& f : kFamilies)
    if (iequals(f.name, name)) return &f;
  return nullptr;
}

std::string family_list() {
  std::string s;
  for (const BlasKernelFamily& f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

std::string running_core() { return openblas_get_corename ? openblas_get_corename() : ""; }

struct State {
  std::string stage, family, detected, how;
};
State parse_state(const std::string& text) {
  State s;
  std::istringstream in(text);
  in >> s.stage >> s.family >> s.detected >> s.how;
  if (s.how.empty() || (s.stage != "chosen" && s.stage != "fallback")) return {};
  return s;
}

// The state, when it still describes this process's environment.
State current_state(const BlasEnvironment& env) {
  const State s = parse_state(env_or_empty(kState));
  if (s.stage == "chosen" && iequals(env.openblas_coretype, s.family)) return s;
  const bool restored = env.simulate_detected.empty() ? env.openblas_coretype.empty()
                                                      : iequals(env.openblas_coretype, s.detected);
  if (s.stage == "fallback" && restored) return s;
  return {};
}

// Back to the library's own kernels: OPENBLAS_CORETYPE unset, or under a simulated detection
// set to the family it stands for.
void restore_library_choice(const std::string& detected) {
  if (std::getenv("LEANTUNE_BLAS_SIMULATE_DETECTED") == nullptr)
    ::unsetenv("OPENBLAS_CORETYPE");
  else
    ::setenv("OPENBLAS_CORETYPE", detected.c_str(), 1);
}

std::string detected_text(const std::string& detected, bool simulated) {
  return detected + (simulated ? kSimulated : "");
}

}  // namespace

const std::vector<BlasKernelFamily>& blas_kernel_families() { return kFamilies; }

int blas_kernel_tier(const std::string& core) {
  static const std::vector<std::pair<int, std::vector<std::string>>> tiers = {
      {1,
       {"katmai", "coppermine", "northwood", "prescott", "banias", "atom", "core2", "penryn",
        "dunnington", "nehalem", "athlon", "opteron", "opteron_sse3", "barcelona", "nano",
        "bobcat"}},
      {2, {"sandybridge", "bulldozer", "piledriver", "steamroller", "excavator"}},
      {3, {"haswell", "zen"}},
      {4, {"skylakex"}},
      {5, {"cooperlake"}}};
  const std::string c = lower(core);
  for (const auto& [tier, names] : tiers)
    if (std::find(names.begin(), names.end(), c) != names.end()) return tier;
  return 0;
}

std::string best_blas_kernels(const CpuFeatures& cpu) {
  for (const BlasKernelFamily& f : kFamilies)
    if (f.runs_on(cpu)) return blas_kernel_tier(f.name) > 1 ? f.name : "";
  return "";
}

BlasEnvironment BlasEnvironment::from_process() {
  return {env_or_empty("OPENBLAS_CORETYPE"), env_or_empty("LEANTUNE_BLAS_CORETYPE"),
          env_or_empty("LEANTUNE_BLAS_SIMULATE_DETECTED")};
}

BlasDecision decide_blas_kernels(const CpuFeatures& cpu, const std::string& running,
                                 const BlasEnvironment& env) {
  BlasDecision d;
  const std::string option = lower(env.leantune_coretype);
  const bool named = !option.empty() && option != "auto" && option != "library";
  const BlasKernelFamily* wanted = named ? family_named(option) : nullptr;
  LT_CHECK_INPUT(!named || wanted, "LEANTUNE_BLAS_CORETYPE=", env.leantune_coretype,
                 " is not auto, library or one of ", family_list());
  bool user_forced = !env.openblas_coretype.empty();
  if (!env.simulate_detected.empty()) {
    LT_CHECK_INPUT(iequals(env.openblas_coretype, env.simulate_detected) &&
                       iequals(running, env.simulate_detected),
                   "LEANTUNE_BLAS_SIMULATE_DETECTED=", env.simulate_detected,
                   " needs OPENBLAS_CORETYPE=", env.simulate_detected,
                   " (the library must run those kernels); OPENBLAS_CORETYPE is '",
                   env.openblas_coretype, "' and the library runs ", running);
    user_forced = false;
    d.simulated = true;
  }
  if (user_forced) {
    LT_CHECK_INPUT(!wanted || iequals(wanted->name, env.openblas_coretype),
                   "LEANTUNE_BLAS_CORETYPE=", env.leantune_coretype,
                   " and OPENBLAS_CORETYPE=", env.openblas_coretype, " disagree: unset one");
    return d;
  }
  d.detected = running;
  std::string want;
  if (wanted) {
    LT_CHECK_INPUT(wanted->runs_on(cpu), "LEANTUNE_BLAS_CORETYPE=", wanted->name, ": this CPU (",
                   cpu.summary(), ") cannot run those kernels; the best it runs is ",
                   best_blas_kernels(cpu).empty() ? "Prescott" : best_blas_kernels(cpu));
    want = wanted->name;
  } else if (option != "library") {
    // Only a family this table knows is second-guessed, and only by a strictly better one.
    const std::string best = best_blas_kernels(cpu);
    const int have = blas_kernel_tier(running);
    if (!best.empty() && have > 0 && have < blas_kernel_tier(best)) want = best;
  }
  if (!want.empty() && !iequals(want, running)) {
    d.force = want;
    d.by_leantune_option = wanted != nullptr;
  }
  return d;
}

BlasRestart prepare_blas_kernels() {
  g_startup_ran = true;
  if (openblas_get_corename == nullptr) return BlasRestart::kNone;
  const BlasEnvironment env = BlasEnvironment::from_process();
  const std::string running = running_core();
  const State s = current_state(env);
  if (s.stage == "fallback") return BlasRestart::kNone;
  if (s.stage == "chosen") {
    // The report says so when OpenBLAS did not load the family asked for.
    if (!iequals(running, s.family)) return BlasRestart::kNone;
    const std::string bad =
        blas_self_check(!env_or_empty("LEANTUNE_BLAS_SIMULATE_MISMATCH").empty());
    if (bad.empty()) {
      g_self_checked = true;
      return BlasRestart::kNone;
    }
    ::setenv(kState, ("fallback " + s.family + " " + s.detected + " " + s.how).c_str(), 1);
    ::setenv(kSelfCheck, bad.c_str(), 1);
    restore_library_choice(s.detected);
    return BlasRestart::kToUndoChoice;
  }
  ::unsetenv(kState);
  ::unsetenv(kSelfCheck);
  const BlasDecision d = decide_blas_kernels(cpu_features(), running, env);
  // Under an address-space limit too small for the self-check's GEMM buffer and the run's own,
  // nothing is forced: prepare_host_memory() then refuses the run with a clear message, where
  // the self-check would wait for memory forever.
  if (d.force.empty() || !blas_buffers_fit()) return BlasRestart::kNone;
  ::setenv("OPENBLAS_CORETYPE", d.force.c_str(), 1);
  const std::string how = d.by_leantune_option ? "option" : "auto";
  ::setenv(kState, ("chosen " + d.force + " " + d.detected + " " + how).c_str(), 1);
  return BlasRestart::kToLoadChoice;
}

void cancel_blas_restart() {
  const State s = parse_state(env_or_empty(kState));
  if (s.stage != "chosen") return;
  restore_library_choice(s.detected);
  ::unsetenv(kState);
}

std::string BlasReport::line() const {
  const std::string t = std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  if (library.empty()) return "BLAS: not OpenBLAS (kernels not inspected), " + t;
  return "BLAS: " + library + " " + version + ", " + kernels + " kernels (" + origin + "), " + t;
}

BlasReport blas_report() {
  BlasReport r;
  r.threads = omp_get_max_threads();
  if (openblas_get_corename == nullptr || openblas_get_config == nullptr) return r;
  std::istringstream config(openblas_get_config());
  config >> r.library >> r.version;
  r.kernels = running_core();
  const BlasEnvironment env = BlasEnvironment::from_process();
  const bool simulated = !env.simulate_detected.empty();
  const State s = current_state(env);
  bool library_choice = false;
  if (s.stage == "chosen" && iequals(r.kernels, s.family)) {
    r.origin =
        std::string(s.how == "option" ? "set by LEANTUNE_BLAS_CORETYPE" : "chosen by leantune") +
        (g_self_checked ? ", self-checked" : "") + "; the library detected " +
        detected_text(s.detected, simulated);
  } else if (s.stage == "fallback") {
    r.origin = "the library's choice" + std::string(simulated ? kSimulated : "") + "; leantune's " +
               s.family +
               " kernels failed the self-check and are not used: " + env_or_empty(kSelfCheck);
  } else if (s.stage == "chosen") {
    r.origin = "the library's choice; it did not load the " + s.family + " kernels leantune set";
  } else if (!env.openblas_coretype.empty() && !simulated) {
    r.origin =
        iequals(r.kernels, env.openblas_coretype)
            ? "set by OPENBLAS_CORETYPE"
            : "the library's choice; it does not know OPENBLAS_CORETYPE=" + env.openblas_coretype;
  } else {
    r.origin = "the library's choice" + std::string(simulated ? kSimulated : "");
    library_choice = true;
  }
  const std::string best = best_blas_kernels(cpu_features());
  const int have = blas_kernel_tier(r.kernels);
  if (library_choice && !best.empty() && have > 0 && have < blas_kernel_tier(best)) {
    r.better = best;
    r.origin += "; this CPU runs " + best + " kernels, faster: set OPENBLAS_CORETYPE=" + best;
  }
  return r;
}

void warn_once_about_blas_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (g_startup_ran) return;
    const BlasReport r = blas_report();
    if (r.better.empty()) return;
    log_message(LogLevel::kWarning, "leantune: " + r.library + " " + r.version + " runs its " +
                                        r.kernels + " kernels on this CPU (" +
                                        cpu_features().summary() + "), which runs " + r.better +
                                        " kernels, faster: set OPENBLAS_CORETYPE=" + r.better +
                                        " before starting the program");
  });
}

}  // namespace leantune
