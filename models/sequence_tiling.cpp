// When and in which blocks the decoder layers are tiled (contract in models/sequence_tiling.h).
#include "models/sequence_tiling.h"

#include <algorithm>

#include "engine/check.h"
#include "engine/tiled.h"

namespace leantune {

TilingMode parse_tiling_mode(const std::string& value, const std::string& option) {
  if (value == "auto") return TilingMode::kAuto;
  if (value == "true") return TilingMode::kOn;
  if (value == "false") return TilingMode::kOff;
  LT_THROW(ErrorKind::kInput, "option ", option, " '", value, "': expected auto, true or false");
}

const char* tiling_mode_name(TilingMode m) {
  return m == TilingMode::kAuto ? "auto" : m == TilingMode::kOn ? "true" : "false";
}

int64_t default_tiling_chunk(const ModelConfig& m) {
  return tiled_chunk_rows(std::max<int64_t>(1024, m.hidden_size));
}

int64_t tiling_chunk_tokens(const SequenceTiling& t, const ModelConfig& m, int64_t tokens) {
  if (t.mode == TilingMode::kOff) return 0;
  if (t.mode == TilingMode::kAuto && tokens <= kTilingAutoMinTokens) return 0;
  const int64_t chunk =
      tiled_chunk_rows(t.chunk_tokens > 0 ? t.chunk_tokens : default_tiling_chunk(m));
  return tokens > chunk ? chunk : 0;
}

}  // namespace leantune
