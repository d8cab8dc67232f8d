// Tile shapes and shared-memory sizes of the tensor-core attention kernels
// (kernels/attention.cu), as plain constexpr so that host code can read them: the launchers
// choose a variant by the device's opt-in shared memory, and
// tests/kernels/test_kernel_resources.cpp checks every compiled kernel against its architecture's
// limit.
#pragma once

namespace leantune::kernels::attention_tiles {

// Shared tiles hold rows of 16-bit values padded by 16 bytes: the 8 row addresses of one
// ldmatrix (or 8 rows of 4-byte stores) then fall in 8 different 4-bank groups, so accesses are
// conflict-free, and every address is a per-lane offset plus a compile-time one.
constexpr int padded_row_bytes(int elems) { return elems * 2 + 16; }

// Each warp owns kMT = 2 m16 row tiles (32 query rows): with K/V fragments shared by both, the
// shared-memory traffic per MMA is half that of 16-row warps. kBc is 32 at D=128 so that O
// (128 f32), S (32) and the fragments fit in 255 registers without spilling (ptxas: 251).
template <int D>
struct FwdCfg {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBr = 128;                  // queries per CTA
  static constexpr int kBc = D >= 128 ? 32 : 64;   // keys per step
  static constexpr int kMT = kBr / (16 * kWarps);  // m16 tiles per warp
  static constexpr int kNT = kBc / 8;              // n8 tiles of S
  static constexpr int kDT = D / 8;                // n8 tiles of O
  static constexpr int kRowBytes = padded_row_bytes(D);
  static constexpr int kQBytes = kBr * kRowBytes;
  static constexpr int kKVBytes = kBc * kRowBytes;
  static constexpr int kSmem = kQBytes + 4 * kKVBytes;
  static_assert(D % 16 == 0 && kBc % 16 == 0 && kBr % (16 * kWarps) == 0, "tile shapes");
};

// kWarps warps of 16 keys each: 8 (kBc = 128) by default; 4 (kBc = 64, 73.5 KiB at D=128) where
// the 112.5 KiB of the 8-warp D=128 tile exceed the device's opt-in shared memory (sm_86/sm_89:
// 99 KiB).
template <int D, int W = 8>
struct BwdCfg {
  static constexpr int kWarps = W;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBc = 16 * kWarps;  // keys per CTA (16 per warp)
  // Queries per step: 32 at D=128 keeps dK, dV (128 f32), S^T and dP^T within 255 registers.
  static constexpr int kBr = D >= 128 ? 32 : 64;
  static constexpr int kNT = kBr / 8;  // n8 tiles of S^T per warp
  static constexpr int kDT = D / 8;    // n8 tiles of dK, dV per warp
  static constexpr int kRowBytes = padded_row_bytes(D);
  static constexpr int kKBytes = kBc * kRowBytes;
  static constexpr int kQBytes = kBr * kRowBytes;
  static constexpr int kDsRowBytes = padded_row_bytes(kBr);
  static constexpr int kDsBytes = kBc * kDsRowBytes;  // dS^T [kBc][kBr]
  // dQ = dS K over the CTA: warps tile the kBr x D block as kBr/16 row groups x the rest in
  // column groups (D=128: 2 x 4 with 8 warps, 2 x 2 with 4).
  static constexpr int kDqRowGroups = kBr / 16;
  static constexpr int kDqColGroups = kWarps / kDqRowGroups;
  static constexpr int kDqCols = D / kDqColGroups;
  static constexpr int kDqNT = kDqCols / 8;
  // K, V, Q[2], dO[2], dS^T, lse2[2], Dsum[2].
  static constexpr int kSmem = 2 * kKBytes + 4 * kQBytes + kDsBytes + 4 * kBr * 4;
  static_assert(kDqRowGroups * kDqColGroups == kWarps && kDqCols % 16 == 0, "dQ warp tiling");
};

}  // namespace leantune::kernels::attention_tiles
