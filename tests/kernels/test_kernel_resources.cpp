// The CUDA build's ptxas report (<build>/ptxas/*.tsv, written by scripts/ptxas_log.sh for every
// kernel and architecture compiled) checked against each architecture's limits: no kernel may
// spill registers, and static plus dynamic shared memory must fit the per-block opt-in limit
// unless the launcher falls back to another variant on devices where it does not fit (the
// fallback list below). Dynamic shared memory comes from the kernels' own tile headers. In a
// CPU-only build there is nothing to check. Benchmark programs' kernels are recorded too but not
// checked here.
#include <cxxabi.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/attention_tiles.h"

namespace leantune {
namespace {

namespace tiles = kernels::attention_tiles;

struct KernelRow {
  std::string file, arch, name;  // name demangled
  long regs = 0, stack = 0, spill_st = 0, spill_ld = 0, smem = 0;
};

std::vector<KernelRow> read_report(const std::filesystem::path& dir) {
  std::vector<KernelRow> rows;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    // The library's kernels; benchmark programs' own kernels are listed but not checked.
    if (e.path().extension() != ".tsv" || e.path().filename().string().find("bench") == 0 ||
        e.path().filename().string().find("_bench_") != std::string::npos)
      continue;
    std::ifstream in(e.path());
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      KernelRow r;
      std::string mangled;
      r.file = e.path().filename().string();
      if (!(ls >> r.arch >> mangled >> r.regs >> r.stack >> r.spill_st >> r.spill_ld >> r.smem))
        continue;
      int status = 0;
      std::unique_ptr<char, void (*)(void*)> d(
          abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), std::free);
      r.name = status == 0 && d ? d.get() : mangled;
      rows.push_back(r);
    }
  }
  return rows;
}

// Opt-in shared memory per block (CUDA programming guide, compute capabilities table).
long smem_limit(const std::string& arch) {
  static const std::map<std::string, long> limits = {
      {"sm_80", 163 * 1024}, {"sm_86", 99 * 1024},   {"sm_87", 163 * 1024},  {"sm_89", 99 * 1024},
      {"sm_90", 227 * 1024}, {"sm_90a", 227 * 1024}, {"sm_100", 227 * 1024}, {"sm_120", 99 * 1024}};
  auto it = limits.find(arch);
  return it == limits.end() ? -1 : it->second;
}

// The integer template arguments of a demangled kernel name: "k<__half, 128, 4>(...)" -> 128 4.
std::vector<int> int_args(const std::string& name) {
  std::vector<int> out;
  const size_t lt = name.find('<'), gt = name.find('>');
  if (lt == std::string::npos || gt == std::string::npos) return out;
  std::istringstream ss(name.substr(lt + 1, gt - lt - 1));
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    char* end = nullptr;
    const long v = std::strtol(tok.c_str(), &end, 10);
    if (end != tok.c_str() && *end == '\0') out.push_back(static_cast<int>(v));
  }
  return out;
}

bool has(const std::string& s, const char* sub) { return s.find(sub) != std::string::npos; }

struct Dynamic {
  long bytes = 0;
  bool fallback = false;  // the launcher picks another variant where this one does not fit
};

// Dynamic shared memory of a kernel, from the same constants its launcher uses.
Dynamic dynamic_smem(const std::string& name) {
  const std::vector<int> a = int_args(name);
  if (has(name, "attention_fwd_mma_kernel<") && a.size() == 1)
    return {a[0] == 64 ? tiles::FwdCfg<64>::kSmem : tiles::FwdCfg<128>::kSmem, false};
  if (has(name, "attention_bwd_mma_kernel<") && a.size() == 2) {
    if (a[0] == 64) return {tiles::BwdCfg<64, 8>::kSmem, false};
    // D=128 with 8 warps falls back to the 4-warp tile (kernels/attention.cu bwd128_warps).
    if (a[1] == 8) return {tiles::BwdCfg<128, 8>::kSmem, true};
    return {tiles::BwdCfg<128, 4>::kSmem, false};
  }
  // rms_norm's backward: its launcher refuses more than 48 KiB (kernels/rms_norm.cu).
  if (has(name, "rms_norm_bwd_kernel<")) return {48 * 1024, false};
  return {};
}

std::filesystem::path report_dir() { return std::filesystem::path(LT_BINARY_DIR) / "ptxas"; }

TEST(KernelResources, NoSpillsAndSharedMemoryWithinEachArchitecture) {
  if (!LT_BUILT_WITH_CUDA) GTEST_SKIP() << "CPU-only build: no CUDA kernels";
  ASSERT_TRUE(std::filesystem::is_directory(report_dir()))
      << report_dir() << " missing: the CUDA build writes it (scripts/ptxas_log.sh)";
  const std::vector<KernelRow> rows = read_report(report_dir());
  ASSERT_FALSE(rows.empty()) << "no kernels in " << report_dir();
  int mma_kernels = 0;
  for (const KernelRow& r : rows) {
    SCOPED_TRACE(r.arch + " " + r.name + " (" + r.file + ")");
    EXPECT_EQ(r.spill_st, 0) << "spill stores";
    EXPECT_EQ(r.spill_ld, 0) << "spill loads";
    EXPECT_LE(r.regs, 255);
    const long limit = smem_limit(r.arch);
    ASSERT_GT(limit, 0) << "unknown architecture " << r.arch << ": add its shared-memory limit";
    const Dynamic d = dynamic_smem(r.name);
    if (has(r.name, "_mma_kernel<")) {
      ++mma_kernels;
      EXPECT_GT(d.bytes, 0) << "tensor-core kernel without a declared tile size";
    }
    if (!d.fallback) {
      EXPECT_LE(r.smem + d.bytes, limit)
          << "static " << r.smem << " + dynamic " << d.bytes << " bytes of shared memory";
    }
  }
  EXPECT_GT(mma_kernels, 0) << "the attention kernels are missing from the report";
}

// Every compiled architecture has a tensor-core backward for head_dim 128 that fits.
TEST(KernelResources, AttentionBackwardD128HasAVariantThatFitsEveryArchitecture) {
  if (!LT_BUILT_WITH_CUDA) GTEST_SKIP() << "CPU-only build: no CUDA kernels";
  ASSERT_TRUE(std::filesystem::is_directory(report_dir()));
  std::map<std::string, bool> fits;
  for (const KernelRow& r : read_report(report_dir())) {
    fits.emplace(r.arch, false);
    const std::vector<int> a = int_args(r.name);
    if (has(r.name, "attention_bwd_mma_kernel<") && a.size() == 2 && a[0] == 128 &&
        r.smem + dynamic_smem(r.name).bytes <= smem_limit(r.arch))
      fits[r.arch] = true;
  }
  for (const auto& [arch, ok] : fits) EXPECT_TRUE(ok) << arch;
}

}  // namespace
}  // namespace leantune
