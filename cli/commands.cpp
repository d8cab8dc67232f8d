// The table of trainer_bin's commands, in the order --help lists them: the training algorithms
// first (one per TrainerSpec, trainers/registry.cpp), then the tools.
#include "cli/commands.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>

#include "engine/check.h"
#include "trainers/common/trainer_spec.h"

namespace leantune {

namespace {

struct Command {
  std::string name;
  std::string summary;
  std::function<int(const std::vector<std::string>& args)> run;
};

const std::vector<Command>& commands() {
  static const std::vector<Command> table = [] {
    std::vector<Command> t;
    for (const TrainerSpec* spec : trainer_specs())
      t.push_back({spec->name, spec->summary, [spec](const std::vector<std::string>& a) {
                     return run_trainer_command(*spec, a);
                   }});
    const std::vector<Command> tools = {
        {"generate", "generate a completion from an HF model folder", cmd_generate},
        {"score",
         "the reward of every row of a JSONL dataset under a reward model (one JSON line each)",
         cmd_score},
        {"estimate",
         "predict the peak memory of a run before running it (sft, or: estimate <algorithm>)",
         cmd_estimate},
        {"init-model", "write a randomly initialised model as an HF folder", cmd_init_model},
        {"inspect", "validate and describe a safetensors file or model folder", cmd_inspect},
        {"tokenize", "encode text or a chat to token ids, or decode ids", cmd_tokenize},
        {"pack", "pack a JSONL dataset offline into max_length bins (TRL's BFD)", cmd_pack},
        {"lengths", "length distribution of a dataset and a recommended max_length", cmd_lengths},
        {"memviz", "draw a --memory_trace file as a self-contained HTML timeline", cmd_memviz},
        {"plot", "draw a run's metrics.jsonl (loss, learning rate, memory, ...) as an HTML page",
         cmd_plot},
        {"consolidate", "a data-parallel or ZeRO checkpoint as one process's (any world size)",
         cmd_consolidate},
    };
    t.insert(t.end(), tools.begin(), tools.end());
    return t;
  }();
  return table;
}

void print_usage() {
  std::printf("usage: trainer_bin <command> [options]\n\ncommands:\n");
  for (const Command& c : commands())
    std::printf("  %-12s %s\n", c.name.c_str(), c.summary.c_str());
  std::printf("\n'trainer_bin <command> --help' lists a command's options.\n");
}

}  // namespace

bool parse_tool_args(CLI::App& app, const std::vector<std::string>& args, const char* command) {
  try {
    std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 takes them reversed
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return false;
  } catch (const CLI::ParseError& e) {
    LT_THROW(ErrorKind::kInput, command, ": ", e.what(), " (run 'trainer_bin ", command,
             " --help')");
  }
  return true;
}

int run_command_line(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_usage();
    return args.empty() ? 2 : 0;
  }
  for (const Command& c : commands())
    if (c.name == args[0]) return c.run(std::vector<std::string>(args.begin() + 1, args.end()));
  LT_THROW(ErrorKind::kInput, "unknown command '", args[0], "' (run 'trainer_bin --help')");
}

}  // namespace leantune
