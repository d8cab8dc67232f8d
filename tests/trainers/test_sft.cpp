// The training loop: accumulation, bit-exact resume in a fresh process, crash-safe
// checkpoints, non-finite steps, signals, and the data/loss equivalences it relies on.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "engine/ops.h"
#include "loaders/collate.h"
#include "loaders/safetensors.h"
#include "testing/testing.h"
#include "trainer_test_util.h"
#include "trainers/common/checkpoint.h"
#include "trainers/sft/sft.h"

namespace leantune {
namespace {

namespace fs = std::filesystem;
using testing::make_tiny_model;
using testing::read_losses;
using testing::run_command;
using testing::small_dataset;
using testing::trainer_bin;

Options options(const std::string& model, const std::string& out,
                std::vector<std::string> extra = {}) {
  return testing::tiny_sft_options(model, out, extra);
}

std::vector<std::vector<float>> weights(const DecoderModel& m) {
  std::vector<std::vector<float>> w;
  for (const auto& [n, t] : m.named_parameters()) w.push_back(t.to_f32());
  return w;
}

TEST(Sft, AccumulationOf4x1EqualsOneBatchOf4) {
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  // Same examples in the same order: no packing, batch 4 x accumulation 1 vs 1 x 4.
  auto grads_of = [&](const std::vector<std::string>& extra, std::vector<double>* losses) {
    SftRun run = make_sft_run(options(model, testing::temp_dir("out"), [&] {
      std::vector<std::string> e = {"--max_steps", "2", "--learning_rate", "0"};
      e.insert(e.end(), extra.begin(), extra.end());
      return e;
    }()));
    TrainResult r = run.trainer->train();
    *losses = r.losses;
    return r;
  };
  std::vector<double> l1, l4;
  grads_of({"--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1"}, &l1);
  grads_of({"--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "4"}, &l4);
  ASSERT_EQ(l1.size(), 2u);
  ASSERT_EQ(l4.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(l1[i], l4[i], 1e-6 * l1[i]) << i;

  // The gradients themselves, at the model level: one batch of 4 examples vs 4 micro-batches of
  // 1 normalised by the total label tokens.
  auto m = DecoderModel::load(model, Device::cpu(), DType::kF32);
  m->set_requires_grad(true);
  std::vector<Row> rows;
  for (int i = 0; i < 4; ++i) {
    Row r;
    for (int j = 0; j < 9 + 5 * i; ++j) r.input_ids.push_back((7 * i + 13 * j) % 500 + 3);
    rows.push_back(r);
  }
  CollateOptions co;
  co.padding_free = true;
  Batch all = collate(rows, co);
  m->forward(all, {}).loss.backward();
  std::vector<Tensor> g_all;
  for (auto& [n, t] : m->named_parameters()) {
    g_all.push_back(t.grad().clone());
    t.zero_grad();
  }
  ForwardOptions fo;
  fo.normalizer = static_cast<double>(all.stats.label_tokens);
  for (int i = 0; i < 4; ++i) {
    Batch one = collate(std::span<const Row>(&rows[i], 1), co);
    m->forward(one, fo).loss.backward();
  }
  size_t k = 0;
  for (auto& [n, t] : m->named_parameters())
    EXPECT_TRUE(testing::all_close(t.grad(), g_all[k++], 1e-7, 1e-5)) << n;
}

TEST(Sft, PaddedAndPaddingFreeBatchesGiveTheSameLoss) {
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  auto m = DecoderModel::load(model, Device::cpu(), DType::kF32);
  std::vector<Row> rows;
  for (int i = 0; i < 3; ++i) {
    Row r;
    for (int j = 0; j < 4 + 7 * i; ++j) r.input_ids.push_back((11 * i + 5 * j) % 500 + 3);
    rows.push_back(r);
  }
  CollateOptions pf, pad;
  pf.padding_free = true;
  pad.padding_free = false;
  pad.pad_to_multiple_of = 8;
  NoGradGuard ng;
  Batch a = collate(rows, pf), b = collate(rows, pad);
  EXPECT_GT(b.stats.pad_tokens, 0);
  EXPECT_EQ(a.stats.label_tokens, b.stats.label_tokens);
  const double la = m->forward(a, {}).loss.item(), lb = m->forward(b, {}).loss.item();
  EXPECT_NEAR(la, lb, 1e-6 * la);
}

TEST(Sft, ResumeIsBitExactInAFreshProcess) {
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  const std::string straight = testing::temp_dir("straight"),
                    resumed = testing::temp_dir("resumed");
  const std::string common = " --model_name_or_path " + model + " --dataset " + small_dataset() +
                             " --max_length 64 --packing --per_device_train_batch_size 2"
                             " --max_steps 20 --logging_steps 1 --learning_rate 2e-3"
                             " --warmup_steps 3 --lr_scheduler_type cosine --weight_decay 0.1"
                             " --device cpu --seed 5";
  std::string log;
  ASSERT_EQ(
      run_command(trainer_bin() + " sft" + common + " --save_steps 10 --output_dir " + straight,
                  &log),
      0)
      << log;
  // Resume from the straight run's step-10 checkpoint in a new output folder and process.
  fs::copy(straight + "/checkpoint-10", resumed + "/checkpoint-10", fs::copy_options::recursive);
  ASSERT_EQ(run_command(trainer_bin() + " sft" + common + " --save_steps 0 --output_dir " +
                            resumed + " --resume_from_checkpoint latest",
                        &log),
            0)
      << log;
  auto a = read_losses(straight + "/metrics.jsonl"), b = read_losses(resumed + "/metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(b[i].first, a[10 + i].first);
    EXPECT_EQ(b[i].second, a[10 + i].second) << "step " << b[i].first;  // bit for bit
  }
  EXPECT_EQ(testing::read_file(straight + "/model.safetensors"),
            testing::read_file(resumed + "/model.safetensors"));
}

TEST(Sft, KilledSaveLeavesThePreviousCheckpointLoadable) {
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  for (int trial = 0; trial < 4; ++trial) {
    const std::string out = testing::temp_dir("kill" + std::to_string(trial));
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::execl(trainer_bin().c_str(), "trainer_bin", "sft", "--model_name_or_path", model.c_str(),
              "--dataset", small_dataset().c_str(), "--output_dir", out.c_str(), "--max_length",
              "64", "--max_steps", "100000", "--save_steps", "1", "--save_total_limit", "3",
              "--logging_steps", "1000", "--device", "cpu", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Wait for the first complete checkpoint, then kill at a varying point of later saves.
    const auto start = std::chrono::steady_clock::now();
    while (list_checkpoints(out).empty() &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(120))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(7 + 23 * trial));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));
    const std::string latest = resolve_checkpoint("latest", out);
    auto m = DecoderModel::load(latest, Device::cpu(), DType::kF32);
    auto opt = SafetensorsFile::open(latest + "/optimizer.safetensors");
    EXPECT_GT(opt->entries().size(), 0u);
    EXPECT_TRUE(fs::exists(latest + "/trainer_state.json"));
  }
}

TEST(Sft, InjectedNanSkipsTheUpdate) {
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  std::vector<std::string> extra = {"--lr_scheduler_type", "constant", "--max_grad_norm", "0"};
  auto with_nan = [&](int64_t steps, std::set<int64_t> nan) {
    std::vector<std::string> e = extra;
    e.push_back("--max_steps");
    e.push_back(std::to_string(steps));
    SftRun run = make_sft_run(options(model, testing::temp_dir("nan"), e));
    run.trainer->set_nan_injection(std::move(nan));
    TrainResult r = run.trainer->train();
    return std::make_pair(r, weights(*run.model));
  };
  auto [r2, w2] = with_nan(2, {2});
  auto [r1, w1] = with_nan(1, {});
  EXPECT_EQ(r2.skipped_steps, 1);
  EXPECT_TRUE(std::isnan(r2.losses[1]));
  EXPECT_EQ(w2, w1);  // the NaN step changed nothing
  try {
    std::set<int64_t> all;
    for (int i = 1; i <= 10; ++i) all.insert(i);
    with_nan(20, all);
    FAIL() << "10 non-finite steps in a row must stop the run";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNonFinite);
    EXPECT_EQ(exit_code(e.kind()), 4);
    EXPECT_NE(std::string(e.what()).find("stopping at step 10"), std::string::npos) << e.what();
  }
}

TEST(Sft, SigtermSavesACheckpointAndExitsZero) {
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  const std::string out = testing::temp_dir("term");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl(trainer_bin().c_str(), "trainer_bin", "sft", "--model_name_or_path", model.c_str(),
            "--dataset", small_dataset().c_str(), "--output_dir", out.c_str(), "--max_length", "64",
            "--max_steps", "100000", "--save_steps", "0", "--logging_steps", "1", "--device", "cpu",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto start = std::chrono::steady_clock::now();
  while ((!fs::exists(out + "/metrics.jsonl") || fs::file_size(out + "/metrics.jsonl") == 0) &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto all = list_checkpoints(out);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_GT(all[0].first, 0);
}

// A stop signal between two micro-batches of an update abandons that update and saves the one
// before it: resumed, the run is bit-identical to an uninterrupted one, LoRA dropout (0.05 by
// default) included, since the dropout stream's offset is part of the checkpoint.
TEST(Sft, StopBetweenMicroBatchesSavesTheLastCompletedUpdate) {
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  const std::string straight = testing::temp_dir("mb_straight"), out = testing::temp_dir("mb_out");
  auto run = [&](const std::string& dir, std::vector<std::string> more) {
    std::vector<std::string> e = {"--use_peft", "--gradient_accumulation_steps", "3", "--max_steps",
                                  "4",          "--per_device_train_batch_size", "2"};
    e.insert(e.end(), more.begin(), more.end());
    return make_sft_run(options(model, dir, e));
  };
  {
    SftRun r = run(straight, {});
    ASSERT_FALSE(r.trainer->train().interrupted);
  }
  {
    SftRun r = run(out, {});
    r.trainer->set_micro_batch_hook([](int64_t update, size_t micro_batch) {
      if (update == 3 && micro_batch == 1) ::raise(SIGTERM);
    });
    const TrainResult res = r.trainer->train();
    EXPECT_TRUE(res.interrupted);
    EXPECT_EQ(res.steps, 2);
    const auto all = list_checkpoints(out);
    ASSERT_EQ(all.size(), 1u);
    EXPECT_EQ(all[0].first, 2);
    const TrainerState st = parse_trainer_state(
        testing::read_file(all[0].second + "/leantune_state.json"), "leantune_state.json");
    // Two updates of 3 micro-batches of 2 examples: the data position after update 2.
    EXPECT_EQ(st.data_state.value("step", -1), 6);
    EXPECT_GT(st.rng.value("lora_dropout", uint64_t{0}), 0u);
  }
  {
    SftRun r = run(out, {"--resume_from_checkpoint", "latest"});
    ASSERT_FALSE(r.trainer->train().interrupted);
  }
  EXPECT_EQ(testing::read_file(straight + "/adapter_model.safetensors"),
            testing::read_file(out + "/adapter_model.safetensors"));
}

// A second SIGTERM while the save that the first one started is under way is noted, not fatal:
// the process (a child here, since the old behaviour killed it) exits normally with the
// checkpoint complete.
TEST(Sft, ASecondSignalDuringTheSaveDoesNotTearIt) {
  const std::string model = make_tiny_model(testing::temp_dir("model"));
  const std::string out = testing::temp_dir("twice");
  // A child that runs the test binary afresh: OpenMP's threads do not survive a plain fork.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        SftRun r = make_sft_run(options(model, out, {"--max_steps", "10"}));
        r.trainer->set_step_callback([](const nlohmann::json& rec) {
          if (rec["step"] == 2) ::raise(SIGTERM);
          return true;
        });
        r.trainer->set_save_hook([](const std::string&) { ::raise(SIGTERM); });
        const TrainResult res = r.trainer->train();
        const auto all = list_checkpoints(out);
        std::exit(res.interrupted && all.size() == 1 && all[0].first == 2 && deferred_signals() == 1
                      ? 0
                      : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace leantune
