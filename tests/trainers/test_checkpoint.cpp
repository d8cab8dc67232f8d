#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/check.h"
#include "testing/testing.h"
#include "trainers/common/checkpoint.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;

void write(const std::string& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir + "/" + name) << text;
}

TEST(Checkpoint, WriteListResolveRotate) {
  const std::string out = testing::temp_dir("ckpt");
  for (int step : {10, 20, 30})
    write_checkpoint(out, step,
                     [&](const std::string& d) { write(d, "state.txt", std::to_string(step)); });
  auto all = list_checkpoints(out);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all.back().first, 30);
  EXPECT_TRUE(fs::exists(all.back().second + "/" + kCheckpointMarker));
  EXPECT_EQ(resolve_checkpoint("latest", out), out + "/checkpoint-30");
  rotate_checkpoints(out, 2);
  all = list_checkpoints(out);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all.front().first, 20);
}

TEST(Checkpoint, IncompleteFoldersAreIgnored) {
  const std::string out = testing::temp_dir("partial");
  write_checkpoint(out, 5, [&](const std::string& d) { write(d, "a", "x"); });
  // A save killed before the rename leaves a temporary folder; one killed after copying files
  // but without the marker leaves an unmarked folder. Neither is picked.
  fs::create_directories(out + "/.checkpoint-9.tmp-12345");
  fs::create_directories(out + "/checkpoint-7");
  write(out + "/checkpoint-7", "a", "partial");
  EXPECT_EQ(resolve_checkpoint("latest", out), out + "/checkpoint-5");
  EXPECT_THROW(resolve_checkpoint(out + "/checkpoint-7", out), Error);
  rotate_checkpoints(out, 0);
  EXPECT_FALSE(fs::exists(out + "/.checkpoint-9.tmp-12345"));
  EXPECT_THROW(resolve_checkpoint("latest", testing::temp_dir("empty")), Error);
}

TEST(Checkpoint, FailedFillLeavesNoCheckpoint) {
  const std::string out = testing::temp_dir("fail");
  write_checkpoint(out, 1, [&](const std::string& d) { write(d, "a", "1"); });
  EXPECT_THROW(write_checkpoint(out, 2,
                                [&](const std::string& d) {
                                  write(d, "a", "half");
                                  LT_THROW(ErrorKind::kInput, "disk full");
                                }),
               Error);
  EXPECT_EQ(resolve_checkpoint("latest", out), out + "/checkpoint-1");
}

TEST(Checkpoint, RewritingAStepReplacesItAtomically) {
  const std::string out = testing::temp_dir("rewrite");
  write_checkpoint(out, 3, [&](const std::string& d) { write(d, "v", "old"); });
  write_checkpoint(out, 3, [&](const std::string& d) { write(d, "v", "new"); });
  std::ifstream in(out + "/checkpoint-3/v");
  std::string v;
  in >> v;
  EXPECT_EQ(v, "new");
  EXPECT_EQ(list_checkpoints(out).size(), 1u);
}

}  // namespace
}  // namespace leantune
