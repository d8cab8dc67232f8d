// Quantized frozen weights: NF4 (QLoRA's load_in_4bit, bit-exact with bitsandbytes) and
// row-wise int8 (load_in_8bit), their dequantization, and the linear products that use them.
//
// NF4 (bitsandbytes quantize_4bit(w, blocksize=64, quant_type="nf4"), operation for operation
// as its default torch kernel, the one its CPU backend runs; its CUDA kernel differs only on
// exact ties, a short last block (reciprocal instead of division) and all-zero blocks (code 0,
// which decodes to -0.0, instead of 7)):
//   - The weight (any shape, n elements) is flattened row-major into blocks of 64 elements;
//     when n % 64 != 0 the last block is shorter (nothing is padded).
//   - absmax[b] = max |w| over block b, in f32 (16-bit weights are widened first, f64 ones
//     rounded to f32).
//   - scaled = w * (1 / max(absmax, 1e-38)) in f32 for a full block. For a short last block bnb
//     divides instead, scaled = w / max(absmax, 1e-38), and stores the clamped absmax: an
//     all-zero short block keeps absmax 1e-38, an all-zero full block keeps 0. Reproduced as is.
//   - scaled is clamped to [-1, 1]; its code is the number of f32 midpoints
//     (code[i] + code[i+1]) / 2 below it (torch.bucketize: a tie takes the lower code).
//   - packed: u8 [(n + 1) / 2]; element 2j is the high nibble of byte j, element 2j+1 the low
//     one. For odd n the last low nibble is the code of 0.0 (7), as bnb pads.
//   - dequantized value = f32(kNf4Code[q] * absmax[b]), rounded once to the output dtype.
// Double quantization (bnb_4bit_use_double_quant; bnb's compress_statistics):
//   - offset = mean(absmax): the f64 mean rounded to f32. torch's f32 mean sums in an order
//     that depends on the CPU's vector width, and may differ in the last bit.
//   - absmax - offset (f32) is quantized with bitsandbytes' signed 8-bit dynamic map
//     (kDynamicMap, create_dynamic_map()) in blocks of 256, by the same rules as above with
//     256 codes: qabsmax u8 [blocks], absmax2 f32 [ceil(blocks / 256)] (clamped for a short last
//     block), bucketize on the f32 midpoints. This is bnb's default and CUDA kernel behaviour
//     (nearest code). bnb's native CPU library (quantize_blockwise on host tensors) searches
//     approximately and maps values near 0 to a neighbour (0.0 -> code 131); not reproduced.
//   - recovered absmax[b] = f32(f32(kDynamicMap[qabsmax[b]] * absmax2[b / 256]) + offset).
//   Storage: n/2 + blocks + 4 * ceil(blocks / 256) + 4 bytes (about 0.516 B/param) instead of
//   n/2 + 4 * blocks (0.5625 B/param).
//
// Int8 (load_in_8bit: LLM.int8()'s row-wise weight quantization, without the outlier
// decomposition of the activations; bitsandbytes Int8Params + int8_vectorwise_quant):
//   - The weight [out, in] is first rounded to f16, as Int8Params does (|w| > 65504 is an
//     error). absmax[r] = max |w_f16| over row r (bnb's SCB), f32.
//   - q = round_half_even(w_f16 * f32(f32(1 / absmax[r]) * 127)), i8 in [-127, 127] (bnb writes
//     127.0 / absmax, which torch evaluates as reciprocal(absmax) * 127); an all-zero row gives
//     q = 0 (and absmax 0).
//   - dequantized value = f32(q * f32(absmax[r] * f32(1/127))), i.e. scale = absmax / 127 as
//     bnb's MatMul8bitLt backward computes it, rounded once to the output dtype. Unlike
//     LLM.int8() inference, activations are not quantized: the products below are float GEMMs
//     with the dequantized weight.
//
// Linear products: y = x W^T + b and dx = dy W (db = column sums of dy) for the dequantized
// W [out, in], in x's dtype: W is dequantized (in x's dtype) into a per-device, per-stream
// scratch buffer from the caching allocator (MemTag::kWorkspace), grown to the largest weight
// seen and reused by every later call, then the dense kernels/linear path runs (OpenBLAS on the
// host, cuBLASLt on CUDA). The scratch never outlives the call logically: backward dequantizes
// again, so no dequantized weight is kept between forward and backward. Ops on the same stream
// are ordered, so reuse needs no synchronisation; a second stream gets its own buffer.
//
// Quantization runs on the host. A CUDA weight is copied to the host, quantized there and the
// result copied back (quantization happens once, at load time). Dequantization and the products
// run on the weight's device (CUDA kernels in quant.cu).
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace leantune::kernels {

inline constexpr int64_t kNf4BlockSize = 64;
inline constexpr int64_t kNestedBlockSize = 256;

// bitsandbytes' get_4bit_type("nf4") (sorted, 0.0 at index 7) and create_dynamic_map() (signed,
// index 0 = -0.99296875, 127 = 0, 255 = 1), exact f32 values.
extern const float kNf4Code[16];
extern const float kDynamicMap[256];

struct Nf4Weight {
  Shape shape;          // of the dense weight
  Tensor packed;        // u8 [(n + 1) / 2]
  Tensor absmax;        // f32 [blocks]; undefined when nested
  Tensor qabsmax;       // u8 [blocks]; defined when nested (double quantization)
  Tensor absmax2;       // f32 [ceil(blocks / 256)]; when nested
  float offset = 0.0f;  // when nested

  bool nested() const { return qabsmax.defined(); }
  int64_t numel() const { return shape_numel(shape); }
  int64_t num_blocks() const { return (numel() + kNf4BlockSize - 1) / kNf4BlockSize; }
  Device device() const { return packed.device(); }
  // Bytes of packed + absmax (or qabsmax + absmax2 + the offset).
  int64_t storage_bytes() const;
  // Copies every part to `device` with `tag`.
  Nf4Weight to(Device device, MemTag tag = MemTag::kParam) const;
};

struct Int8Weight {
  Tensor q;       // i8 [out, in]
  Tensor absmax;  // f32 [out] (bitsandbytes' SCB)

  int64_t rows() const { return q.size(0); }
  int64_t cols() const { return q.size(1); }
  Device device() const { return q.device(); }
  int64_t storage_bytes() const;
  Int8Weight to(Device device, MemTag tag = MemTag::kParam) const;
};

// Throws Error(kInternal) naming the part when sizes, dtypes or devices are inconsistent (a
// weight assembled from parts, e.g. read from a bitsandbytes checkpoint).
void check_nf4(const Nf4Weight& w, const char* op);
void check_int8(const Int8Weight& w, const char* op);

// ---- quantization (values on the host; see the contract above). Non-finite weights are an
// Error(kInput). Outputs live on w's device with `tag`.
Nf4Weight nf4_quantize(const Tensor& w, bool double_quant, MemTag tag = MemTag::kParam);
Int8Weight int8_quantize(const Tensor& w, MemTag tag = MemTag::kParam);

// The 8-bit dynamic blockwise quantization used for the nested absmax, exposed for tests:
// x f32 [n] host -> q u8 [n], absmax f32 [ceil(n / blocksize)].
void dynamic8_quantize(const Tensor& x, int64_t blocksize, const Tensor& q, const Tensor& absmax);
// out f32 [n] = f32(kDynamicMap[q] * absmax[i / blocksize]) (host).
void dynamic8_dequantize(const Tensor& q, const Tensor& absmax, int64_t blocksize,
                         const Tensor& out);

// ---- dequantization into a contiguous float tensor of w's numel on w's device.
// The per-block f32 absmax of an NF4 weight (recovered from the nested form when nested).
Tensor nf4_block_absmax(const Nf4Weight& w, MemTag tag = MemTag::kWorkspace);
void nf4_dequantize(const Nf4Weight& w, const Tensor& out);
Tensor nf4_dequantize(const Nf4Weight& w, DType dtype, MemTag tag = current_mem_tag());
void int8_dequantize(const Int8Weight& w, const Tensor& out);
Tensor int8_dequantize(const Int8Weight& w, DType dtype, MemTag tag = current_mem_tag());

// ---- linear products with the dequantized weight W [out, in] (w.shape must be 2-D).
// x:[T, in] float, b:[out] (x's dtype) or undefined, y:[T, out] preallocated in x's dtype.
void nf4_linear_fwd(const Tensor& x, const Nf4Weight& w, const Tensor& b, const Tensor& y);
void int8_linear_fwd(const Tensor& x, const Int8Weight& w, const Tensor& b, const Tensor& y);
// dx:[T, in] = dy W and db:[out] = column sums of dy; either may be undefined; overwritten.
void nf4_linear_bwd(const Tensor& dy, const Nf4Weight& w, const Tensor& dx, const Tensor& db);
void int8_linear_bwd(const Tensor& dy, const Int8Weight& w, const Tensor& dx, const Tensor& db);

// The dequantization scratch held for `device` (all streams), and its release (the next
// product allocates it again).
int64_t quant_workspace_bytes(Device device);
void release_quant_workspace(Device device);

// ---- CUDA implementations (quant.cu), called by the dispatchers above. Operands contiguous,
// on one device; `out` float, n elements.
void nf4_block_absmax_cuda(const Tensor& qabsmax, const Tensor& absmax2, float offset,
                           const Tensor& out);
void nf4_dequantize_cuda(const Tensor& packed, const Tensor& absmax, int64_t n, const Tensor& out);
void int8_dequantize_cuda(const Tensor& q, const Tensor& absmax, const Tensor& out);

}  // namespace leantune::kernels
