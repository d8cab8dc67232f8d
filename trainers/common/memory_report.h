// The end-of-run memory report as text (memory_report.cpp says what it holds).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace leantune {

// Formats Trainer::memory_report's JSON (TrainResult::memory) as the lines trainer_bin prints.
std::string format_memory_report(const nlohmann::json& report);

}  // namespace leantune
