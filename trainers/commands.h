// Subcommand registry of trainer_bin. Each subcommand lives in its own file under trainers/
// and registers itself with a static Registration, so adding one touches nothing else.
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
