// Sequence tiling of the decoder layers (--tiled_mlp, --tiled_mlp_chunk_size): the row-wise parts
// of each layer run in blocks of rows (engine/tiled.h), so that in forward, in a checkpointed
// layer's recompute and in backward no buffer of the layer is larger than the unavoidable
// [tokens, hidden]-sized ones (the layer's input and output, attention's q/k/v and output, their
// gradients). Two regions per layer (models/decoder_layer.cpp):
//   before attention: norm -> q/k/v projections (+ q/k norms) -> rope       (h -> q, k, v)
//   after attention:  o_proj -> residual add -> norm -> gate/up -> activation -> down ->
//                     residual add (with the sandwich norms where the family has them)
//                                                                        (attn, h -> output)
// Attention itself is flash-style (O(tokens) memory) and the loss is chunked already.
//
// The chunk: --tiled_mlp_chunk_size, or by default hidden_size rows (at least 1,024): the memory
// budget of a block is one MLP weight, i.e. each [chunk x intermediate] tensor of the MLP is no
// larger than an [intermediate x hidden] weight (ALST's rule), whatever the sequence length.
// auto tiles forwards over more than kTilingAutoMinTokens tokens; true tiles every forward longer
// than one chunk; false never tiles.
#pragma once

#include <cstdint>
#include <string>

#include "loaders/model_config.h"

namespace leantune {

enum class TilingMode { kAuto, kOn, kOff };

struct SequenceTiling {
  TilingMode mode = TilingMode::kOff;
  int64_t chunk_tokens = 0;  // 0: the default chunk
};

// Tokens of one forward (per rank) from which --tiled_mlp auto tiles.
constexpr int64_t kTilingAutoMinTokens = 8192;

// "auto", "true" or "false" (Error(kInput) naming `option` otherwise).
TilingMode parse_tiling_mode(const std::string& value, const std::string& option);
const char* tiling_mode_name(TilingMode m);

// The chunk the layers use without --tiled_mlp_chunk_size.
int64_t default_tiling_chunk(const ModelConfig& m);
// Rows per block of a forward over `tokens` rows; 0 = the layers run untiled.
int64_t tiling_chunk_tokens(const SequenceTiling& t, const ModelConfig& m, int64_t tokens);

}  // namespace leantune
