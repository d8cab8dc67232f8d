// The chat templates compiled into the library (loaders/jinja/templates/*.jinja, embedded by
// loaders/jinja/templates/embed.cmake): the model templates --chat_template names ("chatml",
// "qwen2.5", "qwen3", "llama3", "llama3.1", "llama3.2", "gemma3") and their "<name>_training"
// variants with {% generation %} blocks that give the assistant mask for those families (qwen3,
// gemma3 and their variants are TRL 1.16's trl/chat_templates files, the Hub's templates).
#pragma once

#include <string>
#include <vector>

namespace leantune::jinja {

struct BundledTemplate {
  const char* name;
  const char* text;
};

const std::vector<BundledTemplate>& bundled_templates();

}  // namespace leantune::jinja
