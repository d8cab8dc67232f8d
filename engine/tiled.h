// Sequence tiling: a region of a model whose rows are independent (norms, projections, rope,
// the MLP and the residual adds of a decoder layer: row t of every output depends only on row t
// of every input and on the parameters), computed in blocks of rows so that its intermediates
// never exist for the whole sequence (ALST's and Unsloth's tiled MLP, for any such region).
//
//   outs = tiled_rows(fn, inputs, chunk_rows)
//
// Forward: fn runs on rows [r, r + chunk) of every input and its outputs are copied into whole
// outputs [T, ...]; nothing inside fn is kept. Backward (one node): for each block fn runs again
// with grad on that block's rows, and backward runs from the block's outputs with the matching
// rows of the output gradients; the input gradients fill their rows of whole [T, ...] buffers,
// and the gradients of the parameters fn reads (the leaves it reaches: weights, LoRA adapters,
// norm weights) are summed over the blocks (engine/autograd.h LeafGradCapture: in f32 for 16-bit
// parameters) and handed on once, as one gradient per parameter: an optimizer in backward or a
// gradient reducer sees each parameter's gradient complete, once.
//
// Contract for fn: every input has T rows (dim 0) and every output has as many rows as its
// inputs; the parameters it uses are leaves (a tensor with autograd history from outside fn is an
// error). Random draws inside fn (LoRA dropout) take, per block, the untiled draw's part for its
// rows (engine/rng.h RowTileDraws), and are replayed in backward, so masks equal the untiled
// region's. chunk_rows is rounded up to a multiple of 4 (whole Philox blocks); a region of at most
// one block runs fn once, untiled.
//
// Values: the outputs and the input gradients are those of the untiled region computed by the
// same kernels on fewer rows (bit-identical when the kernels' per-row results do not depend on
// the row count, as leantune's CPU kernels' do); a parameter gradient is a sum over the blocks of
// the blocks' sums, the untiled sum in another order (f32: within a few ulp). Saved for backward:
// the inputs only (through the active hooks: activation offloading moves them as any saved
// tensor); inside a block, saved tensors stay in place (keep_in_place_hooks).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/autograd.h"

namespace leantune {

std::vector<Tensor> tiled_rows(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               int64_t chunk_rows);

// The chunk tiled_rows uses for a requested one (a multiple of 4, at least 4).
int64_t tiled_chunk_rows(int64_t requested);

}  // namespace leantune
