// The per-process scratch root of a test binary: <tmp>/<prefix><pid>.
//
// ctest runs every test in its own process, and some tests write models of hundreds of MiB,
// so the root is removed when the process exits if every test in it passed; a failing test
// leaves its files for inspection. LEANTUNE_KEEP_TEST_DIRS=1 keeps them always. Header-only
// because the sanitizer builds of the loaders link without the testing library.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace leantune::testing {

inline std::filesystem::path& scratch_root_slot() {
  static std::filesystem::path root;
  return root;
}

inline void remove_scratch_root_if_passed() {
  const std::filesystem::path& root = scratch_root_slot();
  if (root.empty()) return;
  const char* keep = std::getenv("LEANTUNE_KEEP_TEST_DIRS");
  if (keep != nullptr && std::string(keep) == "1") return;
  if (!::testing::UnitTest::GetInstance()->Passed()) return;
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
}

// The root for this process, created on first use; registers its removal at exit.
inline std::filesystem::path scratch_root(const std::string& prefix) {
  std::filesystem::path& root = scratch_root_slot();
  if (root.empty()) {
    ::testing::UnitTest::GetInstance();  // constructed before the handler, destroyed after it
    root = std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()));
    std::atexit(remove_scratch_root_if_passed);
  }
  return root;
}

}  // namespace leantune::testing
