// The choice of OpenBLAS kernel family (engine/blas_kernels.h) for CPUs this machine is not: the
// decision is a function of the CPU's features, so each row gives it a made-up CPU (the issue's
// Emerald Rapids Xeon among them). Also: the self-check passes on the loaded library and catches
// a wrong element, and cpuid agrees with the kernel's /proc/cpuinfo flags on this machine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "engine/blas_kernels.h"
#include "engine/blas_self_check.h"
#include "engine/check.h"
#include "testing/testing.h"

namespace leantune {
namespace {

CpuFeatures cpu(const char* vendor, int level) {
  // level: 1 SSE3, 2 AVX, 3 AVX2 + FMA, 4 AVX-512, 5 AVX-512 + BF16.
  CpuFeatures c;
  c.vendor = vendor;
  c.sse3 = true;
  c.avx = level >= 2;
  c.avx2 = c.fma = level >= 3;
  c.avx512f = c.avx512dq = c.avx512cd = c.avx512bw = c.avx512vl = level >= 4;
  c.avx512_bf16 = level >= 5;
  return c;
}
const char* kIntel = "GenuineIntel";
const char* kAmd = "AuthenticAMD";

struct Row {
  const char* what;
  CpuFeatures cpu;
  const char* running;
  BlasEnvironment env;
  const char* force;  // expected ("" keep)
  const char* detected;
};

TEST(BlasKernels, DecisionTable) {
  CpuFeatures avx512_no_vl = cpu(kIntel, 4);
  avx512_no_vl.avx512vl = false;  // not a SkylakeX-class CPU: its kernels use VL
  // One case per row, as written (clang-format would split the rows that wrap).
  // clang-format off
  const Row rows[] = {
      {"Emerald Rapids, library fell back to Prescott", cpu(kIntel, 5), "Prescott", {},
       "Cooperlake", "Prescott"},
      {"Skylake-SP, Prescott", cpu(kIntel, 4), "Prescott", {}, "SkylakeX", "Prescott"},
      {"AVX-512 CPU given Haswell kernels", cpu(kIntel, 4), "Haswell", {}, "SkylakeX", "Haswell"},
      {"AVX-512F without VL counts as AVX2", avx512_no_vl, "Prescott", {}, "Haswell", "Prescott"},
      {"Haswell-class Intel, Prescott", cpu(kIntel, 3), "Prescott", {}, "Haswell", "Prescott"},
      {"Zen 2, Prescott", cpu(kAmd, 3), "Prescott", {}, "Zen", "Prescott"},
      {"Zen 2 already on Zen", cpu(kAmd, 3), "Zen", {}, "", "Zen"},
      {"Zen 2 on Haswell: same tier", cpu(kAmd, 3), "Haswell", {}, "", "Haswell"},
      {"Zen 4 on Cooperlake (this machine)", cpu(kAmd, 5), "Cooperlake", {}, "", "Cooperlake"},
      {"Sandy Bridge, Prescott", cpu(kIntel, 2), "Prescott", {}, "Sandybridge", "Prescott"},
      {"SSE3-only CPU keeps Prescott", cpu(kIntel, 1), "Prescott", {}, "", "Prescott"},
      {"a core name the table does not know", cpu(kIntel, 5), "SapphireRapids", {}, "",
       "SapphireRapids"},
      {"names are case-insensitive", cpu(kIntel, 5), "COOPERLAKE", {}, "", "COOPERLAKE"},
      {"the user's OPENBLAS_CORETYPE is respected", cpu(kIntel, 5), "Prescott",
       {"Prescott", "", ""}, "", ""},
      {"LEANTUNE_BLAS_CORETYPE=library keeps Prescott", cpu(kIntel, 5), "Prescott",
       {"", "library", ""}, "", "Prescott"},
      {"LEANTUNE_BLAS_CORETYPE=auto", cpu(kIntel, 4), "Prescott", {"", "auto", ""}, "SkylakeX",
       "Prescott"},
      {"LEANTUNE_BLAS_CORETYPE names a lower family", cpu(kAmd, 5), "Cooperlake",
       {"", "haswell", ""}, "Haswell", "Cooperlake"},
      {"LEANTUNE_BLAS_CORETYPE already running", cpu(kAmd, 5), "Haswell", {"", "Haswell", ""},
       "", "Haswell"},
      {"both variables agree", cpu(kIntel, 5), "SkylakeX", {"skylakex", "SkylakeX", ""}, "", ""},
      {"simulated detection", cpu(kIntel, 4), "Prescott", {"Prescott", "", "Prescott"},
       "SkylakeX", "Prescott"},
  };
  // clang-format on
  for (const Row& r : rows) {
    SCOPED_TRACE(r.what);
    const BlasDecision d = decide_blas_kernels(r.cpu, r.running, r.env);
    EXPECT_EQ(d.force, r.force);
    EXPECT_EQ(d.detected, r.detected);
    EXPECT_EQ(d.simulated, !r.env.simulate_detected.empty());
    EXPECT_EQ(d.by_leantune_option, !d.force.empty() && !r.env.leantune_coretype.empty() &&
                                        r.env.leantune_coretype != "auto");
  }
}

TEST(BlasKernels, EnvironmentItCannotHonourIsAnInputError) {
  struct Bad {
    CpuFeatures cpu;
    const char* running;
    BlasEnvironment env;
    const char* fragment;
  };
  const Bad rows[] = {
      {cpu(kIntel, 5), "Prescott", {"", "Icelake", ""}, "LEANTUNE_BLAS_CORETYPE=Icelake is not"},
      {cpu(kIntel, 3), "Haswell", {"", "SkylakeX", ""}, "cannot run those kernels"},
      {cpu(kIntel, 5), "Zen", {"Zen", "Haswell", ""}, "disagree"},
      {cpu(kIntel, 5), "Cooperlake", {"", "", "Prescott"}, "needs OPENBLAS_CORETYPE=Prescott"},
      {cpu(kIntel, 5), "Cooperlake", {"Prescott", "", "Prescott"}, "the library runs Cooperlake"},
  };
  for (const Bad& b : rows) {
    try {
      decide_blas_kernels(b.cpu, b.running, b.env);
      ADD_FAILURE() << "no error for " << b.fragment;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find(b.fragment), std::string::npos) << e.what();
    }
  }
}

TEST(BlasKernels, FamiliesAreBestFirstAndKnownToTheTierTable) {
  int last = 99;
  for (const BlasKernelFamily& f : blas_kernel_families()) {
    const int tier = blas_kernel_tier(f.name);
    EXPECT_GT(tier, 0) << f.name;
    EXPECT_LE(tier, last) << f.name;
    last = tier;
  }
  EXPECT_EQ(blas_kernel_tier("Prescott"), 1);
  EXPECT_EQ(blas_kernel_tier("Unknown"), 0);
  EXPECT_EQ(best_blas_kernels(cpu(kIntel, 1)), "");
  EXPECT_EQ(best_blas_kernels(cpu(kAmd, 4)), "SkylakeX");
}

TEST(BlasKernels, SelfCheckPassesOnTheLoadedKernelsAndCatchesAWrongElement) {
  EXPECT_EQ(blas_self_check(), "");
  const std::string bad = blas_self_check(/*perturb=*/true);
  EXPECT_NE(bad.find("sgemm 61x47x83 A B^T: C[30,23] is "), std::string::npos) << bad;
  EXPECT_NE(bad.find("where a naive loop gives"), std::string::npos) << bad;
}

// The kernel shows a feature in /proc/cpuinfo only when it also saves its registers, as
// cpu_features() requires.
TEST(BlasKernels, CpuidAgreesWithProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, vendor;
  std::set<std::string> flags;
  while (std::getline(in, line)) {
    if (line.rfind("vendor_id", 0) == 0 && vendor.empty()) vendor = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      for (std::string w; words >> w;) flags.insert(w);
      break;
    }
  }
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(f.vendor, vendor);
  EXPECT_EQ(f.avx2, flags.count("avx2") == 1);
  EXPECT_EQ(f.fma, flags.count("fma") == 1);
  EXPECT_EQ(f.avx512f, flags.count("avx512f") == 1);
  EXPECT_EQ(f.avx512bw, flags.count("avx512bw") == 1);
  EXPECT_EQ(f.avx512vl, flags.count("avx512vl") == 1);
  EXPECT_EQ(f.avx512_bf16, flags.count("avx512_bf16") == 1);
}

TEST(BlasKernels, ReportNamesTheLibraryTheKernelsAndTheThreads) {
  const BlasReport r = blas_report();
  ASSERT_EQ(r.library, "OpenBLAS");
  EXPECT_FALSE(r.version.empty());
  EXPECT_GT(blas_kernel_tier(r.kernels), 0) << r.kernels;
  // A family forced by the user is the one running (the fixture runs under each family rely on
  // it: tests/engine/blas.cmake).
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE")) {
    EXPECT_EQ(r.kernels, forced);
    EXPECT_NE(r.line().find("(set by OPENBLAS_CORETYPE)"), std::string::npos) << r.line();
  }
  const std::string line = r.line();
  EXPECT_EQ(line.rfind("BLAS: OpenBLAS " + r.version + ", " + r.kernels + " kernels (", 0), 0u)
      << line;
  EXPECT_NE(line.find(std::to_string(r.threads) + " thread"), std::string::npos) << line;
}

// A host that embeds the library (this test binary) is told once which variable to set when the
// library's kernels are worse than the CPU's; blas.cmake also runs this test under a simulated
// Prescott detection, where the warning must name the CPU's best family.
TEST(BlasKernels, LibraryWarnsOnceWhenItsKernelsAreWorseThanTheCpus) {
  const BlasReport r = blas_report();
  const std::string best = best_blas_kernels(cpu_features());
  if (std::getenv("LEANTUNE_BLAS_SIMULATE_DETECTED") && !best.empty()) {
    EXPECT_EQ(r.better, best);
  }
  ::testing::internal::CaptureStderr();
  warn_once_about_blas_kernels();
  warn_once_about_blas_kernels();
  const std::string out = ::testing::internal::GetCapturedStderr();
  if (r.better.empty()) {
    EXPECT_EQ(out, "");
  } else {
    EXPECT_EQ(out.rfind("leantune: OpenBLAS ", 0), 0u) << out;
    EXPECT_EQ(out.find('\n'), out.size() - 1) << "one line: " << out;
    EXPECT_NE(out.find("set OPENBLAS_CORETYPE=" + r.better + " before starting the program"),
              std::string::npos)
        << out;
  }
}

}  // namespace
}  // namespace leantune
