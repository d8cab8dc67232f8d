// The output rules of trainers/common/output_path.h: an output is never an input, inside an input
// folder, or a folder holding an input (symlinks and hard links resolved); a tool command's
// output folder is written whole or not at all, and a non-empty one is replaced only with
// overwrite, once the new one is complete.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "engine/check.h"
#include "testing/testing.h"
#include "trainers/common/output_path.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;

std::string refusal(const std::string& out, const std::vector<CommandInput>& inputs) {
  try {
    check_output_not_input(out, "out", inputs);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    return e.what();
  }
  return "";
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
std::string read(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(OutputPath, AnOutputIsNeverAnInputOrInsideOneOrHoldingOne) {
  const std::string d = testing::temp_dir("outpath");
  fs::create_directories(d + "/ck/sub");
  write(d + "/data.jsonl", "{}\n");
  fs::create_symlink(d + "/data.jsonl", d + "/link.jsonl");
  fs::create_hard_link(d + "/data.jsonl", d + "/hard.jsonl");
  fs::create_directory_symlink(d + "/ck", d + "/cklink");
  const std::vector<CommandInput> in = {{d + "/data.jsonl", "--dataset"},
                                        {d + "/ck", "CHECKPOINT"}};
  EXPECT_NE(refusal(d + "/data.jsonl", in).find("' is the input --dataset"), std::string::npos);
  EXPECT_NE(refusal(d + "/./data.jsonl", in).find("is the input --dataset"), std::string::npos);
  EXPECT_NE(refusal(d + "/link.jsonl", in).find("is the input --dataset"), std::string::npos);
  EXPECT_NE(refusal(d + "/hard.jsonl", in).find("is the input --dataset"), std::string::npos);
  EXPECT_NE(refusal(d + "/ck/exp", in).find("lies inside the input CHECKPOINT"), std::string::npos);
  EXPECT_NE(refusal(d + "/cklink/sub/exp", in).find("lies inside the input CHECKPOINT"),
            std::string::npos);
  EXPECT_NE(refusal(d + "/ck/", in).find("is the input CHECKPOINT"), std::string::npos);
  EXPECT_NE(refusal(d, in).find("holds the input --dataset"), std::string::npos);
  // Beside the inputs, or an input folder's name as a prefix of another: fine.
  EXPECT_EQ(refusal(d + "/out.jsonl", in), "");
  EXPECT_EQ(refusal(d + "/ck2", in), "");
  EXPECT_EQ(refusal(d + "/data.jsonl", {{"", "--tokenizer"}}), "");
}

TEST(OutputPath, FolderIsWrittenWholeOrNotAtAll) {
  const std::string d = testing::temp_dir("outfolder");
  // Not committed (the command failed): nothing at the path, no temporary folder left.
  {
    OutputFolder f(d + "/new", "out", false, {});
    write(f.dir() + "/a.txt", "a");
  }
  EXPECT_FALSE(fs::exists(d + "/new"));
  EXPECT_TRUE(fs::is_empty(d));
  // Committed: the files under the final name.
  {
    OutputFolder f(d + "/new", "out", false, {});
    write(f.dir() + "/a.txt", "a");
    f.commit();
  }
  EXPECT_EQ(read(d + "/new/a.txt"), "a");
  // A non-empty folder: refused without overwrite, before anything is written.
  try {
    OutputFolder f(d + "/new", "out", false, {});
    ADD_FAILURE() << "a non-empty folder was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("option --out: '" + d +
                                         "/new' is a folder that is not empty (pass --overwrite"),
              std::string::npos)
        << e.what();
  }
  // With overwrite the old folder stays whole until the new one is committed, then goes.
  {
    OutputFolder f(d + "/new", "out", true, {});
    write(f.dir() + "/b.txt", "b");
    EXPECT_EQ(read(d + "/new/a.txt"), "a");
  }
  EXPECT_EQ(read(d + "/new/a.txt"), "a");
  {
    OutputFolder f(d + "/new", "out", true, {});
    write(f.dir() + "/b.txt", "b");
    f.commit();
  }
  EXPECT_FALSE(fs::exists(d + "/new/a.txt"));
  EXPECT_EQ(read(d + "/new/b.txt"), "b");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(d)) ++entries;
  EXPECT_EQ(entries, 1) << "a temporary or old folder was left beside the output";
  // An empty existing folder is replaced without overwrite.
  fs::create_directory(d + "/empty");
  {
    OutputFolder f(d + "/empty", "out", false, {});
    write(f.dir() + "/c.txt", "c");
    f.commit();
  }
  EXPECT_EQ(read(d + "/empty/c.txt"), "c");
}

}  // namespace
}  // namespace leantune
