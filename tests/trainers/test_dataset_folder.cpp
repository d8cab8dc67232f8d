// A dataset given as a folder (--dataset / --dataset_name, TRL's name), as datasets' load_dataset
// finds a local folder's splits: the train split's file is the training data, and under an
// eval_strategy the test split's file is the evaluation data (TRL's scripts).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "testing/testing.h"
#include "trainer_test_util.h"
#include "trainers/common/model_source.h"
#include "trainers/sft/sft.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;

void touch(const fs::path& p) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << "{\"text\": \"a\"}\n";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    return e.what();
  }
  return "";
}

TEST(DatasetFolder, FindsEachSplitAsLoadDatasetDoes) {
  const fs::path d = testing::temp_dir("dataset_folder");
  touch(d / "train.jsonl");
  touch(d / "test.jsonl");
  touch(d / "notes.txt");
  EXPECT_EQ(dataset_split_file(d.string(), "train", "dataset"), (d / "train.jsonl").string());
  EXPECT_EQ(dataset_split_file(d.string(), "test", "dataset"), (d / "test.jsonl").string());
  EXPECT_EQ(dataset_split_file(d.string(), "validation", "dataset", false), "");
  EXPECT_NE(error_of([&] {
              dataset_split_file(d.string(), "validation", "dataset");
            }).find("no JSONL file of split 'validation'"),
            std::string::npos);
  // A file is itself; so is a path that does not exist (its reader names it).
  EXPECT_EQ(dataset_split_file((d / "train.jsonl").string(), "test", "dataset"),
            (d / "train.jsonl").string());
  EXPECT_EQ(dataset_split_file("/no/such/file.jsonl", "train", "dataset"), "/no/such/file.jsonl");

  const fs::path h = testing::temp_dir("dataset_folder_hub");  // the Hub's data/<split>-*.jsonl
  touch(h / "data" / "train-00000-of-00001.jsonl");
  touch(h / "data" / "test-00000-of-00001.jsonl");
  EXPECT_EQ(dataset_split_file(h.string(), "train", "dataset"),
            (h / "data" / "train-00000-of-00001.jsonl").string());
  touch(h / "data" / "train-00001-of-00001.jsonl");
  EXPECT_NE(error_of([&] {
              dataset_split_file(h.string(), "train", "dataset_name");
            }).find("split 'train' is in 2 files; leantune reads one JSONL file per split"),
            std::string::npos);

  const fs::path one = testing::temp_dir("dataset_folder_one");  // one file: the train split
  touch(one / "rows.jsonl");
  EXPECT_EQ(dataset_split_file(one.string(), "train", "dataset"), (one / "rows.jsonl").string());
  EXPECT_EQ(dataset_split_file(one.string(), "test", "dataset", false), "");

  ModelSource s;
  s.dataset = d.string();
  EXPECT_EQ(train_data_path(s), (d / "train.jsonl").string());
  EXPECT_EQ(eval_data_path(s, "no"), "");
  EXPECT_EQ(eval_data_path(s, "steps"), (d / "test.jsonl").string());
  s.dataset_test_split = "validation";
  EXPECT_EQ(eval_data_path(s, "steps"), "");
  s.eval_dataset = d.string();
  s.dataset_test_split = "test";
  EXPECT_EQ(eval_data_path(s, "no"), (d / "test.jsonl").string());
}

TEST(DatasetFolder, SftTrainsOnTheTrainSplitAndEvaluatesTheTestSplit) {
  const std::string model = testing::make_tiny_model(testing::temp_dir("folder_model"));
  const fs::path d = testing::temp_dir("folder_data");
  fs::copy_file(testing::small_dataset(), d / "train.jsonl");
  {
    std::ifstream in(testing::small_dataset());
    std::ofstream out(d / "test.jsonl");
    std::string line;
    for (int i = 0; i < 5 && std::getline(in, line); ++i) out << line << "\n";
  }
  Options o = testing::tiny_sft_options(model, testing::temp_dir("folder_out"),
                                        {"--dataset_name", d.string(), "--eval_strategy", "steps",
                                         "--eval_steps", "1", "--max_steps", "1"});
  SftRun run = make_sft_run(o);
  EXPECT_EQ(run.trainer->train_stats().path, (d / "train.jsonl").string());
  const TrainResult r = run.trainer->train();
  ASSERT_TRUE(r.final_eval_loss.has_value());
  EXPECT_GT(*r.final_eval_loss, 0.0);
}

}  // namespace
}  // namespace leantune
