// Where leantune's messages go: stderr by default, or a sink the embedder sets (the public API's
// set_log_sink), with a minimum level below which messages are dropped.
//
// Every line the library writes for a person (progress lines, warnings, notes) passes through
// log_message(); the command line's results on stdout do not. Setting the sink is meant for the
// start of a program: the sink is swapped under a mutex and called with it held, so a sink must
// not log itself, and messages from several threads reach it one at a time.
#pragma once

#include <functional>
#include <string>

namespace leantune {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
const char* log_level_name(LogLevel level);

// (level, one message without its line terminator).
using LogSink = std::function<void(LogLevel, const std::string&)>;

// An empty sink restores stderr. Messages below min_level are dropped, for either destination.
void set_log_sink(LogSink sink, LogLevel min_level = LogLevel::kInfo);
// Whether a sink other than stderr is set (the progress bar draws on a terminal only without).
bool log_sink_set();
// Whether a message at `level` would be delivered.
bool log_enabled(LogLevel level);
// Delivers one message (stderr: the text and a newline, flushed).
void log_message(LogLevel level, const std::string& text);

}  // namespace leantune
