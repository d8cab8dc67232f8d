// The public C++ API (include/leantune/leantune.h), used as a pipeline would: only the public
// header is included here. Two models in one process, errors and their categories, step
// callbacks, LoRA/QLoRA options, memory stats, generation and the memory trace option.
#include <gtest/gtest.h>
#include <leantune/leantune.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "testing/testing.h"

namespace lt = leantune::api;

namespace {

// A few fast steps of the embedded demo (short sequences, small batches).
std::string quick_config(const std::string& out, int steps, const std::string& extra = "") {
  return R"({"max_steps": )" + std::to_string(steps) + R"(, "output_dir": ")" + out +
         R"(", "max_length": 64, "per_device_train_batch_size": 2, "logging_steps": 100)" + extra +
         "}";
}

lt::ErrorCategory category_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const lt::Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.category();
  }
  ADD_FAILURE() << "no leantune::api::Error thrown";
  return lt::ErrorCategory::kInternal;
}

TEST(Api, VersionIsTheProjectVersion) {
  EXPECT_EQ(std::string(lt::version()), LEANTUNE_TEST_VERSION);
}

TEST(Api, TwoModelsInOneProcessTrainIndependently) {
  const std::string dir = leantune::testing::temp_dir("api_two_models");
  lt::ModelOptions a_opts;
  a_opts.seed = 7;
  // Model A alone: the reference losses.
  std::vector<double> alone;
  {
    lt::Model a = lt::Model::load("", a_opts);
    alone = lt::Trainer(a, quick_config(dir + "/alone", 3)).train().losses;
  }
  ASSERT_EQ(alone.size(), 3u);
  // A again, beside a LoRA model B that trains first and is used between A's steps.
  lt::Model a = lt::Model::load("", a_opts);
  lt::ModelOptions b_opts;
  b_opts.seed = 8;
  b_opts.use_peft = true;
  b_opts.lora_r = 4;
  lt::Model b = lt::Model::load("", b_opts);
  EXPECT_EQ(a.num_trainable_parameters(), a.num_parameters());
  EXPECT_LT(b.num_trainable_parameters(), b.num_parameters() / 10);
  lt::TrainSummary sb = lt::Trainer(b, quick_config(dir + "/b", 2)).train();
  EXPECT_EQ(sb.steps, 2);
  EXPECT_TRUE(std::filesystem::exists(dir + "/b/adapter_model.safetensors"));
  int b_generations = 0;
  lt::TrainSummary sa = lt::Trainer(a, quick_config(dir + "/a", 3)).train([&](const auto& m) {
    lt::GenerateOptions g;
    g.max_new_tokens = 3;
    b_generations += !b.generate("Once", g).empty();
    return true;
  });
  EXPECT_EQ(b_generations, 3);
  ASSERT_EQ(sa.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(sa.losses[i], alone[i]) << "step " << i + 1;
}

TEST(Api, StepCallbackSeesEveryStepAndCanStop) {
  const std::string dir = leantune::testing::temp_dir("api_callback");
  lt::Model m = lt::Model::load("");
  lt::Trainer t(m, quick_config(dir, 5));
  std::vector<int64_t> seen;
  lt::TrainSummary s = t.train([&](const lt::StepMetrics& x) {
    seen.push_back(x.step);
    EXPECT_EQ(x.total_steps, 5);
    EXPECT_GT(x.loss, 0.0);
    EXPECT_GE(x.learning_rate, 0.0);  // the demo's warmup starts at 0
    EXPECT_GT(x.num_tokens, 0);
    EXPECT_GT(x.allocated_bytes, 0);
    return x.step < 2;
  });
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(s.steps, 2);
  EXPECT_TRUE(s.stopped_early);
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoint-2"));
  EXPECT_EQ(category_of([&] { t.train(); }), lt::ErrorCategory::kInput);  // one run per trainer
}

TEST(Api, CallbackExceptionsReachTheCallerUnchanged) {
  const std::string dir = leantune::testing::temp_dir("api_callback_throw");
  lt::Model m = lt::Model::load("");
  lt::Trainer t(m, quick_config(dir, 3));
  EXPECT_THROW(t.train([](const lt::StepMetrics&) -> bool { throw std::logic_error("mine"); }),
               std::logic_error);
}

TEST(Api, BadInputIsAnInputError) {
  const std::string dir = leantune::testing::temp_dir("api_errors");
  EXPECT_EQ(category_of([] { lt::Model::load("/nonexistent/model"); }), lt::ErrorCategory::kInput);
  lt::ModelOptions bad_json;
  bad_json.json = R"({"learning_rate": 1e-3})";  // a training option, not a model option
  EXPECT_EQ(category_of([&] { lt::Model::load("", bad_json); }), lt::ErrorCategory::kInput);
  lt::ModelOptions qlora_without_peft;
  qlora_without_peft.load_in_4bit = true;
  EXPECT_EQ(category_of([&] { lt::Model::load("", qlora_without_peft); }),
            lt::ErrorCategory::kInput);
  lt::Model m = lt::Model::load("");
  EXPECT_EQ(category_of([&] { lt::Trainer(m, "{not json"); }), lt::ErrorCategory::kInput);
  EXPECT_EQ(category_of([&] { lt::Trainer(m, R"({"max_stepz": 3})"); }), lt::ErrorCategory::kInput);
  EXPECT_EQ(category_of([&] { lt::Trainer(m, R"({"use_peft": true})"); }),
            lt::ErrorCategory::kInput);
  EXPECT_EQ(category_of([&] { lt::Trainer(m, R"({"dataset": "/nonexistent.jsonl"})"); }),
            lt::ErrorCategory::kInput);
  lt::GenerateOptions g;
  g.max_new_tokens = 0;
  EXPECT_EQ(category_of([&] { m.generate("x", g); }), lt::ErrorCategory::kInput);
  try {
    lt::Trainer(m, R"({"max_stepz": 3})");
  } catch (const lt::Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("max_stepz"), std::string::npos) << e.what();
  }
}

// The final evaluation's metrics reach the summary under TRL's names, eval_loss among them.
TEST(Api, SummaryHoldsTheFinalEvaluationsMetrics) {
  const std::string dir = leantune::testing::temp_dir("api_eval");
  lt::Model m = lt::Model::load("");
  const std::string eval = leantune::testing::fixture_path("trainer/stories_small.jsonl");
  lt::TrainSummary s =
      lt::Trainer(m, quick_config(dir, 2, R"(, "eval_dataset": ")" + eval + "\"")).train();
  ASSERT_TRUE(s.eval_loss.has_value());
  ASSERT_TRUE(s.eval_metrics.count("eval_loss"));
  EXPECT_EQ(s.eval_metrics.at("eval_loss"), *s.eval_loss);
  EXPECT_GT(s.eval_metrics.at("eval_entropy"), 0.0);
  EXPECT_TRUE(s.eval_metrics.count("eval_mean_token_accuracy"));
  lt::Model plain = lt::Model::load("");
  lt::TrainSummary none = lt::Trainer(plain, quick_config(dir + "/none", 1)).train();
  EXPECT_FALSE(none.eval_loss.has_value());
  EXPECT_TRUE(none.eval_metrics.empty());
}

TEST(Api, QloraModelTrainsAdaptersOnly) {
  const std::string dir = leantune::testing::temp_dir("api_qlora");
  lt::ModelOptions o;
  o.use_peft = true;
  o.load_in_4bit = true;
  o.lora_target_modules = std::vector<std::string>{"all-linear"};
  lt::Model m = lt::Model::load("", o);
  lt::TrainSummary s = lt::Trainer(m, quick_config(dir, 2)).train();
  EXPECT_EQ(s.steps, 2);
  EXPECT_LT(m.num_trainable_parameters(), m.num_parameters() / 5);
  EXPECT_NE(s.memory_report.find("quantized base"), std::string::npos) << s.memory_report;
  m.save(dir + "/saved", true);
  EXPECT_TRUE(std::filesystem::exists(dir + "/saved/adapter_config.json"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/saved/merged/config.json"));
}

TEST(Api, MemoryStatsAndSaveAndGenerate) {
  const std::string dir = leantune::testing::temp_dir("api_stats");
  lt::Model m = lt::Model::load("");
  EXPECT_EQ(m.device(), "cpu");
  EXPECT_EQ(m.architecture(), "Qwen2ForCausalLM");
  lt::Trainer t(m, quick_config(dir, 2));
  t.train();
  const lt::MemoryStats st = m.memory_stats();
  EXPECT_GT(st.peak_allocated, 0);
  EXPECT_GE(st.peak_reserved, st.peak_allocated);
  EXPECT_GT(st.peak_by_tag.at("param"), 0);
  EXPECT_GT(st.peak_by_tag.at("optimizer"), 0);
  lt::GenerateOptions g;
  g.max_new_tokens = 5;
  EXPECT_FALSE(m.generate("One sunny day,", g).empty());
  m.save(dir + "/saved");
  EXPECT_TRUE(std::filesystem::exists(dir + "/saved/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/saved/tokenizer.json"));
  EXPECT_EQ(t.output_dir(), dir);
  EXPECT_NE(t.config_json().find("\"max_steps\":2"), std::string::npos);
}

TEST(Api, MemoryTraceOptionWritesTheFirstStepsWithPhases) {
  const std::string dir = leantune::testing::temp_dir("api_trace");
  lt::Model m = lt::Model::load("");
  lt::Trainer(
      m, quick_config(dir, 3,
                      R"(, "memory_trace": ")" + dir + R"(/trace.json", "memory_trace_steps": 1)"))
      .train();
  std::ifstream f(dir + "/trace.json");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const char* phase : {"\"forward layer 0\"", "\"backward layer 0\"", "\"optimizer\"",
                            "\"kind\":\"free\"", "\"offset\""})
    EXPECT_NE(text.find(phase), std::string::npos) << phase;
}

}  // namespace
