// The subcommand registry and trainer_bin's dispatch (see commands.h).
#include "trainers/commands.h"

#include <algorithm>
#include <cstdio>

#include "engine/check.h"

namespace leantune {

namespace {
std::vector<CommandInfo>& registry() {
  static std::vector<CommandInfo> r;
  return r;
}

void print_usage() {
  std::printf("usage: trainer_bin <command> [options]\n\ncommands:\n");
  auto cmds = registry();
  std::sort(cmds.begin(), cmds.end(),
            [](const CommandInfo& a, const CommandInfo& b) { return a.name < b.name; });
  for (const auto& c : cmds) std::printf("  %-12s %s\n", c.name.c_str(), c.summary.c_str());
  std::printf("\n'trainer_bin <command> --help' lists a command's options.\n");
}
}  // namespace

CommandRegistration::CommandRegistration(std::string name, std::string summary, CommandFn fn) {
  registry().push_back({std::move(name), std::move(summary), std::move(fn)});
}

const std::vector<CommandInfo>& registered_commands() { return registry(); }

int run_command_line(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_usage();
    return args.empty() ? 2 : 0;
  }
  for (const auto& c : registry()) {
    if (c.name == args[0]) return c.run(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  LT_THROW(ErrorKind::kInput, "unknown command '", args[0], "' (run 'trainer_bin --help')");
}

}  // namespace leantune
