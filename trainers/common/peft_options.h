// The PEFT options of every trainer (TRL's ModelConfig names and defaults), and the calls a
// trainer makes to train, save, load and merge LoRA adapters (models/peft_io.h does the work).
//
//   use_peft                 false   train LoRA adapters instead of the whole model
//   lora_r                   16      rank
//   lora_alpha               32      scaling = alpha / r (alpha / sqrt(r) with use_rslora)
//   lora_dropout             0.05    dropout on the adapter input while training
//   lora_target_modules      none    PEFT's default for the architecture (q_proj, v_proj for
//                                    llama and qwen2); names, or all-linear
//   use_rslora               false
//   lora_modules_to_save     []      modules trained whole and saved in the adapter
//   trainable_token_indices  []      token ids whose embedding rows (and tied head rows) train
//   merge_adapter            false   also write the merged model (an HF folder)
// The lora_* options, use_rslora and trainable_token_indices need use_peft (an Error naming the
// option otherwise, rather than TRL's silent ignore).
//
// The trainer's side:
//   PeftSetup peft = apply_peft_options(o, *model, seed);    // after loading the model
//   optimizer over peft.trainable_parameters(*model) when peft.active(), else every parameter
//   save_peft(peft, *model, dir, model_name_or_path);        // checkpoints and the final output
//   load_peft_checkpoint(peft, *model, dir);                 // resume
//   merge_and_save(peft, *model, dir, dtype);                // --merge_adapter
//   peft.set_training(false) around evaluation and generation, true before training steps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "loaders/option_table.h"
#include "models/decoder.h"
#include "models/peft_io.h"
#include "models/quantize_model.h"

namespace leantune {

struct PeftArguments {
  bool use_peft = false;
  PeftConfig config;  // the lora_* options, use_rslora, trainable_token_indices
  bool merge_adapter = false;
};

// The lora_* options, use_rslora and trainable_token_indices.
const OptionTable<PeftConfig>& peft_config_table();
// use_peft, the config's options, merge_adapter.
const OptionTable<PeftArguments>& peft_table();
void add_peft_options(Options& o);
// peft_table().read; Error(kInput) naming a config option set without use_peft.
PeftArguments peft_arguments(const Options& o);
// An inactive setup (PeftSetup::active() false) when use_peft is off; else the base is frozen
// and the adapters attached (models/peft_io.h apply_peft).
PeftSetup apply_peft_options(const Options& o, DecoderModel& model, uint64_t seed);
// adapter_model.safetensors + adapter_config.json in dir.
void save_peft(const PeftSetup& setup, const DecoderModel& model, const std::string& dir,
               const std::string& base_model_name_or_path);
// Reloads adapter tensors saved by save_peft into the same setup (resume from a checkpoint).
void load_peft_checkpoint(const PeftSetup& setup, const DecoderModel& model,
                          const std::string& dir);
// A folder with adapter_config.json: the base model from its base_model_name_or_path (a
// relative path is tried against the adapter folder's parent first, then as given; an Error
// names the paths tried), the adapter attached and loaded, dropout off (set_training(true) to
// train on). Any other path: a plain model. `out` (may be null) receives the setup, inactive
// for a plain model.
std::shared_ptr<DecoderModel> load_model_or_adapter(const std::string& path, Device device,
                                                    DType dtype, PeftSetup* out, uint64_t seed = 0);
// The base path an adapter folder refers to, resolved as load_model_or_adapter does.
std::string resolve_base_model_path(const std::string& adapter_dir);
// Writes the merged model (adapters folded in) as an HF folder in disk_dtype.
void merge_and_save(const PeftSetup& setup, DecoderModel& model, const std::string& dir,
                    DType disk_dtype);
// A LoRA run's model in dir, as every trainer writes it: the adapter (save_peft), then
// extras(dir) (the trainer's tokenizer files); for the final output with merge_adapter also the
// merged model in dir/merged, in the model's dtype (f64 written as f32), and extras there.
void save_adapter_output(const PeftSetup& setup, DecoderModel& model, const std::string& dir,
                         bool final_output, const std::string& base_model_name_or_path,
                         bool merge_adapter, const std::function<void(const std::string&)>& extras);

// The memory report's savings of a quantized base ("quantized_base": kind, modules, dense and
// quantized bytes) and of adapters ("peft": trainable and total parameters, and the gradient and
// AdamW bytes the frozen ones do not need: per parameter its gradient in the compute dtype, two
// f32 moments, and an f32 master for 16-bit weights), added to `savings` where they apply.
void add_adapter_savings(nlohmann::json& savings, const DecoderModel& model, const PeftSetup& peft,
                         const QuantConfig& quant, const QuantizeReport& report);

}  // namespace leantune
