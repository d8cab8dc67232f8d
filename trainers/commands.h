// Subcommand registry of trainer_bin. Each subcommand registers itself with a static
// CommandRegistration in its own file (trainers/cmd_*.cpp; sft's is api/cmd_sft.cpp, built on the
// public API), so adding one touches no list.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace leantune {

using CommandFn = std::function<int(const std::vector<std::string>& args)>;

struct CommandInfo {
  std::string name;
  std::string summary;
  CommandFn run;
};

class CommandRegistration {
 public:
  CommandRegistration(std::string name, std::string summary, CommandFn fn);
};

const std::vector<CommandInfo>& registered_commands();

// Dispatches argv[1] to its subcommand; prints usage for none/--help. Throws leantune::Error.
int run_command_line(int argc, char** argv);

}  // namespace leantune
