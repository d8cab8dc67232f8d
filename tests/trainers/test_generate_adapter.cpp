// `trainer_bin generate --model ADAPTER_DIR` loads a PEFT adapter on its base, as PEFT's
// AutoPeftModelForCausalLM does: a LoRA run of the built-in demo records its base (written
// beside the adapter), and the adapter's greedy tokens equal the merged model's.
#include <gtest/gtest.h>

#include <filesystem>

#include "testing/testing.h"
#include "trainer_test_util.h"

namespace leantune {
namespace {

using testing::run_command;
using testing::trainer_bin;

std::string generate(const std::string& flags, int* rc = nullptr) {
  std::string out;
  const int r = run_command(trainer_bin() + " generate --prompt 'Once upon a time'" +
                                " --max_new_tokens 24 --device cpu " + flags,
                            &out);
  if (rc)
    *rc = r;
  else
    EXPECT_EQ(r, 0) << out;
  return out;
}

TEST(GenerateAdapter, DemoLoraAdapterGeneratesLikeTheMergedModel) {
  const std::string out = testing::temp_dir("generate_adapter") + "/run";
  std::string log;
  ASSERT_EQ(run_command(trainer_bin() +
                            " sft --use_peft true --max_steps 3 --learning_rate 1e-2"
                            " --merge_adapter true --save_steps 0 --device cpu"
                            " --output_dir " +
                            out,
                        &log),
            0)
      << log;
  ASSERT_TRUE(std::filesystem::exists(out + "/adapter_config.json"));
  ASSERT_TRUE(std::filesystem::exists(out + "/base_model/config.json"));
  const std::string adapter = generate("--model " + out);
  const std::string merged = generate("--model " + out + "/merged");
  const std::string base = generate("--model " + out + "/base_model");
  EXPECT_EQ(adapter, merged);
  // The adapter changes the tokens, so the comparison above is not the base against itself.
  EXPECT_NE(adapter, base);
  // --base_model names the base explicitly.
  EXPECT_EQ(generate("--model " + out + " --base_model " + out + "/base_model"), merged);
  // --base_model with a plain model folder is a usage error.
  int rc = 0;
  const std::string err = generate("--model " + out + "/merged --base_model " + out, &rc);
  EXPECT_EQ(rc, 2) << err;
  EXPECT_NE(err.find("--base_model is for an adapter folder"), std::string::npos) << err;
}

}  // namespace
}  // namespace leantune
