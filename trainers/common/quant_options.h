// Options for quantized base weights (QLoRA's load_in_4bit, and load_in_8bit), with the names
// of transformers' BitsAndBytesConfig, and their translation into a QuantConfig
// (models/quantize_model.h).
//   load_in_4bit               NF4 base weights (blocks of 64, bitsandbytes' format)
//   load_in_8bit               int8 base weights, one scale per output row
//   bnb_4bit_quant_type        "nf4" (the only type implemented; "fp4" and others are errors)
//   bnb_4bit_use_double_quant  quantize the NF4 block scales again (default true here;
//                              transformers' default is false, TRL's flag use_bnb_nested_quant)
//   bnb_4bit_compute_dtype     empty (the model's dtype) or a dtype name equal to it
//   llm_int8_skip_modules      modules kept dense (default: lm_head)
#pragma once

#include <string>
#include <vector>

#include "engine/dtype.h"
#include "loaders/option_table.h"
#include "models/quantize_model.h"

namespace leantune {

struct QuantArguments {
  bool load_in_4bit = false;
  bool load_in_8bit = false;
  std::string bnb_4bit_quant_type = "nf4";
  bool bnb_4bit_use_double_quant = true;
  std::string bnb_4bit_compute_dtype;  // empty: the model's dtype
  std::vector<std::string> llm_int8_skip_modules = {"lm_head"};
};

const OptionTable<QuantArguments>& quant_table();
void add_quant_options(Options& o);

// Reads the options above. model_dtype is the dtype the model computes in (bf16 with --bf16).
// Error(kInput) naming the option for: load_in_4bit together with load_in_8bit, a quant type
// other than nf4, an unknown dtype name, a compute dtype that differs from the model's (with
// load_in_4bit).
QuantConfig quant_config(const QuantArguments& q, DType model_dtype);
// quant_config(quant_table().read(o), model_dtype).
QuantConfig quant_config_from_options(const Options& o, DType model_dtype);

}  // namespace leantune
