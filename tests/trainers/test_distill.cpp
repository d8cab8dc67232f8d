// trainer_bin distill against TRL 1.16's DistillationTrainer on two tiny Qwen2 models
// (tests/fixtures/gen_distill_fixtures.py -> distill/student, distill/teacher,
// distill/trainer.safetensors): for two prompt + completion sequences, the loss TRL's
// `_chunked_divergence_loss` gives on the hidden states it takes (num_items_in_batch = the
// completion tokens) and the gradient of every student parameter, for forward KL, the JSD and
// reverse KL at temperature 1 and the JSD at temperature 2; then the built-in demo, whose
// divergence falls, and the teacher's checks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cross_entropy.h"
#include "loaders/host_batch.h"
#include "loaders/model_config.h"
#include "loaders/safetensors.h"
#include "models/ref_model.h"
#include "testing/testing.h"
#include "trainers/common/trainer_spec.h"
#include "trainers/estimate/estimate_online.h"
#include "trainers/online/distill.h"
#include "trainers/online/grpo.h"
#include "trainers/trainer_test_util.h"

namespace leantune {
namespace {

std::shared_ptr<SafetensorsFile> fixture() {
  static const std::shared_ptr<SafetensorsFile> f =
      SafetensorsFile::open(testing::fixture_path("distill/trainer.safetensors"));
  return f;
}

// The fixture's two sequences packed as the online trainers pack them.
Batch fixture_batch() {
  const std::vector<int64_t> prompts = fixture()->tensor("prompts").to_i64();
  std::vector<int64_t> ids, pos, labels;
  std::vector<int32_t> cu{0};
  BatchStats st;
  int64_t longest = 0;
  for (int s = 0; s < 2; ++s) {
    const std::vector<int64_t> c = fixture()->tensor("completions" + std::to_string(s)).to_i64();
    const int64_t n = 4 + static_cast<int64_t>(c.size());
    for (int t = 0; t < 4; ++t) {
      ids.push_back(prompts[static_cast<size_t>(s * 4 + t)]);
      labels.push_back(kernels::kIgnoreIndex);
    }
    for (int64_t tok : c) {
      ids.push_back(tok);
      labels.push_back(tok);
      ++st.label_tokens;
    }
    for (int64_t t = 0; t < n; ++t) pos.push_back(t);
    cu.push_back(cu.back() + static_cast<int32_t>(n));
    st.real_tokens += n;
    longest = std::max(longest, n);
  }
  st.sequences = 2;
  return host_batch(ids, pos, labels, cu, longest, st);
}

// TRL's loss, the `entropy` it logs and the gradient of every student parameter, with both
// models on `dev` (f32). On CUDA the products run through cuBLAS in another order: looser.
void check_against_trl(const std::string& c, Device dev) {
  const nlohmann::json meta = nlohmann::json::parse(fixture()->metadata().at(c));
  auto student = DecoderModel::load(testing::fixture_path("distill/student"), dev, DType::kF32);
  auto teacher = DecoderModel::load(testing::fixture_path("distill/teacher"), dev, DType::kF32);
  student->set_requires_grad(true);
  teacher->set_requires_grad(false);
  DistillOptions o;
  o.beta = meta["beta"];
  o.temperature = meta["temperature"];
  o.chunk_tokens = 5;  // several chunks over the 14 rows
  const Batch b = fixture_batch();
  const DistillDivergence d = distill_divergence(*student, *teacher, b, o);
  EXPECT_EQ(d.tokens, 6);
  const double n = d.tokens;
  const double atol = dev.is_cuda() ? 2e-5 : 2e-6, rtol = dev.is_cuda() ? 2e-3 : 2e-4;
  EXPECT_NEAR(d.entropy_sum / n, fixture()->tensor(c + ".entropy").to_f64()[0], atol);
  std::vector<double> grad(d.mask.size(), 0.0);
  for (size_t i = 0; i < d.mask.size(); ++i) grad[i] = d.mask[i] ? 1.0 / n : 0.0;
  const Tensor loss = loss_from_sequence_gradient(d.divergence, d.sum / n, grad);
  EXPECT_NEAR(loss.item(), fixture()->tensor(c + ".loss").to_f64()[0], atol);
  loss.backward();
  int compared = 0;
  for (const auto& [name, p] : student->named_parameters()) {
    const std::string key = c + ".grad." + name;
    if (fixture()->find(key) == nullptr) continue;
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_TRUE(testing::all_close(p.grad().to(Device::cpu()), fixture()->tensor(key).contiguous(),
                                   atol, rtol))
        << name;
    ++compared;
  }
  // Qwen2: per layer 7 projections, 3 biases and 2 norms; embeddings, final norm and head.
  EXPECT_EQ(compared, 2 * 12 + 3) << "every student parameter has TRL's gradient to compare with";
}

class DistillTrl : public ::testing::TestWithParam<std::string> {};

TEST_P(DistillTrl, LossEntropyAndStudentGradientsMatchTrl) {
  check_against_trl(GetParam(), Device::cpu());
}

INSTANTIATE_TEST_SUITE_P(Trl, DistillTrl, ::testing::Values("fkl", "jsd", "rkl", "jsd_t2"));

// The same on a GPU: the divergence's CUDA row passes (kernels/divergence_blocks.cu).
class DistillTrlCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(DistillTrlCuda, LossEntropyAndStudentGradientsMatchTrl) {
  LT_SKIP_WITHOUT_CUDA();
  check_against_trl(GetParam(), Device::cuda(0));
}

INSTANTIATE_TEST_SUITE_P(Trl, DistillTrlCuda, ::testing::Values("fkl", "jsd", "rkl", "jsd_t2"));

// A tiny student, a teacher (`teacher_seed` 1: the student's own weights) and a dataset of
// `rows` lines made by `row(i)`, for trainer_bin distill runs on the CPU.
struct DistillSetup {
  std::string out, student, teacher, dataset;
  // trainer_bin distill --device cpu --logging_steps 1 --save_steps 0 on them, into out/dir, with
  // `args` (the caller's steps, batch and options); returns its exit status and *records, the
  // lines of metrics.jsonl.
  int run(const std::string& dir, const std::string& args, std::string* log,
          std::vector<nlohmann::json>* records = nullptr) const {
    const int rc = testing::run_command(
        testing::trainer_bin() + " distill --device cpu --logging_steps 1 --save_steps 0 " +
            "--model_name_or_path " + student + " --teacher_model_name_or_path " + teacher +
            " --dataset " + dataset + " --output_dir " + out + "/" + dir + " " + args + " 2>&1",
        log);
    if (records) {
      records->clear();
      std::ifstream in(out + "/" + dir + "/metrics.jsonl");
      for (std::string line; std::getline(in, line);)
        records->push_back(nlohmann::json::parse(line));
    }
    return rc;
  }
  // The run's logged losses; it must exit 0.
  std::vector<double> losses(const std::string& dir, const std::string& args,
                             std::string* log) const {
    std::vector<nlohmann::json> recs;
    EXPECT_EQ(run(dir, args, log, &recs), 0) << *log;
    std::vector<double> l;
    for (const auto& r : recs) l.push_back(r["loss"].get<double>());
    return l;
  }
};

DistillSetup distill_setup(const std::string& name, uint64_t teacher_seed, int rows,
                           const std::function<std::string(int)>& row) {
  DistillSetup d;
  d.out = testing::temp_dir(name);
  d.student = testing::make_tiny_model(d.out + "/student");
  d.teacher = testing::make_tiny_model(d.out + "/teacher", teacher_seed);
  d.dataset = d.out + "/data.jsonl";
  std::ofstream f(d.dataset);
  for (int i = 0; i < rows; ++i) f << row(i) << "\n";
  return d;
}

std::string story_prompt(int i) {
  return "{\"prompt\": \"Once upon a time " + std::to_string(i) + "\"}";
}

// The built-in demo: the demo model teaches a fresh initialisation of itself; the divergence
// falls, the student's entropy is logged, and the memory report names the chunked divergence.
void check_demo(const std::string& device) {
  const std::string out = testing::temp_dir("distill_demo_" + device);
  std::string log;
  ASSERT_EQ(testing::run_command("cd " + out + " && " + testing::trainer_bin() +
                                     " distill --device " + device + " 2>&1",
                                 &log),
            0)
      << log;
  std::ifstream in(out + "/trainer_output/embedded_distill/metrics.jsonl");
  std::vector<nlohmann::json> recs;
  for (std::string line; std::getline(in, line);) recs.push_back(nlohmann::json::parse(line));
  ASSERT_GE(recs.size(), 4u) << log;
  EXPECT_LT(recs.back()["loss"].get<double>(), 0.5 * recs.front()["loss"].get<double>()) << log;
  EXPECT_GT(recs.back()["entropy"].get<double>(), 0.0);
  EXPECT_NE(log.find("chunked divergence (distill)"), std::string::npos) << log;
  EXPECT_NE(log.find("a frozen teacher of"), std::string::npos) << log;
}

TEST(Distill, DemoDivergenceFalls) { check_demo("cpu"); }

// Generation on the online trainers' paged KV cache with sleep mode (the pool freed after each
// generation phase) gives the same run, and the report says what sleeping gave back.
TEST(Distill, SleepModeGivesTheSameRun) {
  const std::string out = testing::temp_dir("distill_sleep");
  auto losses = [&](const std::string& dir, const std::string& extra, std::string* log) {
    EXPECT_EQ(testing::run_command(testing::trainer_bin() +
                                       " distill --device cpu --max_steps 4 --logging_steps 1 "
                                       "--output_dir " +
                                       out + "/" + dir + extra + " 2>&1",
                                   log),
              0)
        << *log;
    std::vector<double> l;
    std::ifstream in(out + "/" + dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);)
      l.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    return l;
  };
  std::string awake_log, asleep_log;
  const std::vector<double> awake = losses("awake", "", &awake_log);
  const std::vector<double> asleep = losses("asleep", " --generation_sleep", &asleep_log);
  ASSERT_EQ(awake.size(), 4u) << awake_log;
  EXPECT_EQ(asleep, awake);
  EXPECT_NE(asleep_log.find("sleep mode:"), std::string::npos) << asleep_log;
}

TEST(DistillCuda, DemoDivergenceFalls) {
  LT_SKIP_WITHOUT_CUDA();
  check_demo("cuda");
}

// A student taught by a copy of itself starts at no divergence at all (every logged update's
// loss is the divergence after the previous updates: the first is 0 up to rounding); an NF4
// copy of the same teacher (--teacher_load_in_4bit) is no longer identical. A LoRA student and a
// QLoRA one train too.
TEST(Distill, AStudentTaughtByItselfStartsAtZero) {
  const DistillSetup d = distill_setup("distill_self", 1, 8, story_prompt);
  const std::string out = d.out;
  auto first_loss = [&](const std::string& extra, const std::string& dir) {
    std::string log;
    const std::vector<double> l = d.losses(
        dir, "--max_steps 2 --per_device_train_batch_size 4 --max_completion_length 6" + extra,
        &log);
    EXPECT_FALSE(l.empty()) << log;
    return l.empty() ? -1.0 : l[0];
  };
  const double dense = first_loss("", "dense"), nf4 = first_loss(" --teacher_load_in_4bit", "nf4");
  const double int8 = first_loss(" --teacher_load_in_8bit", "int8");
  EXPECT_NEAR(dense, 0.0, 1e-6);
  EXPECT_GT(nf4, 1e-6);  // the quantized teachers differ from the student
  EXPECT_GT(int8, 1e-9);
  EXPECT_LT(int8, nf4);  // int8 is the closer copy
  // A LoRA student (B starts at 0: the student is its base, the teacher's copy) trains too.
  EXPECT_NEAR(first_loss(" --use_peft --lora_r 4", "lora"), 0.0, 1e-6);
  EXPECT_TRUE(std::filesystem::exists(out + "/lora/adapter_model.safetensors"));
  // A QLoRA student (its base in NF4) differs from the dense teacher, and is again its NF4 copy's
  // twin: both quantize the same weights the same way.
  EXPECT_GT(first_loss(" --use_peft --lora_r 4 --load_in_4bit", "qlora"), 1e-6);
  EXPECT_NEAR(
      first_loss(" --use_peft --lora_r 4 --load_in_4bit --teacher_load_in_4bit", "qlora_nf4"), 0.0,
      1e-6);
  EXPECT_TRUE(std::filesystem::exists(out + "/qlora_nf4/adapter_model.safetensors"));
  EXPECT_NEAR(first_loss(" --use_peft --lora_r 4 --load_in_8bit --teacher_load_in_8bit", "q8"), 0.0,
              1e-6);
}

// trainer_bin estimate distill counts the teacher's weights as loaded (dense, NF4 or int8), and
// its optimizer-phase peak is the measured one within 6% (the dense teacher, as grpo's test).
TEST(Distill, EstimateCountsTheTeacher) {
  const std::string out = testing::temp_dir("distill_estimate");
  const std::string student = testing::make_tiny_model(out + "/student");
  const std::string teacher = testing::make_tiny_model(out + "/teacher");
  std::ofstream(out + "/p.jsonl") << "{\"prompt\": \"Once upon a time\"}\n"
                                  << "{\"prompt\": \"The cat\"}\n";
  auto parse = [&](const std::vector<std::string>& extra, const std::string& t) {
    Options o = online_options("distill");
    add_online_estimate_options(o);
    std::vector<std::string> args = {"--device",
                                     "cpu",
                                     "--max_steps",
                                     "2",
                                     "--save_steps",
                                     "0",
                                     "--dataset",
                                     out + "/p.jsonl",
                                     "--model_name_or_path",
                                     student,
                                     "--teacher_model_name_or_path",
                                     t,
                                     "--output_dir",
                                     out + "/run",
                                     "--max_completion_length",
                                     "6",
                                     "--per_device_train_batch_size",
                                     "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    EXPECT_TRUE(o.parse(args));
    apply_demo_defaults(*find_trainer_spec("distill"), o);
    return o;
  };
  auto estimate = [&](const std::vector<std::string>& extra, const std::string& t) {
    return estimate_online_from_options(parse(extra, t), "distill", student, true);
  };
  const OnlineEstimate dense = estimate({}, teacher),
                       nf4 = estimate({"--teacher_load_in_4bit"}, teacher),
                       int8 = estimate({"--teacher_load_in_8bit"}, teacher);
  EXPECT_EQ(dense.reference_mode, "teacher");
  EXPECT_GT(dense.reference_params, int8.reference_params);
  EXPECT_GT(int8.reference_params, nf4.reference_params);
  EXPECT_GT(nf4.reference_params, 0);
  // Offloaded: the outer unit and two layers stay on the device; the demo model has four.
  const std::string demo = std::string(LT_SOURCE_DIR) + "/data/embedded";
  const OnlineEstimate demo_dense = estimate({}, demo);
  const OnlineEstimate demo_offload = estimate({"--teacher_offload"}, demo);
  const ModelConfig dc = ModelConfig::load(demo + "/config.json");
  ASSERT_EQ(dc.num_hidden_layers, 4);
  const int64_t outer = (dc.vocab_size * dc.hidden_size + dc.hidden_size) * 4;  // f32, tied
  EXPECT_EQ(demo_offload.reference_params - outer, (demo_dense.reference_params - outer) / 2);
  {  // the run and its models go before the next one: the allocator measures the process
    OnlineRun run = make_online_run("distill", parse({}, teacher));
    const TrainResult r = run.trainer->train();
    const double measured =
        r.memory["savings"]["generation"]["optimizer_phase_peak_allocated"].get<double>();
    EXPECT_NEAR(static_cast<double>(dense.optimizer_peak) / measured, 1.0, 0.06)
        << dense.optimizer_peak << " estimated, " << measured << " measured";
  }
  // --seq_kd at lmbda 0: only the teacher samples (its own pool and transients), the student
  // keeps no pool; both phases within 6% of the run's.
  const std::vector<std::string> seq_kd = {"--lmbda", "0", "--seq_kd"};
  const OnlineEstimate sk = estimate(seq_kd, teacher);
  EXPECT_GT(sk.teacher_generation, 0);
  EXPECT_EQ(sk.kv_pool, 0);
  OnlineRun sk_run = make_online_run("distill", parse(seq_kd, teacher));
  const nlohmann::json gen = sk_run.trainer->train().memory["savings"]["generation"];
  EXPECT_NEAR(static_cast<double>(sk.generation_peak) /
                  gen["generation_phase_peak_allocated"].get<double>(),
              1.0, 0.06)
      << gen.dump();
  EXPECT_NEAR(
      static_cast<double>(sk.optimizer_peak) / gen["optimizer_phase_peak_allocated"].get<double>(),
      1.0, 0.06)
      << gen.dump();
}

// --teacher_offload: the teacher's layers in pinned host memory, one (and the prefetched next)
// on the device at a time; the run is the dense teacher's bit for bit (an NF4 teacher's, the NF4
// teacher's), and the memory report says how much stayed on the host. Then the teacher's dtype.
TEST(Distill, TeacherFormsGiveTheirRuns) {
  const DistillSetup d = distill_setup("distill_offload", 7, 6, story_prompt);
  auto run = [&](const std::string& extra, const std::string& dir, std::string* log) {
    return d.losses(
        dir, "--max_steps 3 --per_device_train_batch_size 2 --max_completion_length 6" + extra,
        log);
  };
  std::string dense_log, offload_log;
  const std::vector<double> dense = run("", "dense", &dense_log);
  const std::vector<double> offloaded = run(" --teacher_offload", "offload", &offload_log);
  ASSERT_EQ(dense.size(), 3u) << dense_log;
  EXPECT_GT(dense[0], 1e-3);  // a teacher of other weights
  EXPECT_EQ(offloaded, dense);
  // An NF4 teacher offloaded: its quantized form moves, the run is the NF4 teacher's.
  std::string nf4_log;
  const std::vector<double> nf4 = run(" --teacher_load_in_4bit", "nf4", &nf4_log);
  const std::vector<double> nf4_off =
      run(" --teacher_load_in_4bit --teacher_offload", "nf4_offload", &nf4_log);
  ASSERT_EQ(nf4.size(), 3u) << nf4_log;
  EXPECT_NE(nf4, dense);
  EXPECT_EQ(nf4_off, nf4);
  EXPECT_NE(offload_log.find("teacher offloaded layer by layer"), std::string::npos) << offload_log;
  EXPECT_EQ(dense_log.find("teacher offloaded"), std::string::npos);
  // --teacher_model_init_kwargs (TRL's): a bf16 teacher beside the f32 student, each model's
  // hidden states and head in its own dtype: near the f32 teacher's run, not equal to it; "auto"
  // reads config.json's float32.
  std::string kw_log;
  const std::vector<double> bf16 =
      run(" --teacher_model_init_kwargs '{\"torch_dtype\": \"bfloat16\"}'", "bf16", &kw_log);
  ASSERT_EQ(bf16.size(), 3u) << kw_log;
  EXPECT_NE(bf16[0], dense[0]);
  EXPECT_NEAR(bf16[0], dense[0], 0.02 * dense[0]);
  EXPECT_EQ(run(" --teacher_model_init_kwargs '{\"dtype\": \"auto\"}'", "auto", &kw_log), dense);
}

// --lmbda (GKD's share of on-policy batches): at 0 every batch takes the dataset's completions,
// so no sampling option changes the run and the logged lengths are the dataset's; at 0.5 the
// batches mix, drawn from the seed; a dataset without completions, or the demo, is refused.
TEST(Distill, OffPolicyBatchesTrainOnTheDatasetCompletions) {
  const DistillSetup d = distill_setup("distill_lmbda", 7, 8, [](int i) {
    return "{\"prompt\": \"Once upon a time " + std::to_string(i) +
           "\", \"completion\": \" a cat\"}";
  });
  auto run = [&](const std::string& extra, const std::string& dir, std::string* log) {
    std::vector<nlohmann::json> recs;
    EXPECT_EQ(
        d.run(dir,
              "--max_steps 6 --per_device_train_batch_size 2 --max_completion_length 12" + extra,
              log, &recs),
        0)
        << *log;
    return recs;
  };
  std::string log;
  const auto off = run(" --lmbda 0", "off", &log);
  ASSERT_EQ(off.size(), 6u) << log;
  EXPECT_NE(log.find("8 dataset completions for off-policy batches"), std::string::npos) << log;
  const auto off_topk = run(" --lmbda 0 --top_k 1", "off_topk", &log);
  ASSERT_EQ(off_topk.size(), 6u) << log;
  for (size_t i = 0; i < off.size(); ++i) {
    EXPECT_EQ(off[i]["on_policy"].get<int>(), 0);
    EXPECT_GT(off[i]["loss"].get<double>(), 1e-4);
    EXPECT_EQ(off[i]["loss"], off_topk[i]["loss"]) << "sampling changed an off-policy run";
    // " a cat" and eos, every batch.
    EXPECT_EQ(off[i]["completions/mean_length"], off[0]["completions/mean_length"]);
  }
  const auto mixed = run(" --lmbda 0.5", "mixed", &log);
  ASSERT_EQ(mixed.size(), 6u) << log;
  int on = 0;
  for (const auto& r : mixed) on += r["on_policy"].get<int>();
  EXPECT_GT(on, 0);
  EXPECT_LT(on, 6);
  const auto on_policy = run("", "on", &log);
  EXPECT_FALSE(on_policy[0].contains("on_policy"));  // lmbda 1: DistillationTrainer's metrics
  // Refusals: prompt-only rows; the demo (it has no completions).
  DistillSetup prompt_only = d;
  prompt_only.dataset = d.out + "/p.jsonl";
  std::ofstream(prompt_only.dataset) << "{\"prompt\": \"hi\"}\n";
  EXPECT_EQ(prompt_only.run("x", "--lmbda 0", &log), 2) << log;
  EXPECT_NE(log.find("its rows must be prompt_completion"), std::string::npos) << log;
  EXPECT_EQ(
      testing::run_command(testing::trainer_bin() + " distill --device cpu --lmbda 0.5 2>&1", &log),
      2)
      << log;
}

// --seq_kd (GKD's sequence-level KD): the off-policy batches are the teacher's completions. On
// prompt-only rows (no completions to take) every batch trains on what the teacher sampled, and
// the student never generated (its KV-cache pool was never made). Without --lmbda below 1 the
// option would do nothing: refused.
TEST(Distill, SeqKdBatchesAreTheTeachersCompletions) {
  const DistillSetup d = distill_setup("distill_seq_kd", 7, 6, story_prompt);
  const std::string base =
      "--max_steps 3 --per_device_train_batch_size 2 --max_completion_length 6";
  std::string log;
  std::vector<nlohmann::json> recs;
  ASSERT_EQ(d.run("o", base + " --lmbda 0 --seq_kd", &log, &recs), 0) << log;
  for (const nlohmann::json& r : recs) {
    EXPECT_EQ(r["on_policy"].get<int>(), 0);
    EXPECT_GT(r["completions/mean_length"].get<double>(), 0.0);
    EXPECT_GT(r["loss"].get<double>(), 1e-4);
  }
  EXPECT_EQ(recs.size(), 3u) << log;
  EXPECT_NE(log.find("KV-cache pool 0 B"), std::string::npos) << log;
  EXPECT_EQ(d.run("o2", base + " --seq_kd", &log), 2) << log;
  EXPECT_NE(log.find("option --seq_kd: with --lmbda 1"), std::string::npos) << log;
}

TEST(Distill, TeacherChecks) {
  std::string log;
  const std::string out = testing::temp_dir("distill_checks");
  const std::string student = testing::make_tiny_model(out + "/student");
  // A dataset without a teacher: exit 2, one line.
  std::ofstream(out + "/p.jsonl") << "{\"prompt\": \"hi\"}\n";
  EXPECT_EQ(testing::run_command(testing::trainer_bin() +
                                     " distill --device cpu --max_steps 1 "
                                     "--model_name_or_path " +
                                     student + " --dataset " + out + "/p.jsonl --output_dir " +
                                     out + "/o 2>&1",
                                 &log),
            2)
      << log;
  EXPECT_NE(log.find("distill: --teacher_model_name_or_path is required"), std::string::npos)
      << log;
  // beta outside [0, 1] is refused by its option.
  EXPECT_EQ(
      testing::run_command(testing::trainer_bin() + " distill --device cpu --beta 2 2>&1", &log), 2)
      << log;
  // Options that belong to other trainers are not declared.
  EXPECT_EQ(testing::run_command(testing::trainer_bin() +
                                     " distill --device cpu --reward_funcs accuracy_reward 2>&1",
                                 &log),
            2)
      << log;
}

}  // namespace
}  // namespace leantune
