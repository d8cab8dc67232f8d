// leantune's public C++ API: what an HPC pipeline links (find_package(leantune) ->
// leantune::leantune, or pkg-config leantune) to load a model, fine-tune it and use it.
//
//   leantune::api::Model model = leantune::api::Model::load("");   // "" = the embedded demo
//   leantune::api::Trainer trainer(model, R"({"max_steps": 20, "output_dir": "run"})");
//   trainer.train([](const leantune::api::StepMetrics& m) { return m.loss < 10; });
//   std::string text = model.generate("One sunny day");
//
// Configuration uses trainer_bin sft's option names and meanings (`trainer_bin sft --help`):
// a trainer config is the JSON object `--config FILE` takes. The options that describe the
// model (model_name_or_path, device, bf16, use_peft, lora_*, load_in_4bit, ...) are given to
// Model::load; a trainer config that sets one of them to another value is an Error.
//
// Errors are leantune::api::Error, whose category() is trainer_bin's exit-code category.
// The API holds pointers to implementation only (no internal header is included), so the
// installed headers are this file alone and internal changes keep the ABI.
//
// Several models and trainers can live in one process: they share nothing but the
// per-device caching allocator (its statistics are per device, so memory_stats() of two
// models on the same device describe that device), the CUDA streams and the OpenMP pool.
// SIGINT/SIGTERM/SIGHUP are caught while train() runs (unless TrainerSetup says not to): the
// trainer stops within a micro-batch, saves its last completed update as a checkpoint and
// returns (docs/trainers.md).
//
// Threads: one train() at a time per process. The stop flag, the allocators' peak counters
// (reset when train() begins) and memory trace, the step profiler and the OpenMP pool are
// process-wide, so a second train() running at once on another thread is not supported (random
// streams are per trainer: Philox keyed by seed and purpose, no global state). Model and
// Trainer objects are not thread-safe: any thread may use one, one thread at a time, and a Model
// is in use while a Trainer of it trains (Model::generate from a step callback, on the training
// thread, is fine). Loading models and building trainers while another thread trains is not
// supported either (their allocations would count in that training's peaks and memory trace).
// set_log_sink: from any thread at any time; the sink is called on the thread that logs, one
// message at a time. request_stop: from any thread or a signal handler.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace leantune::api {

// The library's version (the project version of the build), e.g. "0.3.0".
const char* version();

// Where leantune's messages (progress lines, warnings, notes) go. Default: stderr, kInfo and up.
enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
// (level, one message without a line terminator).
using LogSink = std::function<void(LogLevel, const std::string&)>;
// Sends every message at min_level or above to `sink` (an empty sink: back to stderr); messages
// below min_level are dropped. Process-wide. The sink is called one message at a time, under a
// lock: it must not call into leantune (set_log_sink included); an exception it throws is
// dropped.
void set_log_sink(LogSink sink, LogLevel min_level = LogLevel::kInfo);

// Asks the running train() to stop as a first SIGTERM does: at the next update it saves a
// checkpoint of its last completed update and returns with stopped_early. Async-signal-safe (an
// embedder's own signal handler may call it); a request made while no train() runs is dropped
// when the next train() begins.
void request_stop() noexcept;

// An MPI communicator, as its Fortran handle (MPI_Comm_c2f), so that this header needs no mpi.h.
// With mpi.h included before this header, mpi_comm(comm) makes one.
struct MpiComm {
  int64_t fortran_handle = 0;
};
#ifdef MPI_VERSION
inline MpiComm mpi_comm(MPI_Comm comm) { return MpiComm{MPI_Comm_c2f(comm)}; }
#endif

// trainer_bin's exit codes, one per kind of failure.
enum class ErrorCategory {
  kInternal = 1,     // a bug or an unexpected library failure
  kInput = 2,        // bad option, file or data
  kOutOfMemory = 3,  // the caching allocator (or the host) ran out of memory
  kNonFinite = 4,    // training stopped after repeated non-finite steps
  kComm = 5,         // a peer rank died or stalled past --comm_timeout
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCategory category, const std::string& what)
      : std::runtime_error(what), category_(category) {}
  ErrorCategory category() const { return category_; }
  int exit_code() const { return static_cast<int>(category_); }

 private:
  ErrorCategory category_;
};

// Model options; an unset field keeps trainer_bin's default for that option.
struct ModelOptions {
  std::optional<std::string> device;  // "cpu", "cuda", "cuda:N", "auto"
  std::optional<bool> bf16;
  std::optional<int64_t> seed;  // random init of the embedded model, LoRA init
  // LoRA (PEFT): the base is frozen, adapters train.
  std::optional<bool> use_peft;
  std::optional<int64_t> lora_r;
  std::optional<int64_t> lora_alpha;
  std::optional<double> lora_dropout;
  std::optional<std::vector<std::string>> lora_target_modules;  // names, or {"all-linear"}
  // QLoRA: the frozen base quantized while loading (needs use_peft).
  std::optional<bool> load_in_4bit;
  std::optional<bool> load_in_8bit;
  // Any other model option as a JSON object, e.g. R"({"use_rslora": true})".
  std::string json;
};

struct MemoryStats {
  std::string device;
  int64_t allocated = 0;  // bytes in live blocks now
  int64_t reserved = 0;   // bytes the allocator holds from the device now
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;
  std::map<std::string, int64_t> peak_by_tag;  // param, grad, optimizer, activation, ...
};

struct GenerateOptions {  // unset: leantune's defaults (64 new tokens, greedy)
  std::optional<int64_t> max_new_tokens;
  std::optional<double> temperature;
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<uint64_t> seed;
};

class Trainer;

class Model {
 public:
  // An HF model folder (Llama / Qwen2 safetensors + tokenizer), a PEFT adapter folder (its base
  // is loaded and the adapter trains on), or "" for the embedded demo model.
  static Model load(const std::string& path, const ModelOptions& options = {});

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  // Greedy (or sampled) continuation of `prompt`, without the prompt.
  std::string generate(const std::string& prompt, const GenerateOptions& options = {}) const;
  // Writes the model as an HF folder with its tokenizer; with LoRA, the adapter folder (and
  // with merged=true the merged model in dir/merged too).
  void save(const std::string& dir, bool merged = false) const;
  int64_t num_parameters() const;
  int64_t num_trainable_parameters() const;
  std::string device() const;
  std::string dtype() const;  // "f32" or "bf16"
  std::string architecture() const;
  // The allocator's figures for this model's device (peaks since the last train() began).
  MemoryStats memory_stats() const;

 private:
  friend class Trainer;
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What one optimizer update did.
struct StepMetrics {
  int64_t step = 0;  // 1-based
  int64_t total_steps = 0;
  double loss = 0;
  double grad_norm = 0;
  double learning_rate = 0;
  int64_t num_tokens = 0;  // trained tokens so far
  bool skipped = false;    // non-finite loss or gradient, or no label token: no update
  int64_t allocated_bytes = 0;
};

struct TrainSummary {
  int64_t steps = 0;
  std::vector<double> losses;  // per update
  int64_t skipped_steps = 0;
  // A callback returned false, or a stop signal: a checkpoint of the last completed update was
  // saved (none when no update completed, steps 0).
  bool stopped_early = false;
  // Resumed from a checkpoint already at or past max_steps: nothing trained, no model written.
  bool nothing_to_do = false;
  std::string resumed_from;  // the checkpoint resumed from, if any
  int64_t total_steps = 0;
  std::optional<double> eval_loss;
  // Every metric of that final evaluation under TRL's eval_ names (eval_loss, eval_entropy,
  // eval_rewards/accuracies, ...); empty without evaluation data.
  std::map<std::string, double> eval_metrics;
  std::string memory_report;  // the report trainer_bin prints at the end
};

// Return false to stop after this step (a checkpoint is saved, as on SIGTERM).
using StepCallback = std::function<bool(const StepMetrics&)>;

// What a pipeline hands a trainer besides its options.
struct TrainerSetup {
  // The algorithm, by its trainer_bin command name: sft, dpo, kto, grpo, rloo, online_dpo or
  // distill (the config takes that command's options; distill's teacher_model_name_or_path).
  // reward trains a sequence classifier, which Model::load does not load: use trainer_bin
  // reward.
  std::string algorithm = "sft";
  // false: train() leaves the process's SIGTERM/SIGINT/SIGHUP handlers as they are; the
  // embedder stops a run with request_stop().
  bool install_signal_handlers = true;
  // The ranks the run spans (e.g. a sub-communicator of a larger job) instead of MPI_COMM_WORLD.
  // The caller initialises MPI (MPI_Init_thread, MPI_THREAD_SERIALIZED or more) and finalises it
  // after the trainer is destroyed; leantune works on a duplicate (MPI_Comm_dup), so its messages
  // never match the caller's. Every rank of it constructs its Trainer (collective). comm_backend
  // auto or mpi (CPU), nccl (one GPU per rank). cp_size > 1 with a communicator: sft only.
  std::optional<MpiComm> communicator;
  // The training rows in memory instead of config option `dataset`: each the JSON object a line
  // of a JSONL file holds (any format `trainer_bin <algorithm> --dataset` reads; for sft token
  // ids too: {"input_ids": [...]}), read and checked as a file's lines. A bad row is named
  // "dataset_rows:N" with N its index + 1 (as a file's line number). The demo's defaults do not
  // apply to a run given rows.
  std::optional<std::vector<std::string>> dataset_rows;
};

class Trainer {
 public:
  // A run of setup.algorithm (sft unless set) on `model` (which must outlive the trainer),
  // configured by a JSON object with that trainer_bin command's keys (dataset, max_steps,
  // learning_rate, output_dir, beta, ...). Without a dataset, the embedded demo's data and
  // settings are used.
  Trainer(Model& model, const std::string& config_json, const TrainerSetup& setup = {});
  Trainer(Trainer&&) noexcept;
  Trainer& operator=(Trainer&&) noexcept;
  ~Trainer();

  // Runs to max_steps (or num_train_epochs), calling `on_step` after every update, then
  // writes the final model to output_dir. One call per Trainer.
  TrainSummary train(const StepCallback& on_step = {});
  std::string output_dir() const;
  // Every option and its final value (trainer_bin sft's keys), as JSON text.
  std::string config_json() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace leantune::api
