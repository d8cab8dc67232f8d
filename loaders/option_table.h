// One declaration per option: a table binds each option's name, help and range to the field of a
// typed struct that receives it, so the parser, the JSON config reader and the --help text
// (Options) and the struct a trainer reads are generated from the same line.
//
//   struct PeftArguments { bool use_peft = false; int64_t lora_r = 16; ... };
//   const OptionTable<PeftArguments>& peft_table() {
//     static const OptionTable<PeftArguments> t = OptionTable<PeftArguments>()
//         .flag("use_peft", &PeftArguments::use_peft, "train LoRA adapters")
//         .integer("lora_r", &PeftArguments::lora_r, "LoRA rank", 1);
//     return t;
//   }
//   peft_table().declare(o);                    // the options, defaults from PeftArguments{}
//   PeftArguments a = peft_table().read(o);     // after o.parse(...)
//
// The type of an option follows its field: bool -> a flag, std::optional<bool> -> true/false/none,
// any other arithmetic type -> an integer (`integer`) or a number (`real`), std::string -> a
// string (with allowed values), std::vector<std::string> -> a comma list, std::optional<integer>
// -> an integer or none. A field whose value needs a conversion (an enum, a list of token ids)
// uses `choice` or `custom`; a member struct or a base class with a table of its own uses
// `nested` or `base`.
// Defaults come from the struct's default member values (or the table's `defaults` object); a
// trainer whose TRL config has another default changes it with Options::set_default after
// declare. Every option keeps the errors and help of Options (loaders/options.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/check.h"
#include "loaders/options.h"

namespace leantune {

template <class S>
class OptionTable {
 public:
  OptionTable() = default;
  explicit OptionTable(S defaults) : defaults_(std::move(defaults)) {}

  OptionTable& flag(const char* name, bool S::*f, std::string help) {
    return entry(
        name, [=](Options& o, const S& d) { o.add_bool(name, d.*f, help); },
        [=](const Options& o, S& s) { s.*f = o.get_bool(name); });
  }
  // true, false or none (the trainer decides).
  OptionTable& flag_or_none(const char* name, std::optional<bool> S::*f, std::string help) {
    return entry(
        name, [=](Options& o, const S& d) { o.add_bool_or_none(name, d.*f, help); },
        [=](const Options& o, S& s) { s.*f = o.get_bool_or_none(name); });
  }
  template <class N>
  requires std::is_arithmetic_v<N> OptionTable& integer(const char* name, N S::*f, std::string help,
                                                        int64_t min = INT64_MIN,
                                                        int64_t max = INT64_MAX) {
    return entry(
        name,
        [=](Options& o, const S& d) {
          o.add_int(name, static_cast<int64_t>(d.*f), help, min, max);
        },
        [=](const Options& o, S& s) { s.*f = static_cast<N>(o.get_int(name)); });
  }
  // An integer or none; std::nullopt in the field is none.
  template <class N>
  requires std::is_integral_v<N> OptionTable& integer_or_none(const char* name,
                                                              std::optional<N> S::*f,
                                                              std::string help,
                                                              int64_t min = INT64_MIN) {
    return entry(
        name,
        [=](Options& o, const S& d) {
          std::optional<int64_t> def;
          if (d.*f) def = static_cast<int64_t>(*(d.*f));
          o.add_int_or_none(name, def, help, min);
        },
        [=](const Options& o, S& s) {
          const std::optional<int64_t> v = o.get_int_or_none(name);
          s.*f = v ? std::optional<N>(static_cast<N>(*v)) : std::nullopt;
        });
  }
  OptionTable& real(const char* name, double S::*f, std::string help, double min = -1e300,
                    double max = 1e300) {
    return entry(
        name, [=](Options& o, const S& d) { o.add_float(name, d.*f, help, min, max); },
        [=](const Options& o, S& s) { s.*f = o.get_float(name); });
  }
  // A number in [min, sup): sup itself is refused.
  OptionTable& real_below(const char* name, double S::*f, std::string help, double min,
                          double sup) {
    return entry(
        name, [=](Options& o, const S& d) { o.add_float_below(name, d.*f, help, min, sup); },
        [=](const Options& o, S& s) { s.*f = o.get_float(name); });
  }
  // choices: the allowed values (empty: any string).
  OptionTable& text(const char* name, std::string S::*f, std::string help,
                    std::vector<std::string> choices = {}) {
    return entry(
        name, [=](Options& o, const S& d) { o.add_string(name, d.*f, help, choices); },
        [=](const Options& o, S& s) { s.*f = o.get_string(name); });
  }
  OptionTable& list(const char* name, std::vector<std::string> S::*f, std::string help) {
    return entry(
        name, [=](Options& o, const S& d) { o.add_string_list(name, d.*f, help); },
        [=](const Options& o, S& s) { s.*f = o.get_string_list(name); });
  }
  // A string option whose values name the values of an enum (or any comparable type).
  template <class E>
  OptionTable& choice(const char* name, E S::*f, std::string help,
                      std::vector<std::pair<std::string, E>> names) {
    std::vector<std::string> choices;
    for (const auto& n : names) choices.push_back(n.first);
    return entry(
        name,
        [=](Options& o, const S& d) {
          std::string def;
          for (const auto& n : names)
            if (n.second == d.*f) def = n.first;
          LT_CHECK(!def.empty(), "option ", name, ": its default has no name");
          o.add_string(name, def, help, choices);
        },
        [=](const Options& o, S& s) {
          const std::string& v = o.get_string(name);
          for (const auto& n : names)
            if (n.first == v) s.*f = n.second;
        });
  }
  // Any other option: declare it (with the defaults object) and read it into the struct.
  // name: the option's name when it declares one (listed by names()), else empty.
  OptionTable& custom(std::function<void(Options&, const S&)> declare,
                      std::function<void(const Options&, S&)> read, std::string name = "") {
    entries_.push_back({std::move(name), std::move(declare), std::move(read)});
    return *this;
  }
  // The options of a member struct, declared and read by its own table (its defaults are this
  // table's defaults' member).
  template <class M>
  OptionTable& nested(M S::*f, const OptionTable<M>& t) {
    return custom([f, &t](Options& o, const S& d) { t.declare(o, d.*f); },
                  [f, &t](const Options& o, S& s) { t.read_into(o, s.*f); });
  }
  // Another table of the same struct, its options declared here (in this order).
  OptionTable& include(const OptionTable<S>& t) {
    return custom([&t](Options& o, const S& d) { t.declare(o, d); },
                  [&t](const Options& o, S& s) { t.read_into(o, s); });
  }
  // The options of a base class, declared and read by the base's table.
  template <class B>
  requires std::is_base_of_v<B, S> OptionTable& base(const OptionTable<B>& t) {
    return custom([&t](Options& o, const S& d) { t.declare(o, static_cast<const B&>(d)); },
                  [&t](const Options& o, S& s) { t.read_into(o, static_cast<B&>(s)); });
  }
  // Declares another group's options at this point of the order (--help lists them here); that
  // group's own table reads them.
  OptionTable& also(std::function<void(Options&)> declare) {
    return custom([declare](Options& o, const S&) { declare(o); }, [](const Options&, S&) {});
  }
  // An alias (TRL's other name) of an option declared before it.
  OptionTable& alias(const char* alias_name, const char* name) {
    return custom([=](Options& o, const S&) { o.add_alias(alias_name, name); },
                  [](const Options&, S&) {});
  }

  void declare(Options& o) const { declare(o, defaults_); }
  // A command's options: this table's, declared in a fresh Options named `command`.
  Options options(const std::string& command) const {
    Options o(command);
    declare(o);
    return o;
  }
  void declare(Options& o, const S& defaults) const {
    for (const Entry& e : entries_) e.declare(o, defaults);
  }
  void read_into(const Options& o, S& s) const {
    for (const Entry& e : entries_) e.read(o, s);
  }
  S read(const Options& o) const {
    S s = defaults_;
    read_into(o, s);
    return s;
  }
  const S& defaults() const { return defaults_; }
  // The names of the options the table declares (nested tables and aliases not included).
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const Entry& e : entries_)
      if (!e.name.empty()) out.push_back(e.name);
    return out;
  }

 private:
  struct Entry {
    std::string name;
    std::function<void(Options&, const S&)> declare;
    std::function<void(const Options&, S&)> read;
  };
  OptionTable& entry(const char* name, std::function<void(Options&, const S&)> declare,
                     std::function<void(const Options&, S&)> read) {
    return custom(std::move(declare), std::move(read), name);
  }

  S defaults_{};
  std::vector<Entry> entries_;
};

}  // namespace leantune
