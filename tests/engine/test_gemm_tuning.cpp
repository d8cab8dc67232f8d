// The GEMM autotune (engine/gemm_tuning.h, engine/ops_cuda_blas.cu).
//   GemmTuning.*: the host half on the CPU: LEANTUNE_GEMM_AUTOTUNE's values, the cache file's
//     place, the in-memory cache and its counters, the disk cache's round trip, and malformed
//     or unwritable cache files (one warning, no crash, the run goes on in memory).
//   GemmTuningCuda.*: the GPU tier (skipped without a device): a tuned product equals the
//     heuristic's first choice and the CPU within the GPU tolerance table, at awkward sizes and
//     with beta != 0 (the real output accumulates exactly once); the second use is a cache hit;
//     an accumulating output too large for a scratch copy stays on rank 0 (untimed); a choice
//     written to disk is reused by a fresh cache without timing.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/check.h"
#include "engine/gemm_tuning.h"
#include "engine/ops.h"
#include "engine/tensor.h"
#include "testing/testing.h"

namespace leantune {
namespace {

namespace gt = gemm_tuning;
using testing::temp_dir;

// Sets an environment variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Every test starts from an empty cache and ends with the mode tests run under (testing.cpp).
class GemmTuningTest : public ::testing::Test {
 protected:
  void SetUp() override { gt::reset(); }
  void TearDown() override {
    gt::set_mode(gt::Mode::kMemory);
    gt::reset();
  }
};

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::trunc);
  out << text;
}

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

const std::string kDev = "Test GPU|sm_90|132 SMs|cuBLASLt 1";

using GemmTuning = GemmTuningTest;

TEST_F(GemmTuning, ModeValues) {
  EXPECT_EQ(gt::parse_mode(nullptr), gt::Mode::kDisk);
  EXPECT_EQ(gt::parse_mode(""), gt::Mode::kDisk);
  EXPECT_EQ(gt::parse_mode("1"), gt::Mode::kDisk);
  EXPECT_EQ(gt::parse_mode("0"), gt::Mode::kOff);
  EXPECT_EQ(gt::parse_mode("memory"), gt::Mode::kMemory);
  for (const char* bad : {"yes", "2", "off", " 1"}) {
    try {
      gt::parse_mode(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find(std::string("LEANTUNE_GEMM_AUTOTUNE=") + bad),
                std::string::npos)
          << e.what();
    }
  }
}

TEST_F(GemmTuning, TestsRunInMemoryMode) {
  // testing.cpp keeps test processes from writing the user's cache directory, unless the caller
  // chose a mode.
  const char* v = std::getenv("LEANTUNE_GEMM_AUTOTUNE");
  ASSERT_NE(v, nullptr);
  if (std::string(v) != "memory") GTEST_SKIP() << "LEANTUNE_GEMM_AUTOTUNE=" << v << " from outside";
  EXPECT_EQ(gt::mode(), gt::Mode::kMemory);
}

TEST_F(GemmTuning, CachePathPrecedence) {
  ScopedEnv home("HOME", "/h"), xdg("XDG_CACHE_HOME", "/x"), dir("LEANTUNE_CACHE_DIR", "/c");
  EXPECT_EQ(gt::cache_path(), std::filesystem::path("/c/gemm_tuning.json"));
  {
    ScopedEnv no_dir("LEANTUNE_CACHE_DIR", nullptr);
    EXPECT_EQ(gt::cache_path(), std::filesystem::path("/x/leantune/gemm_tuning.json"));
    ScopedEnv no_xdg("XDG_CACHE_HOME", nullptr);
    EXPECT_EQ(gt::cache_path(), std::filesystem::path("/h/.cache/leantune/gemm_tuning.json"));
    ScopedEnv no_home("HOME", nullptr);
    EXPECT_TRUE(gt::cache_path().empty());
  }
}

TEST_F(GemmTuning, MemoryCacheCountsTuningsAndHits) {
  gt::set_mode(gt::Mode::kMemory);
  EXPECT_FALSE(gt::lookup(kDev, "p1", 16).has_value());
  gt::record(kDev, "p1", {3, 0.25}, true);
  gt::record(kDev, "p2", {0, 0.0}, false);
  const auto c = gt::lookup(kDev, "p1", 16);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->rank, 3);
  EXPECT_DOUBLE_EQ(c->ms, 0.25);
  ASSERT_TRUE(gt::lookup(kDev, "p2", 16).has_value());
  EXPECT_FALSE(gt::lookup("other GPU", "p1", 16).has_value());
  // A rank the current candidate list does not reach is no answer (then the caller retunes).
  EXPECT_FALSE(gt::lookup(kDev, "p1", 3).has_value());
  const gt::Stats s = gt::stats();
  EXPECT_EQ(s.tunings, 1);
  EXPECT_EQ(s.untimed, 1);
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.disk_loaded, 0);
}

TEST_F(GemmTuning, MemoryModeWritesNoFile) {
  const std::string dir = temp_dir("cache");
  ScopedEnv env("LEANTUNE_CACHE_DIR", dir.c_str());
  gt::set_mode(gt::Mode::kMemory);
  gt::record(kDev, "p", {1, 0.5}, true);
  EXPECT_FALSE(std::filesystem::exists(gt::cache_path()));
}

TEST_F(GemmTuning, DiskRoundTrip) {
  const std::string dir = temp_dir("cache");
  ScopedEnv env("LEANTUNE_CACHE_DIR", dir.c_str());
  gt::set_mode(gt::Mode::kDisk);
  gt::record(kDev, "m19 n71 k229", {5, 0.125}, true);
  gt::record(kDev, "m1 n1 k1", {0, 0.01}, true);
  gt::record(kDev, "untimed", {0, 0.0}, false);  // memory only
  ASSERT_TRUE(std::filesystem::exists(gt::cache_path()));
  const auto doc = nlohmann::json::parse(read_file(gt::cache_path()));
  EXPECT_EQ(doc["devices"][kDev]["m19 n71 k229"]["rank"], 5);
  EXPECT_FALSE(doc["devices"][kDev].contains("untimed"));
  // No temporary file is left beside it.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);

  gt::reset();  // a fresh process
  ::testing::internal::CaptureStderr();
  const auto c = gt::lookup(kDev, "m19 n71 k229", 16);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->rank, 5);
  EXPECT_DOUBLE_EQ(c->ms, 0.125);
  EXPECT_FALSE(gt::lookup(kDev, "untimed", 16).has_value());
  EXPECT_EQ(gt::stats().disk_loaded, 2);
  EXPECT_EQ(gt::stats().tunings, 0);

  // A second writer merges with the file rather than replacing it.
  gt::record("another GPU", "p", {2, 1.0}, true);
  const auto merged = nlohmann::json::parse(read_file(gt::cache_path()));
  EXPECT_EQ(merged["devices"][kDev]["m1 n1 k1"]["rank"], 0);
  EXPECT_EQ(merged["devices"]["another GPU"]["p"]["rank"], 2);
}

TEST_F(GemmTuning, MalformedFilesWarnOnceAndAreReplaced) {
  const std::string dir = temp_dir("cache");
  ScopedEnv env("LEANTUNE_CACHE_DIR", dir.c_str());
  gt::set_mode(gt::Mode::kDisk);
  const std::vector<std::string> bad = {
      "{not json",
      "",
      "[1, 2]",
      R"({"format": "something else", "version": 1, "devices": {}})",
      R"({"format": "leantune-gemm-tuning", "version": 99, "devices": {}})",
      R"({"format": "leantune-gemm-tuning", "version": 1, "devices": []})",
      R"({"format": "leantune-gemm-tuning", "version": 1, "devices": {"d": 3}})",
      R"({"format": "leantune-gemm-tuning", "version": 1, "devices": {"d": {"p": {"rank": "1",
         "ms": 0.5}}}})",
      R"({"format": "leantune-gemm-tuning", "version": 1, "devices": {"d": {"p": {"rank": 64,
         "ms": 0.5}}}})",
      R"({"format": "leantune-gemm-tuning", "version": 1, "devices": {"d": {"p": {"rank": -1,
         "ms": 0.5}}}})",
      R"({"format": "leantune-gemm-tuning", "version": 1, "devices": {"d": {"p": {"rank": 1}}}})",
      R"({"format": 7, "version": 1, "devices": {}})",
      std::string("\0\xff\xfe", 3),
  };
  for (const std::string& text : bad) {
    SCOPED_TRACE(text);
    write_file(gt::cache_path(), text);
    gt::reset();
    ::testing::internal::CaptureStderr();
    EXPECT_FALSE(gt::lookup("d", "p", 16).has_value());
    EXPECT_FALSE(gt::lookup("d", "q", 16).has_value());
    gt::record("d", "p", {1, 0.5}, true);  // rereads the broken file: no second warning
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(count_of(err, "ignoring the GEMM tuning cache"), 1) << err;
    EXPECT_NE(err.find(gt::cache_path().string()), std::string::npos) << err;
    // The next write replaced the broken file with a valid one.
    gt::reset();
    const auto c = gt::lookup("d", "p", 16);
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->rank, 1);
  }
}

TEST_F(GemmTuning, UnwritableCacheWarnsOnceAndKeepsMemory) {
  const std::string dir = temp_dir("cache");
  const std::string blocker = dir + "/file";
  write_file(blocker, "x");  // a file where the cache directory should be
  ScopedEnv env("LEANTUNE_CACHE_DIR", blocker.c_str());
  gt::set_mode(gt::Mode::kDisk);
  ::testing::internal::CaptureStderr();
  gt::record(kDev, "p", {2, 0.5}, true);
  gt::record(kDev, "q", {3, 0.5}, true);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, "is not written"), 1) << err;
  ASSERT_TRUE(gt::lookup(kDev, "q", 16).has_value());
  EXPECT_EQ(gt::lookup(kDev, "p", 16)->rank, 2);
  EXPECT_EQ(gt::stats().tunings, 2);
}

TEST_F(GemmTuning, ConcurrentUse) {
  gt::set_mode(gt::Mode::kMemory);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        std::string p = "p";
        p += std::to_string(i % 20);
        if (!gt::lookup(kDev, p, 16)) gt::record(kDev, p, {(i + t) % 16, 1.0}, true);
      }
    });
  }
  for (auto& th : threads) th.join();
  const gt::Stats s = gt::stats();
  EXPECT_GE(s.tunings, 20);
  EXPECT_EQ(s.tunings + s.hits, 800);
}

// ---------------------------------------------------------------- GPU tier

struct Problem {
  int64_t m, n, k;
  DType dt;
  double beta;
};

std::string problem_name(const ::testing::TestParamInfo<Problem>& info) {
  const Problem& p = info.param;
  return std::string(dtype_name(p.dt)) + "_" + std::to_string(p.m) + "x" + std::to_string(p.n) +
         "x" + std::to_string(p.k) + (p.beta != 0.0 ? "_accumulate" : "");
}

// c (a fresh copy of c0 on the GPU) = a b + beta c under `mode`, back on the host.
Tensor gpu_gemm(const Tensor& a, const Tensor& b, const Tensor& c0, double beta, gt::Mode mode) {
  gt::set_mode(mode);
  const Device gpu = Device::cuda(0);
  Tensor c = c0.to(gpu);
  ops::gemm(a.to(gpu), false, b.to(gpu), false, c, 1.0, beta);
  return c.to(Device::cpu());
}

class GemmTuningCuda : public GemmTuningTest, public ::testing::WithParamInterface<Problem> {};

TEST_P(GemmTuningCuda, MatchesRankZeroAndCpu) {
  LT_SKIP_WITHOUT_CUDA();
  const Problem p = GetParam();
  const Tensor a = testing::randn({p.m, p.k}, p.dt, 11), b = testing::randn({p.k, p.n}, p.dt, 12),
               c0 = testing::randn({p.m, p.n}, p.dt, 13);
  Tensor cpu = c0.clone();
  ops::gemm(a, false, b, false, cpu, 1.0, p.beta);

  const Tensor rank0 = gpu_gemm(a, b, c0, p.beta, gt::Mode::kOff);
  EXPECT_EQ(gt::stats().tunings, 0);
  const Tensor tuned = gpu_gemm(a, b, c0, p.beta, gt::Mode::kMemory);
  gt::Stats s = gt::stats();
  EXPECT_EQ(s.tunings, 1);
  EXPECT_EQ(s.hits, 0);
  // Algorithms differ in their order of accumulation (split-K, tiles), so the tuned product
  // may differ from the first choice in rounding, within the table for a k-term sum. With
  // beta != 0, an output accumulated more than once would be c0 + 2 a b: far outside.
  const testing::Tol t = testing::backend_sum_tol(p.dt, static_cast<double>(p.k));
  EXPECT_TRUE(testing::all_close(tuned, rank0, t));
  EXPECT_TRUE(testing::all_close(tuned, cpu, t));
  EXPECT_TRUE(testing::all_close(rank0, cpu, t));

  // The second use runs the cached choice: no timing, the same algorithm, the same bits.
  const Tensor again = gpu_gemm(a, b, c0, p.beta, gt::Mode::kMemory);
  s = gt::stats();
  EXPECT_EQ(s.tunings, 1);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(testing::bytes_of(again), testing::bytes_of(tuned));
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmTuningCuda,
                         ::testing::Values(Problem{1, 1, 1, DType::kF32, 0.0},
                                           Problem{19, 71, 229, DType::kF32, 0.0},
                                           Problem{71, 229, 19, DType::kBF16, 0.0},
                                           Problem{1, 229, 71, DType::kBF16, 0.0},
                                           Problem{19, 71, 229, DType::kBF16, 1.0},
                                           Problem{71, 229, 19, DType::kF32, 0.5},
                                           Problem{256, 512, 1024, DType::kBF16, 0.0},
                                           Problem{256, 512, 1024, DType::kBF16, 1.0}),
                         problem_name);

TEST_F(GemmTuningTest, LargeAccumulationKeepsRankZeroCuda) {
  LT_SKIP_WITHOUT_CUDA();
  // An f32 output of 8200 x 8192 (262 MiB) accumulated with beta != 0: its scratch copy would
  // pass the 256 MiB cap, so the problem is left on rank 0, untimed, and accumulates once.
  const int64_t m = 8200, n = 8192, k = 16;
  const Tensor a = testing::randn({m, k}, DType::kF32, 31),
               b = testing::randn({k, n}, DType::kF32, 32),
               c0 = Tensor::full({m, n}, 0.5, DType::kF32);
  const Tensor rank0 = gpu_gemm(a, b, c0, 1.0, gt::Mode::kOff);
  const Tensor kept = gpu_gemm(a, b, c0, 1.0, gt::Mode::kMemory);
  gt::Stats s = gt::stats();
  EXPECT_EQ(s.tunings, 0);
  EXPECT_EQ(s.untimed, 1);
  EXPECT_EQ(testing::bytes_of(kept), testing::bytes_of(rank0));
  gpu_gemm(a, b, c0, 1.0, gt::Mode::kMemory);
  s = gt::stats();
  EXPECT_EQ(s.untimed, 1);
  EXPECT_EQ(s.hits, 1);
  // One accumulation: row 7 of c0 + a b, against the host's product of that row.
  Tensor row = Tensor::full({1, n}, 0.5, DType::kF32);
  ops::gemm(a.narrow(0, 7, 1), false, b, false, row, 1.0, 1.0);
  EXPECT_TRUE(testing::all_close(kept.narrow(0, 7, 1), row,
                                 testing::backend_sum_tol(DType::kF32, static_cast<double>(k))));
}

TEST_F(GemmTuningTest, DiskCacheIsReusedCuda) {
  LT_SKIP_WITHOUT_CUDA();
  const std::string dir = temp_dir("cache");
  ScopedEnv env("LEANTUNE_CACHE_DIR", dir.c_str());
  const Tensor a = testing::randn({384, 640}, DType::kBF16, 21),
               b = testing::randn({640, 512}, DType::kBF16, 22),
               c0 = Tensor::zeros({384, 512}, DType::kBF16);
  const Tensor first = gpu_gemm(a, b, c0, 0.0, gt::Mode::kDisk);
  EXPECT_EQ(gt::stats().tunings, 1);
  ASSERT_TRUE(std::filesystem::exists(gt::cache_path()));
  const std::string written = read_file(gt::cache_path());
  const auto doc = nlohmann::json::parse(written);
  ASSERT_EQ(doc["devices"].size(), 1u);
  ASSERT_EQ(doc["devices"].begin()->size(), 1u);

  gt::reset();  // a fresh process: the choice comes from the file
  const Tensor second = gpu_gemm(a, b, c0, 0.0, gt::Mode::kDisk);
  const gt::Stats s = gt::stats();
  EXPECT_EQ(s.tunings, 0);
  EXPECT_EQ(s.disk_loaded, 1);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(read_file(gt::cache_path()), written);  // nothing new to write
  EXPECT_EQ(testing::bytes_of(second), testing::bytes_of(first));
}

}  // namespace
}  // namespace leantune
