// The public C++ API (include/leantune/leantune.h) over the trainers layer: a Model is what
// load_sft_model() builds from the model options, a Trainer is an algorithm's TrainerSpec run
// on that model (make_run_on_model; sft's make_sft_run with in-memory rows and a communicator)
// with the rest of the options from a JSON config. Every internal error leaves as
// leantune::api::Error with the exit-code category of its ErrorKind.
#include <exception>
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/allocator.h"
#include "engine/blas_kernels.h"
#include "engine/check.h"
#include "engine/comm.h"
#include "engine/log.h"
#include "leantune/leantune.h"
#include "loaders/text_encoder.h"
#include "models/generate.h"
#include "trainers/common/data_options.h"
#include "trainers/common/model_io.h"
#include "trainers/common/peft_options.h"
#include "trainers/common/stop_signal.h"
#include "trainers/common/trainer_spec.h"
#include "trainers/sft/sft.h"

#ifndef LEANTUNE_VERSION
#error "LEANTUNE_VERSION is defined by the build (CMakeLists.txt)"
#endif

namespace leantune::api {

namespace {

// Runs f, turning every internal exception into api::Error (user exceptions pass through).
template <typename F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const api::Error&) {
    throw;
  } catch (const leantune::Error& e) {
    throw api::Error(static_cast<ErrorCategory>(exit_code(e.kind())), e.what());
  } catch (const nlohmann::json::exception& e) {
    throw api::Error(ErrorCategory::kInput, e.what());
  } catch (const std::bad_alloc&) {
    throw api::Error(ErrorCategory::kOutOfMemory, "out of host memory");
  } catch (const std::exception& e) {
    throw api::Error(ErrorCategory::kInternal, std::string("internal error: ") + e.what());
  }
}

nlohmann::json parse_object(const std::string& text, const std::string& what) {
  if (text.empty()) return nlohmann::json::object();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    LT_THROW(ErrorKind::kInput, what, ": not valid JSON (", e.what(), ")");
  }
  LT_CHECK_INPUT(j.is_object(), what, ": expected a JSON object, got ", j.type_name());
  return j;
}

bool is_model_option(const std::string& key) {
  std::string k = key;
  for (char& c : k) c = c == '-' ? '_' : c;
  for (const std::string& n : sft_model_option_names())
    if (n == k) return true;
  return false;
}

}  // namespace

const char* version() { return LEANTUNE_VERSION; }

void set_log_sink(LogSink sink, LogLevel min_level) {
  leantune::LogSink inner;
  if (sink)
    inner = [sink = std::move(sink)](leantune::LogLevel level, const std::string& text) {
      try {
        sink(static_cast<LogLevel>(level), text);
      } catch (...) {
        // Documented: a sink's exception is dropped (it would otherwise cross a training step).
      }
    };
  leantune::set_log_sink(std::move(inner), static_cast<leantune::LogLevel>(min_level));
}

static_assert(static_cast<int>(LogLevel::kError) == static_cast<int>(leantune::LogLevel::kError));

void request_stop() noexcept { leantune::request_stop(); }

struct Model::Impl {
  Options options = sft_options();
  SftModel m;
};

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

Model Model::load(const std::string& path, const ModelOptions& mo) {
  return guarded([&] {
    // The library's initialisation for its host: it cannot restart the host with better BLAS
    // kernels, so it says once which variable to set (engine/blas_kernels.h).
    warn_once_about_blas_kernels();
    auto impl = std::make_unique<Impl>();
    nlohmann::json j = parse_object(mo.json, "ModelOptions::json");
    for (auto it = j.begin(); it != j.end(); ++it)
      LT_CHECK_INPUT(is_model_option(it.key()), "ModelOptions::json: '", it.key(),
                     "' is not a model option (training options go to the Trainer config)");
    j["model_name_or_path"] = path;
    auto put = [&](const char* key, const auto& v) {
      if (v) j[key] = *v;
    };
    put("device", mo.device);
    put("bf16", mo.bf16);
    put("seed", mo.seed);
    put("use_peft", mo.use_peft);
    put("lora_r", mo.lora_r);
    put("lora_alpha", mo.lora_alpha);
    put("lora_dropout", mo.lora_dropout);
    put("lora_target_modules", mo.lora_target_modules);
    put("load_in_4bit", mo.load_in_4bit);
    put("load_in_8bit", mo.load_in_8bit);
    impl->options.apply_json(j, "ModelOptions");
    impl->m = load_sft_model(impl->options);
    return Model(std::move(impl));
  });
}

std::string Model::generate(const std::string& prompt, const GenerateOptions& go) const {
  return guarded([&] {
    SftModel& m = impl_->m;
    GenerationConfig g;
    if (go.max_new_tokens) g.max_new_tokens = *go.max_new_tokens;
    if (go.temperature) g.temperature = *go.temperature;
    if (go.top_k) g.top_k = *go.top_k;
    if (go.top_p) g.top_p = *go.top_p;
    if (go.seed) g.seed = *go.seed;
    LT_CHECK_INPUT(g.max_new_tokens >= 1, "generate: max_new_tokens must be >= 1");
    g.eos_token_ids = {
        make_text_encoder(m.tokenizer, chat_table().read(impl_->options).chat_template)
            ->eos_token_id()};
    m.peft.set_training(false);
    GenerationResult r = leantune::generate(*m.model, {m.tokenizer->encode(prompt, true)}, g);
    m.peft.set_training(true);
    return m.tokenizer->decode(r.tokens[0], true);
  });
}

void Model::save(const std::string& dir, bool merged) const {
  guarded([&] {
    SftModel& m = impl_->m;
    const DType disk = m.model->dtype() == DType::kF64 ? DType::kF32 : m.model->dtype();
    if (m.peft.active()) {
      save_peft(m.peft, *m.model, dir, m.base_name);
      if (merged) {
        merge_and_save(m.peft, *m.model, dir + "/merged", disk);
        copy_tokenizer_files(m.setup.tokenizer_dir, dir + "/merged");
      }
    } else {
      LT_CHECK_INPUT(!merged, "Model::save: merged=true needs a LoRA model (use_peft)");
      m.model->save(dir, disk);
    }
    copy_tokenizer_files(m.setup.tokenizer_dir, dir);
  });
}

int64_t Model::num_parameters() const { return impl_->m.model->num_parameters(); }

int64_t Model::num_trainable_parameters() const {
  const SftModel& m = impl_->m;
  if (m.peft.active()) return m.peft.num_trainable_parameters(*m.model);
  int64_t n = 0;
  for (const auto& [name, t] : m.model->named_parameters())
    if (t.requires_grad()) n += t.numel();
  return n;
}

std::string Model::device() const { return impl_->m.model->device().str(); }
std::string Model::dtype() const { return dtype_name(impl_->m.model->dtype()); }
std::string Model::architecture() const { return impl_->m.model->config().architecture; }

MemoryStats Model::memory_stats() const {
  return guarded([&] {
    const AllocatorStats st = allocator(impl_->m.model->device()).stats();
    MemoryStats s;
    s.device = device();
    s.allocated = st.allocated.current;
    s.reserved = st.reserved.current;
    s.peak_allocated = st.allocated.peak;
    s.peak_reserved = st.reserved.peak;
    for (int i = 0; i < kNumMemTags; ++i)
      s.peak_by_tag[mem_tag_name(static_cast<MemTag>(i))] = st.by_tag[i].peak;
    return s;
  });
}

struct Trainer::Impl {
  Options options = sft_options();
  TrainRun run;
  bool trained = false;
};

Trainer::Trainer(Model& model, const std::string& config_json, const TrainerSetup& setup) {
  impl_ = guarded([&] {
    const TrainerSpec* spec = find_trainer_spec(setup.algorithm);
    LT_CHECK_INPUT(spec != nullptr, "TrainerSetup::algorithm '", setup.algorithm,
                   "': not an algorithm (sft, dpo, kto, grpo, rloo, online_dpo, distill)");
    LT_CHECK_INPUT(spec->make_run_on_model != nullptr, "TrainerSetup::algorithm '", setup.algorithm,
                   "': trains a model of its own kind, which Model::load does ",
                   "not load; use trainer_bin ", setup.algorithm);
    auto impl = std::make_unique<Impl>();
    const Options& model_options = model.impl_->options;
    impl->options = spec->options(spec->name);
    // The model's options (and its seed, which also orders the data) carry over to the run.
    const nlohmann::json model_json = model_options.to_json();
    nlohmann::json carried = nlohmann::json::object();
    std::vector<std::string> keys = sft_model_option_names();
    keys.push_back("seed");
    for (const std::string& k : keys)
      if (model_options.is_set(k)) carried[k] = model_json.at(k);
    impl->options.apply_json(carried, "ModelOptions");
    impl->options.apply_json(parse_object(config_json, "Trainer config"), "Trainer config");
    const nlohmann::json now = impl->options.to_json();
    for (const std::string& k : sft_model_option_names()) {
      const nlohmann::json was = model_json.value(k, nlohmann::json());
      LT_CHECK_INPUT(!impl->options.is_set(k) || now.value(k, nlohmann::json()) == was,
                     "Trainer config: option ", k, " belongs to the model (Model::load), which ",
                     "was loaded with ", was.dump());
    }
    if (!setup.dataset_rows) apply_demo_defaults(*spec, impl->options);
    RunInputs in;
    if (setup.dataset_rows)
      in.dataset_rows = std::make_shared<const std::vector<std::string>>(*setup.dataset_rows);
    if (setup.communicator) {
      in.comm = make_communicator_from_mpi(setup.communicator->fortran_handle,
                                           training_arguments(impl->options).comm);
      LT_CHECK_INPUT(spec->name == "sft" || training_arguments(impl->options).cp_size == 1,
                     "TrainerSetup::communicator: context parallelism (cp_size > 1) runs on the "
                     "world communicator for ",
                     spec->name);
    }
    impl->run = spec->make_run_on_model(impl->options, model.impl_->m, in);
    // sft's data loader shards over in.comm as it is built; the others shard at run time.
    if (in.comm) impl->run.trainer->set_communicator(in.comm);
    impl->run.trainer->set_install_signal_handlers(setup.install_signal_handlers);
    return impl;
  });
}

Trainer::Trainer(Trainer&&) noexcept = default;
Trainer& Trainer::operator=(Trainer&&) noexcept = default;
Trainer::~Trainer() = default;

TrainSummary Trainer::train(const StepCallback& on_step) {
  // An exception from the user's callback stops training and is rethrown as it was.
  std::exception_ptr user_error;
  TrainSummary summary = guarded([&] {
    LT_CHECK_INPUT(!impl_->trained, "Trainer::train: this trainer has already run");
    impl_->trained = true;
    if (on_step) {
      impl_->run.trainer->set_step_callback([&](const nlohmann::json& r) {
        StepMetrics m;
        m.step = r.at("step");
        m.total_steps = r.at("total_steps");
        m.loss = r.at("loss");
        m.grad_norm = r.at("grad_norm");
        m.learning_rate = r.at("learning_rate");
        m.num_tokens = r.at("num_tokens");
        m.skipped = r.at("skipped");
        m.allocated_bytes = r.at("allocated");
        try {
          return on_step(m);
        } catch (...) {
          user_error = std::current_exception();
          return false;
        }
      });
    }
    TrainResult r = impl_->run.trainer->train();
    impl_->run.trainer->set_step_callback({});
    TrainSummary s;
    s.steps = r.steps;
    s.losses = r.losses;
    s.skipped_steps = r.skipped_steps;
    s.stopped_early = r.interrupted;
    s.nothing_to_do = r.nothing_to_do;
    s.resumed_from = r.resumed_from;
    s.total_steps = r.total_steps;
    if (!r.interrupted) {
      s.eval_loss = r.final_eval_loss;
      if (r.final_eval.is_object())
        for (const auto& [k, v] : r.final_eval.items())
          if (k.rfind("eval_", 0) == 0 && v.is_number()) s.eval_metrics[k] = v.get<double>();
    }
    if (!r.nothing_to_do) s.memory_report = format_memory_report(r.memory);
    return s;
  });
  if (user_error) std::rethrow_exception(user_error);
  return summary;
}

std::string Trainer::output_dir() const { return impl_->run.trainer->args().output_dir; }
std::string Trainer::config_json() const { return impl_->options.to_json().dump(); }

}  // namespace leantune::api
