// The quantized-base options and their QuantConfig (see quant_options.h).
#include "trainers/common/quant_options.h"

#include <string>

#include "engine/check.h"

namespace leantune {

const OptionTable<QuantArguments>& quant_table() {
  using Q = QuantArguments;
  static const OptionTable<Q> t =
      OptionTable<Q>()
          .flag("load_in_4bit", &Q::load_in_4bit,
                "freeze the base weights in NF4 (QLoRA; bitsandbytes' format, blocks of 64)")
          .flag("load_in_8bit", &Q::load_in_8bit,
                "freeze the base weights in int8 with one scale per row (LLM.int8() weights)")
          .text("bnb_4bit_quant_type", &Q::bnb_4bit_quant_type,
                "4-bit data type (only nf4 is implemented)")
          .flag("bnb_4bit_use_double_quant", &Q::bnb_4bit_use_double_quant,
                "quantize the NF4 block scales again (8 bits, blocks of 256): ~0.06 B/param less")
          .text("bnb_4bit_compute_dtype", &Q::bnb_4bit_compute_dtype,
                "dtype of the quantized layers' products (empty: the model's dtype, which it "
                "must equal)")
          .list("llm_int8_skip_modules", &Q::llm_int8_skip_modules,
                "modules kept in full precision (names or dotted name parts)");
  return t;
}

void add_quant_options(Options& o) { quant_table().declare(o); }

QuantConfig quant_config_from_options(const Options& o, DType model_dtype) {
  return quant_config(quant_table().read(o), model_dtype);
}

QuantConfig quant_config(const QuantArguments& q, DType model_dtype) {
  QuantConfig cfg;
  cfg.load_in_4bit = q.load_in_4bit;
  cfg.load_in_8bit = q.load_in_8bit;
  cfg.double_quant = q.bnb_4bit_use_double_quant;
  cfg.skip_modules = q.llm_int8_skip_modules;
  check_quant_config(cfg);
  const std::string& type = q.bnb_4bit_quant_type;
  LT_CHECK_INPUT(type == "nf4", "bnb_4bit_quant_type '", type,
                 "' is not supported: leantune implements only nf4");
  cfg.compute_dtype = model_dtype;
  const std::string& cd = q.bnb_4bit_compute_dtype;
  if (!cd.empty()) {
    DType dt;
    LT_CHECK_INPUT(dtype_from_string(cd, &dt) && dtype_is_floating(dt), "bnb_4bit_compute_dtype '",
                   cd, "' is not a float dtype (float32, bfloat16, float16)");
    LT_CHECK_INPUT(!cfg.load_in_4bit || dt == model_dtype, "bnb_4bit_compute_dtype '", cd,
                   "' differs from the model's dtype ", dtype_name(model_dtype),
                   " (--bf16 selects bf16): leantune computes the quantized layers in the "
                   "model's dtype");
  }
  return cfg;
}

}  // namespace leantune
