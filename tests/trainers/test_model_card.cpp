// The model card a run writes beside its final model (trainers/common/model_card.h): TRL's front
// matter, the base model (a local path quoted, not linked), the trainer, the data, the steps, the
// hyper-parameters the user set (paths left out) and the last logged metrics.
#include <gtest/gtest.h>

#include <string>

#include "loaders/fs_util.h"
#include "testing/testing.h"
#include "trainer_test_util.h"
#include "trainers/common/model_card.h"
#include "trainers/sft/sft.h"

namespace leantune {
namespace {

TEST(ModelCard, FinalModelFolderHasTrlsCard) {
  const std::string model = testing::make_tiny_model(testing::temp_dir("card_model"));
  const std::string out = testing::temp_dir("card") + "/my-run";
  SftRun run = make_sft_run(testing::tiny_sft_options(
      model, out, {"--max_steps", "2", "--weight_decay", "0.01", "--logging_steps", "1"}));
  run.trainer->train();
  const std::string card = read_text_file(out + "/README.md");
  auto has = [&](const std::string& s) {
    EXPECT_NE(card.find(s), std::string::npos) << "no '" << s << "' in\n" << card;
  };
  has("---\nbase_model: " + model + "\nlibrary_name: transformers\nmodel_name: my-run\n");
  has("- leantune\n- sft\n---\n");
  has("fine-tuned version of `" + model + "` on `" + testing::small_dataset() + "`");
  has("leantune's `sft` trainer (TRL's SFTTrainer semantics) for 2 optimizer steps");
  has("| learning_rate | 0.001 |");
  has("| weight_decay | 0.01 |");  // set by the user
  has("| max_steps | 2 |");
  has("| loss | ");
  EXPECT_EQ(card.find("| output_dir |"), std::string::npos);           // paths are left out
  EXPECT_EQ(card.find("https://huggingface.co/"), std::string::npos);  // a local base
}

TEST(ModelCard, AdapterCardNamesPeftTheTrainerAndTheDemoData) {
  ModelCardInfo c;
  c.model_name = "out";
  c.base_model = "/no/such/folder";
  c.trainer = "dpo";
  c.adapter = true;
  c.steps = 5;
  const std::string card = model_card(c);
  EXPECT_NE(card.find("library_name: peft"), std::string::npos) << card;
  EXPECT_NE(card.find("- lora"), std::string::npos) << card;
  EXPECT_NE(card.find("TRL's DPOTrainer semantics) for 5 optimizer steps"), std::string::npos);
  EXPECT_NE(card.find("on the built-in demo data"), std::string::npos) << card;
}

}  // namespace
}  // namespace leantune
