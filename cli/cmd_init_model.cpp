// trainer_bin init-model --config config.json --out DIR [--seed N] [--tokenizer DIR] [--dtype D]
// Writes a randomly initialised model as a Hugging Face folder: config.json and
// model.safetensors (normal init with std = initializer_range, norms set to one (zero for
// Gemma's (1 + w) norms), biases zero), for every architecture ModelConfig reads,
// plus the tokenizer files copied from --tokenizer. Every input is read and validated first
// (the config, the tokenizer); the folder is written whole or not at all (output_path.h
// OutputFolder), and an existing non-empty one (a trained model, say) is replaced only with
// --overwrite.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "loaders/options.h"
#include "loaders/tokenizer.h"
#include "models/decoder.h"
#include "trainers/common/model_io.h"
#include "trainers/common/output_path.h"

namespace leantune {
namespace {

int run_init_model(const std::vector<std::string>& args) {
  Options o("init-model");
  o.add_string("model_config", "",
               "the model's config.json (Llama, Qwen2, Qwen3, Mistral, Phi-3 or Gemma 3 text)");
  o.add_string("out", "", "output folder (created; must not exist or be empty)");
  add_overwrite_option(o);
  o.add_int("seed", 0, "random seed of the initialisation", 0);
  o.add_string("tokenizer", "", "folder whose tokenizer files are copied into the output");
  o.add_string("dtype", "", "dtype written to disk (default: the config's torch_dtype)",
               {"", "float32", "bfloat16", "float16"});
  // `--config` is the name the issue and users use for the model config here; Options reserves
  // --config for option files, so translate it.
  std::vector<std::string> a = args;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == "--config")
      a[i] = "--model_config";
    else if (a[i].rfind("--config=", 0) == 0)
      a[i] = "--model_config=" + a[i].substr(9);
  }
  if (!o.parse(a)) {
    std::printf("%s", o.help().c_str());
    return 0;
  }
  LT_CHECK_INPUT(!o.get_string("model_config").empty(),
                 "init-model: --config config.json is required");
  LT_CHECK_INPUT(!o.get_string("out").empty(), "init-model: --out DIR is required");
  const std::string out = o.get_string("out"), tokenizer = o.get_string("tokenizer");
  const std::vector<CommandInput> inputs = {{o.get_string("model_config"), "--config"},
                                            {tokenizer, "--tokenizer"}};
  check_output_folder(out, "out", o.get_bool("overwrite"), inputs);
  ModelConfig cfg = ModelConfig::load(o.get_string("model_config"));
  if (!tokenizer.empty()) Tokenizer::load(tokenizer);
  DType disk = cfg.torch_dtype;
  if (!o.get_string("dtype").empty()) dtype_from_string(o.get_string("dtype"), &disk);
  DecoderModel model(cfg, Device::cpu(), DType::kF32);
  model.init_random(static_cast<uint64_t>(o.get_int("seed")));
  OutputFolder folder(out, "out", o.get_bool("overwrite"), inputs);
  model.save(folder.dir(), disk);
  if (!tokenizer.empty()) copy_tokenizer_files(tokenizer, folder.dir());
  folder.commit();
  std::printf("wrote %s: %s, %lld parameters, %s\n", out.c_str(), cfg.architecture.c_str(),
              static_cast<long long>(model.num_parameters()), dtype_name(disk));
  return 0;
}

}  // namespace

int cmd_init_model(const std::vector<std::string>& args) { return run_init_model(args); }

}  // namespace leantune
