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
#include "cli/tool_options.h"
#include "loaders/option_table.h"
#include "loaders/tokenizer.h"
#include "models/decoder.h"
#include "trainers/common/model_io.h"
#include "trainers/common/output_path.h"

namespace leantune {
namespace {

struct InitModelArguments : OverwriteArguments {
  std::string model_config;
  std::string out;
  int64_t seed = 0;
  std::string tokenizer;
  std::string dtype;  // empty: the config's torch_dtype
};

const OptionTable<InitModelArguments>& init_model_table() {
  using I = InitModelArguments;
  static const OptionTable<I> t =
      OptionTable<I>()
          .text("model_config", &I::model_config,
                "the model's config.json (Llama, Qwen2, Qwen3, Mistral, Phi-3 or Gemma 3 text)")
          .text("out", &I::out, "output folder (created; must not exist or be empty)")
          .base(overwrite_table())
          .integer("seed", &I::seed, "random seed of the initialisation", 0)
          .text("tokenizer", &I::tokenizer,
                "folder whose tokenizer files are copied into the output")
          .text("dtype", &I::dtype, "dtype written to disk (default: the config's torch_dtype)",
                {"", "float32", "bfloat16", "float16"});
  return t;
}

int run_init_model(const std::vector<std::string>& args) {
  Options o("init-model");
  init_model_table().declare(o);
  // `--config` is the name the issue and users use for the model config here; Options reserves
  // --config for option files, so translate it.
  std::vector<std::string> argv = args;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--config")
      argv[i] = "--model_config";
    else if (argv[i].rfind("--config=", 0) == 0)
      argv[i] = "--model_config=" + argv[i].substr(9);
  }
  if (!o.parse(argv)) {
    std::printf("%s", o.help().c_str());
    return 0;
  }
  const InitModelArguments a = init_model_table().read(o);
  LT_CHECK_INPUT(!a.model_config.empty(), "init-model: --config config.json is required");
  LT_CHECK_INPUT(!a.out.empty(), "init-model: --out DIR is required");
  const std::vector<CommandInput> inputs = {{a.model_config, "--config"},
                                            {a.tokenizer, "--tokenizer"}};
  check_output_folder(a.out, "out", a.overwrite, inputs);
  ModelConfig cfg = ModelConfig::load(a.model_config);
  if (!a.tokenizer.empty()) Tokenizer::load(a.tokenizer);
  DType disk = cfg.torch_dtype;
  if (!a.dtype.empty()) dtype_from_string(a.dtype, &disk);
  DecoderModel model(cfg, Device::cpu(), DType::kF32);
  model.init_random(static_cast<uint64_t>(a.seed));
  OutputFolder folder(a.out, "out", a.overwrite, inputs);
  model.save(folder.dir(), disk);
  if (!a.tokenizer.empty()) copy_tokenizer_files(a.tokenizer, folder.dir());
  folder.commit();
  std::printf("wrote %s: %s, %lld parameters, %s\n", a.out.c_str(), cfg.architecture.c_str(),
              static_cast<long long>(model.num_parameters()), dtype_name(disk));
  return 0;
}

}  // namespace

int cmd_init_model(const std::vector<std::string>& args) { return run_init_model(args); }

}  // namespace leantune
