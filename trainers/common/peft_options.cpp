// The PEFT options and their application to a model (see peft_options.h).
#include "trainers/common/peft_options.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "engine/check.h"
#include "loaders/hub_cache.h"

namespace leantune {

namespace {

namespace fs = std::filesystem;

int64_t parse_token_id(const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  LT_CHECK_INPUT(!text.empty() && end == text.c_str() + text.size() && errno == 0 && v >= 0,
                 "option trainable_token_indices: '", text,
                 "' is not a token id (a non-negative integer)");
  return v;
}

}  // namespace

const OptionTable<PeftConfig>& peft_config_table() {
  using C = PeftConfig;
  static const OptionTable<C> t =
      OptionTable<C>()
          .integer("lora_r", &C::r, "LoRA rank", 1)
          .integer("lora_alpha", &C::lora_alpha, "LoRA alpha: the update is scaled by alpha / r", 1)
          .real("lora_dropout", &C::lora_dropout, "dropout on the LoRA input while training", 0.0,
                0.999999)
          .list("lora_target_modules", &C::target_modules,
                "modules that get LoRA (names such as q_proj,v_proj, or all-linear); default: "
                "q_proj,v_proj for llama and qwen2")
          .flag("use_rslora", &C::use_rslora, "rank-stabilised LoRA: scale by alpha / sqrt(r)")
          .list("lora_modules_to_save", &C::modules_to_save,
                "modules trained whole and saved with the adapter (e.g. lm_head)")
          .custom(
              [](Options& o, const C&) {
                o.add_string_list("trainable_token_indices", {},
                                  "token ids whose embedding rows train (a few new tokens), e.g. "
                                  "5,7,9");
              },
              [](const Options& o, C& c) {
                c.trainable_token_indices.clear();
                for (const std::string& s : o.get_string_list("trainable_token_indices"))
                  c.trainable_token_indices.push_back(parse_token_id(s));
              },
              "trainable_token_indices");
  return t;
}

const OptionTable<PeftArguments>& peft_table() {
  using A = PeftArguments;
  static const OptionTable<A> t =
      OptionTable<A>()
          .flag("use_peft", &A::use_peft, "train LoRA adapters (PEFT) instead of the whole model")
          .nested(&A::config, peft_config_table())
          .flag("merge_adapter", &A::merge_adapter,
                "also write the model with the adapter merged in (an HF folder, in merged/)");
  return t;
}

void add_peft_options(Options& o) { peft_table().declare(o); }

PeftArguments peft_arguments(const Options& o) {
  const PeftArguments a = peft_table().read(o);
  if (!a.use_peft)
    for (const std::string& name : peft_config_table().names())
      LT_CHECK_INPUT(!o.is_set(name), "option ", name, " needs use_peft");
  return a;
}

PeftSetup apply_peft_options(const Options& o, DecoderModel& model, uint64_t seed) {
  const PeftArguments a = peft_arguments(o);
  if (!a.use_peft) return PeftSetup{};
  return apply_peft(a.config, model, seed);
}

void save_peft(const PeftSetup& setup, const DecoderModel& model, const std::string& dir,
               const std::string& base_model_name_or_path) {
  LT_CHECK(setup.active(), "save_peft without a PEFT setup");
  save_adapter(setup, model, dir, base_model_name_or_path);
}

void load_peft_checkpoint(const PeftSetup& setup, const DecoderModel& model,
                          const std::string& dir) {
  LT_CHECK(setup.active(), "load_peft_checkpoint without a PEFT setup");
  load_adapter_weights(setup, model, dir);
}

std::string resolve_base_model_path(const std::string& adapter_dir) {
  std::string base;
  read_adapter_config(adapter_dir, &base);
  const std::string config = (fs::path(adapter_dir) / "adapter_config.json").string();
  LT_CHECK_INPUT(!base.empty(), config,
                 ": base_model_name_or_path is empty; the adapter does not say which model it "
                 "belongs to");
  const fs::path p(base);
  if (p.is_absolute()) {
    LT_CHECK_INPUT(fs::is_directory(p), config, ": base model folder ", base, " does not exist");
    return base;
  }
  fs::path dir = fs::absolute(fs::path(adapter_dir)).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "a/b/" names b
  const fs::path beside = dir.parent_path() / p;
  if (fs::is_directory(beside)) return beside.lexically_normal().string();
  if (fs::is_directory(p)) return base;
  if (in_hub_cache(base)) return resolve_model_path(base, "model_name_or_path");
  LT_THROW(ErrorKind::kInput, config, ": base model '", base, "' not found (tried ",
           beside.lexically_normal().string(), " and ", fs::absolute(p).string(), ")");
}

std::shared_ptr<DecoderModel> load_model_or_adapter(const std::string& path, Device device,
                                                    DType dtype, PeftSetup* out, uint64_t seed) {
  if (!is_adapter_dir(path)) {
    std::shared_ptr<DecoderModel> model = DecoderModel::load(path, device, dtype);
    if (out) *out = PeftSetup{};
    return model;
  }
  std::shared_ptr<DecoderModel> model =
      DecoderModel::load(resolve_base_model_path(path), device, dtype);
  PeftSetup setup = load_adapter(path, *model, seed);
  setup.set_training(false);
  if (out) *out = std::move(setup);
  return model;
}

void merge_and_save(const PeftSetup& setup, DecoderModel& model, const std::string& dir,
                    DType disk_dtype) {
  save_merged(setup, model, dir, disk_dtype);
}

void save_adapter_output(const PeftSetup& setup, DecoderModel& model, const std::string& dir,
                         bool final_output, const std::string& base_model_name_or_path,
                         bool merge_adapter,
                         const std::function<void(const std::string&)>& extras) {
  save_peft(setup, model, dir, base_model_name_or_path);
  extras(dir);
  if (!final_output || !merge_adapter) return;
  const DType disk = model.dtype() == DType::kF64 ? DType::kF32 : model.dtype();
  merge_and_save(setup, model, dir + "/merged", disk);
  extras(dir + "/merged");
}

void add_adapter_savings(nlohmann::json& savings, const DecoderModel& model, const PeftSetup& peft,
                         const QuantConfig& quant, const QuantizeReport& report) {
  if (quant.enabled())
    savings["quantized_base"] = {{"kind", quant.kind()},
                                 {"modules", report.quantized_modules},
                                 {"dense_bytes", report.dense_bytes},
                                 {"quantized_bytes", report.quantized_bytes}};
  if (!peft.active()) return;
  const int64_t total = model.num_parameters();
  const int64_t trainable = peft.num_trainable_parameters(model);
  const int64_t per =
      static_cast<int64_t>(dtype_size(model.dtype())) + 8 + (model.dtype() == DType::kF32 ? 0 : 4);
  savings["peft"] = {
      {"trainable_parameters", trainable},
      {"total_parameters", total},
      {"grad_and_optimizer_bytes_avoided", std::max<int64_t>(total - trainable, 0) * per}};
}

}  // namespace leantune
