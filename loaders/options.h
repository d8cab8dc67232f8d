// Command-line and JSON-config options with TRL's names.
//
// A command declares each option with its type, default and one line of meaning. Values come
// from defaults, then a config file (--config F: JSON or YAML, option -> value), then
// --flags, each overriding the previous. Flags are `--name value` or `--name=value`; a bool
// flag alone (`--packing`) means true. Option names are accepted with '-' or '_', and an option
// may have an alias (add_alias).
// Every problem is an Error of kind kInput naming the option: unknown option (with the closest
// known name), wrong type, value out of its allowed set, a flag without a value, a JSON key of
// the wrong type. help() lists every option with its default and meaning.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace leantune {

// Parses the text of a JSON config: a duplicate key in any object and nesting deeper than 64 levels
// are errors (kInput, naming source); raw_numbers (optional) receives the text of each top-level
// floating-point number as written.
nlohmann::json parse_config_json(std::string_view text, const std::string& source,
                                 std::map<std::string, std::string>* raw_numbers = nullptr);

class Options {
 public:
  enum class Type { kBool, kBoolOrNone, kInt, kFloat, kString, kIntOrNone, kStringList };

  explicit Options(std::string command) : command_(std::move(command)) {}

  Options& add_bool(const std::string& name, bool def, const std::string& help);
  // true, false or none (unset: the trainer decides, as TRL's Optional[bool] options).
  Options& add_bool_or_none(const std::string& name, std::optional<bool> def,
                            const std::string& help);
  Options& add_int(const std::string& name, int64_t def, const std::string& help,
                   int64_t min = INT64_MIN, int64_t max = INT64_MAX);
  // An integer or "none" (null in JSON); nullopt default means none.
  Options& add_int_or_none(const std::string& name, std::optional<int64_t> def,
                           const std::string& help, int64_t min = INT64_MIN);
  Options& add_float(const std::string& name, double def, const std::string& help,
                     double min = -1e300, double max = 1e300);
  // A float in [min, sup): sup itself is refused (an optimizer's betas, as torch checks them).
  Options& add_float_below(const std::string& name, double def, const std::string& help, double min,
                           double sup);
  // choices: allowed values (empty = any string).
  Options& add_string(const std::string& name, const std::string& def, const std::string& help,
                      std::vector<std::string> choices = {});
  // Comma-separated on the command line; in a config a JSON array of strings or integers (or
  // one string).
  Options& add_string_list(const std::string& name, std::vector<std::string> def,
                           const std::string& help);
  // Another name for a declared option (TRL's name and ours): either sets the same value, and
  // help lists the alias beside the option.
  Options& add_alias(const std::string& alias, const std::string& name);
  // Positional arguments (e.g. the PATH of inspect) are collected, in order.
  Options& allow_positional(const std::string& name, const std::string& help);

  // Parses args (argv without the command name). Returns false when --help was asked (the
  // caller prints help()). Throws Error(kInput) on any problem.
  bool parse(const std::vector<std::string>& args);
  // Applies a JSON object as if it were a config file. raw_numbers: the text of top-level
  // numbers as written, quoted in errors.
  void apply_json(const nlohmann::json& j, const std::string& source,
                  const std::map<std::string, std::string>& raw_numbers = {});
  // Parses a config file's text (parse_config_json) and applies it (used by parse for --config).
  void apply_config_text(std::string_view text, const std::string& source);

  bool get_bool(const std::string& name) const;
  std::optional<bool> get_bool_or_none(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  std::optional<int64_t> get_int_or_none(const std::string& name) const;
  double get_float(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;
  std::vector<std::string> get_string_list(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // True when the option was set by the user (config or flag), not left at its default.
  bool is_set(const std::string& name) const;
  // True when the command declared the option (or an alias of it).
  bool declared(const std::string& name) const;
  // Overrides a value programmatically (e.g. the embedded default run).
  void set(const std::string& name, const nlohmann::json& value);
  // Changes a declared option's default (a trainer whose TRL config has another default than
  // the shared declaration, e.g. DPOConfig's learning_rate); help shows the new one.
  void set_default(const std::string& name, const nlohmann::json& value);

  std::string help() const;
  // Every option and its final value, for logs and checkpoints.
  nlohmann::json to_json() const;
  const std::string& command() const { return command_; }

 private:
  struct Spec {
    std::string name;
    Type type;
    nlohmann::json def;
    std::string help;
    std::vector<std::string> choices;
    double min = -1e300, max = 1e300;
    bool max_open = false;  // max itself is out of range (add_float_below)
  };
  Spec& spec(const std::string& name);
  const Spec& spec(const std::string& name) const;
  void set_from_text(Spec& s, const std::string& text, const std::string& where);
  // as_written: the value as the user wrote it, quoted in errors (empty: v.dump()).
  void set_from_json(Spec& s, const nlohmann::json& v, const std::string& where,
                     const std::string& as_written = "");
  std::string canonical(const std::string& name) const;

  std::string command_;
  std::vector<Spec> specs_;
  std::map<std::string, nlohmann::json> values_;
  std::map<std::string, bool> user_set_;
  std::map<std::string, std::string> aliases_;  // alias -> option name
  std::string positional_name_;
  std::string positional_help_;
  std::vector<std::string> positional_;
};

}  // namespace leantune
