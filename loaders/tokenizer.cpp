// Placeholder until the BPE implementation lands: every entry point throws.
#include "loaders/tokenizer.h"

#include "engine/check.h"
#include "loaders/chat_template.h"

namespace leantune {

struct Tokenizer::Impl {};

std::shared_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  LT_THROW(ErrorKind::kInternal, "Tokenizer::load(", path, "): not implemented yet");
}
std::shared_ptr<Tokenizer> Tokenizer::from_json(std::string_view, std::string_view,
                                                std::string_view, const std::string& source) {
  LT_THROW(ErrorKind::kInternal, "Tokenizer::from_json(", source, "): not implemented yet");
}
Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

}  // namespace leantune
