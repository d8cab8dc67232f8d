// trainer_bin's commands: the training algorithms from their specs (trainers/registry.cpp), run
// by one driver (cli/cmd_train.cpp), then the tools, one function each (cli/cmd_<name>.cpp),
// listed once in commands.cpp's table.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace leantune {

struct TrainerSpec;

// Each runs one command on its arguments (argv after the command's name) and returns the exit
// code; errors are leantune::Error, reported by cli/main.cpp.
// An algorithm's command (its TrainerSpec).
int run_trainer_command(const TrainerSpec& spec, const std::vector<std::string>& args);
int cmd_generate(const std::vector<std::string>& args);
int cmd_score(const std::vector<std::string>& args);
int cmd_estimate(const std::vector<std::string>& args);
int cmd_init_model(const std::vector<std::string>& args);
int cmd_inspect(const std::vector<std::string>& args);
int cmd_tokenize(const std::vector<std::string>& args);
int cmd_pack(const std::vector<std::string>& args);
int cmd_lengths(const std::vector<std::string>& args);
int cmd_memviz(const std::vector<std::string>& args);
int cmd_plot(const std::vector<std::string>& args);
int cmd_consolidate(const std::vector<std::string>& args);

// Parses a tool's CLI11 command line (args in order; `command` names it in errors): false when
// --help was printed, Error kInput (one line naming the command) for a bad one.
bool parse_tool_args(CLI::App& app, const std::vector<std::string>& args, const char* command);

// Dispatches argv[1] to its command; prints the list of commands for none/--help. Throws
// leantune::Error.
int run_command_line(int argc, char** argv);

}  // namespace leantune
