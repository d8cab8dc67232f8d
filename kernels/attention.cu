// attention on CUDA: causal (bottom-right), grouped-query, variable-length scaled dot-product
// attention, forward and backward (kernels/attention.h holds the contract).
// This file checks operands, chooses the implementation and holds the small pre/postprocess and
// fill kernels; the kernels proper live in attention_mma_fwd.cu, attention_mma_bwd.cu and
// attention_simple.cu (shared declarations: attention_common.cuh, attention_mma.cuh; tile sizes:
// attention_tiles.h).
//   q:[Tq,Hq,D], k/v:[Tk,Hk,D] (rows may be strided: heads and head_dim dense), one float dtype;
//   cu_seqlens_q/k:[B+1] i32|i64 on the host or the device -> out:[Tq,Hq,D] contiguous,
//   lse:[Hq,Tq] f32 (f64 for f64). Query i of a sequence (Lq queries, Lk keys) sees keys
//   j <= i + Lk - Lq when causal, and with a sliding window only j > i + Lk - Lq - window; a row
//   that sees no key gets out = 0, lse = -inf, zero grads. Score soft-capping (softcap > 0) runs
//   in the simple kernels only (no supported family uses it; Gemma 3 ignores its key).
//   Rows before cu[0] (a device cu_seqlens is not validated) or beyond cu[B] belong to no
//   sequence: out = 0, lse = -inf, dq = dk = dv = 0 (kernels/attention_rows.h).
//
// Three implementations behind one entry point:
//
// 0. cuDNN's fused SDPA (kernels/attention_cudnn.cu), taken first for bf16/f16, head_dim a
//    multiple of 8 up to 128, no soft-capping, and a batch whose query and key sequences are one
//    cu_seqlens tensor (training, prefill), when cuDNN loads (AttentionOptions::backend and
//    LEANTUNE_ATTENTION choose; a shape cuDNN refuses falls back here, noted once). The rows
//    outside every sequence are filled here, as for the kernels below.
// 1. Tensor-core flash attention (bf16/f16, head_dim 64 or 128, sm_80+): mma.sync m16n8k16 with
//    f32 accumulation, ldmatrix from shared tiles whose rows are padded by 16 bytes (conflict-free
//    ldmatrix, cp.async and 4-byte stores; every address a per-lane offset plus an immediate),
//    cp.async double buffering of the streamed operand.
//    Forward (FA2): one CTA = one (sequence, q head, block of kBr=128 queries), 4 warps of 32
//    query rows; it streams blocks of kBc keys (64 at D=64, 32 at D=128) of K/V from the last
//    visible block down (the masked diagonal blocks first), online softmax in the log2 domain
//    (x = s*scale*log2 e, p = 2^(x - m)), P rounded to the input dtype for P V, O and the row
//    sums in f32 registers. Rows whose running max is still -inf subtract 0 instead (no
//    -inf - -inf = NaN). Output: O / l (0 when l = 0), lse = (m + log2 l) ln 2 (-inf when l = 0).
//    Backward (FA2, KV-block parallel): a preprocess kernel forms Dsum = rowsum(dO * O) and
//    lse2 = lse * log2 e (+inf for -inf rows, so that P = 0 there) in f32 and zeroes an f32 dQ
//    accumulator. One CTA = one (sequence, KV head, block of kBc keys), warps of 16 keys: 8
//    (kBc = 128), or 4 (kBc = 64) for D=128 where the 8-warp tile exceeds the device's opt-in
//    shared memory (sm_86/sm_89: 99 KiB);
//    it loops over the query heads of the GQA group and the query blocks (kBr = 64 at D=64, 32
//    at D=128) that see its keys, with K, V in shared memory and dK, dV in f32 registers, and
//    per query block computes S^T = K Q^T, P^T = 2^(S^T scale log2 e - lse2), dP^T = V dO^T,
//    dS^T = P^T (dP^T - Dsum), dV += P^T dO, dK += dS^T Q (so dK/dV of a KV head are summed
//    over its group inside one CTA: exact and deterministic), and dQ += dS K through dS^T
//    staged in shared memory, added with f32 atomics into the accumulator (the one
//    non-deterministic summation order, as in FA2). A postprocess converts dQ * scale to the
//    input dtype; dK gets the scale at the end.
//    Scheduling: grid = (B*H, 1, ranks); blockIdx.z is a rank, heaviest block first (forward:
//    the last query block of every sequence; backward: the first key block), so the hardware's
//    in-order dispatch approximates longest-processing-time-first for causal masks; CTAs loop
//    over ranks with stride gridDim.z, so a too-small max_seqlen hint costs time, not results.
//    Registers (ptxas, sm_90): forward 251 (D=128) / 233 (D=64), backward 251 / 223, no spills.
//    Shared memory (row = 2 D + 16 bytes): forward (kBr + 4 kBc) rows = 68 KiB at D=128, 54 KiB
//    at D=64; backward (2 kBc + 4 kBr) rows + kBc (2 kBr + 16) + 16 kBr bytes = 112.5 KiB at
//    D=128 (73.5 KiB with kBc = 64), 91 KiB at D=64.
//    Scratch (kWorkspace): backward Dsum and lse2 ([Hq,Tq] f32 each) and dQ accumulator
//    ([Tq,Hq,D] f32).
// 2. A simple kernel (f32, f64, other head dims up to 512, pre-sm_80 devices): one warp per
//    (row, head), keys visited one at a time with an online softmax; backward one warp per query
//    row (dQ) and one per key row (dK, dV summed over the group): deterministic, no atomics,
//    O(L^2 D) scalar work. Meant for tests and small shapes.
//
// cu_seqlens are used as i32 on the device (a host or i64 tensor is converted; a device i32
// tensor is used as is, with no synchronisation when max_seqlen hints are given). Host
// cu_seqlens are validated like the CPU path; device ones are clamped into [0, T] so that a bad
// tensor cannot cause an out-of-bounds access. Inputs whose rows are not 16-byte aligned are
// copied (kWorkspace) for the tensor-core path.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "engine/log.h"
#include "kernels/attention.h"
#include "kernels/attention_common.cuh"
#include "kernels/attention_cudnn.h"
#include "kernels/attention_dims.h"
#include "kernels/attention_rows.h"
#include "kernels/cuda_device.cuh"
#include "kernels/stat_dtype.h"

namespace leantune::kernels {
namespace {

using namespace attention_detail;

// ---------------------------------------------------------------- backward pre/postprocess

// dsum[h, i] = sum_d dO[i,h,d] O[i,h,d] in A; lse2 (when non-null) = lse * log2 e, +inf where
// lse is -inf (P = 2^(x - inf) = 0 for rows that see nothing). One warp per (row, head).
template <typename T, typename A>
__global__ void attention_bwd_prep_kernel(const T* __restrict__ dout, int64_t do_stride,
                                          const T* __restrict__ out, int64_t o_stride,
                                          const A* __restrict__ lse, A* __restrict__ dsum,
                                          float* __restrict__ lse2, int tq, int hq, int d) {
  const int lane = threadIdx.x & 31;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (w >= static_cast<int64_t>(tq) * hq) return;
  const int i = static_cast<int>(w / hq), h = static_cast<int>(w % hq);
  const T* g = dout + i * do_stride + static_cast<int64_t>(h) * d;
  const T* o = out + i * o_stride + static_cast<int64_t>(h) * d;
  A acc = 0;
  for (int j = lane; j < d; j += 32) acc += cu::to_acc(g[j]) * cu::to_acc(o[j]);
  acc = cu::warp_sum(acc);
  if (lane == 0) {
    const int64_t idx = static_cast<int64_t>(h) * tq + i;
    dsum[idx] = acc;
    if (lse2) {
      const float l = static_cast<float>(lse[idx]);
      lse2[idx] = l == -INFINITY ? INFINITY : l * kLog2e;
    }
  }
}

// dq = T(acc * scale), n elements.
template <typename T>
__global__ void attention_dq_convert_kernel(const float* __restrict__ acc, T* __restrict__ dq,
                                            int64_t n, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dq[i] = cu::from_acc<T>(acc[i] * scale);
}

// Rows of x that belong to no sequence ([0, cu[0]) and [cu[batch], rows), clamped) get `value`;
// x is [rows, row_elems] contiguous, or [row_elems, rows] with `transposed` (lse's [H, T]).
template <typename T>
__global__ void attention_uncovered_fill_kernel(T* __restrict__ x, int64_t row_elems, int rows,
                                                const int* __restrict__ cu, int batch, T value,
                                                bool transposed) {
  const UncoveredRows u = uncovered_rows(cu[0], cu[batch], rows);
  const int64_t n = u.count(rows) * row_elems;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[uncovered_offset(idx, u, rows, row_elems, transposed)] = value;
}

// ---------------------------------------------------------------- launchers

int max_smem_optin(int device) {
  static std::mutex mu;
  static std::vector<int> cache;
  std::lock_guard<std::mutex> lk(mu);
  if (cache.size() <= static_cast<size_t>(device)) cache.resize(device + 1, -1);
  if (cache[device] < 0) {
    int v = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    cache[device] = v;
  }
  return cache[device];
}

template <typename T, typename A>
void attention_bwd_prep_launch(const T* dout, int64_t do_stride, const T* out, int64_t o_stride,
                               const A* lse, A* dsum, float* lse2, int tq, int hq, int d,
                               cudaStream_t stream) {
  attention_bwd_prep_kernel<T, A>
      <<<warp_grid(static_cast<int64_t>(tq) * hq), kSimpleThreads, 0, stream>>>(
          dout, do_stride, out, o_stride, lse, dsum, lse2, tq, hq, d);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_uncovered_fill_launch(T* x, int64_t row_elems, int rows, const int* cu, int batch,
                                     T value, bool transposed, Device dev, cudaStream_t stream) {
  if (rows == 0 || row_elems == 0) return;
  const unsigned blocks =
      cu::grid_blocks(static_cast<int64_t>(rows) * row_elems, 256, dev.index, 2, 256);
  attention_uncovered_fill_kernel<T>
      <<<blocks, 256, 0, stream>>>(x, row_elems, rows, cu, batch, value, transposed);
  CUDA_CHECK_LAUNCH();
}

// Rows of x ([rows, row_elems], 16-bit or f32) outside every sequence set to 0.
void zero_uncovered_rows(DType dt, void* x, int64_t row_elems, int64_t rows, const int* cu,
                         int batch, Device dev, cudaStream_t stream) {
  LT_CU_DISPATCH_F32_16(dt, T, {
    attention_uncovered_fill_launch<T>(static_cast<T*>(x), row_elems, static_cast<int>(rows), cu,
                                       batch, T{}, false, dev, stream);
  });
}

// A forward's rows outside every sequence (before cu[0], after cu[B]): out = 0, lse = -inf.
void fill_uncovered_forward(DType dt, void* out, float* lse, int64_t tq, int64_t hq, int64_t d,
                            const int* cu, int batch, Device dev, cudaStream_t stream) {
  zero_uncovered_rows(dt, out, hq * d, tq, cu, batch, dev, stream);
  attention_uncovered_fill_launch<float>(lse, hq, static_cast<int>(tq), cu, batch,
                                         -std::numeric_limits<float>::infinity(), true, dev,
                                         stream);
}

template <typename T>
void attention_dq_convert_launch(const float* acc, T* dq, int64_t n, float scale, Device dev,
                                 cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks = cu::grid_blocks(n, 256, dev.index, 4, 256);
  attention_dq_convert_kernel<T><<<blocks, 256, 0, stream>>>(acc, dq, n, scale);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- adapters

AttentionDims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  LT_CHECK(q.defined() && k.defined() && v.defined(), op, ": q, k and v must be defined");
  const AttentionDims dims = check_qkv_shapes(op, q, k, v);
  const Device d = cuda_device_of(q, op, "q");
  cu::check_on(k, d, op, "k");
  cu::check_on(v, d, op, "v");
  LT_CHECK(q.size(0) < (int64_t{1} << 31) && k.size(0) < (int64_t{1} << 31) &&
               q.size(1) * q.size(2) < (int64_t{1} << 31),
           op, ": q ", q.str(), ", k ", k.str(), " exceed the kernels' 32-bit row indices");
  return dims;
}

// A [T,H,D] operand whose heads and head_dim are dense, with its row stride; other layouts (and,
// for the tensor-core path, rows not 16-byte aligned) are copied into a contiguous workspace.
struct RowsOperand {
  Tensor keep;
  const void* ptr = nullptr;
  int64_t stride = 0;
};

RowsOperand rows_operand(const Tensor& t, bool need_align16) {
  const Shape& st = t.strides();
  const int64_t hd = t.size(1) * t.size(2);
  const bool dense_rows = (st[2] == 1 || t.size(2) <= 1) && (st[1] == t.size(2) || t.size(1) <= 1);
  const int64_t stride = t.size(0) <= 1 ? hd : st[0];
  bool ok = t.size(0) <= 1 ? t.is_contiguous() : dense_rows && stride >= hd;
  if (ok && need_align16)
    ok = cu::aligned16(t.data_ptr()) && (stride * static_cast<int64_t>(t.element_size())) % 16 == 0;
  RowsOperand r;
  if (ok) {
    r.keep = t;
    r.ptr = t.data_ptr();
    r.stride = stride;
    return r;
  }
  r.keep = Tensor::empty(t.shape(), t.dtype(), t.device(), MemTag::kWorkspace);
  ops::copy(r.keep, t);
  r.ptr = r.keep.data_ptr();
  r.stride = hd;
  return r;
}

using cu::out_operand;
using cu::OutOperand;

// cu_seqlens as a device i32 tensor, with the longest sequences (from the hints, or from a host
// copy when a hint is missing; a host tensor is validated as on the CPU path).
struct Seqs {
  Tensor cu_q, cu_k;
  int batch = 0;
  int64_t max_q = 0, max_k = 0;
  // cu_q's and cu_k's last entry when both were read on the host and agree, else the caller's
  // total_seqlen hint, else -1.
  int64_t covered = -1;
};

Tensor cu_on_device(const Tensor& cu, Device d) {
  if (cu.device() == d && cu.dtype() == DType::kI32 && cu.is_contiguous()) return cu;
  Tensor out = Tensor::empty(cu.shape(), DType::kI32, d, MemTag::kWorkspace);
  ops::copy(out, cu);
  return out;
}

Seqs prepare_seqs(const Tensor& cu_q, const Tensor& cu_k, const AttentionDims& dm,
                  const AttentionOptions& opt, Device d, const char* op) {
  LT_CHECK(cu_q.defined() && cu_k.defined() && cu_q.dim() == 1 && cu_k.dim() == 1 &&
               cu_q.numel() == cu_k.numel() && cu_q.numel() >= 1,
           op, ": cu_seqlens_q and cu_seqlens_k must both be [B+1]");
  LT_CHECK((cu_q.dtype() == DType::kI32 || cu_q.dtype() == DType::kI64) &&
               (cu_k.dtype() == DType::kI32 || cu_k.dtype() == DType::kI64),
           op, ": cu_seqlens ", cu_q.str(), ", ", cu_k.str(), " must be i32 or i64");
  LT_CHECK(cu_q.device().is_cpu() || cu_q.device() == d, op, ": cu_seqlens_q ", cu_q.str(),
           " is on another device than q");
  LT_CHECK(cu_k.device().is_cpu() || cu_k.device() == d, op, ": cu_seqlens_k ", cu_k.str(),
           " is on another device than k");
  LT_CHECK(cu_q.numel() - 1 < (int64_t{1} << 31) / std::max<int64_t>(dm.hq, 1), op, ": ",
           cu_q.numel() - 1, " sequences x ", dm.hq, " heads is too many");
  Seqs s;
  s.batch = static_cast<int>(cu_q.numel() - 1);
  s.max_q = opt.max_seqlen_q;
  s.max_k = opt.max_seqlen_k;
  const bool host = cu_q.device().is_cpu() && cu_k.device().is_cpu();
  if (host || s.max_q <= 0 || s.max_k <= 0) {
    const std::vector<int64_t> cq = cu_q.to_i64(), ck = cu_k.to_i64();
    std::tie(s.max_q, s.max_k) = check_cu_seqlens(op, cq, ck, dm.tq, dm.tk, opt.total_seqlen);
    if (cq.back() == ck.back()) s.covered = cq.back();
  } else if (opt.total_seqlen > 0) {
    s.covered = opt.total_seqlen;
  }
  s.cu_q = cu_on_device(cu_q, d);
  s.cu_k = cu_on_device(cu_k, d);
  return s;
}

// Warps of the D=128 backward tile: 8 when the device's opt-in shared memory holds that tile,
// else 4 (sm_86/sm_89), 0 when neither fits. LEANTUNE_ATTENTION_BWD_WARPS=4 forces the smaller
// tile (tests of the sm_86 path on larger devices).
int bwd128_warps(int device) {
  const int optin = max_smem_optin(device);
  const char* force = std::getenv("LEANTUNE_ATTENTION_BWD_WARPS");
  const bool force4 = force && std::string(force) == "4";
  if (!force4 && optin >= BwdCfg<128, 8>::kSmem) return 8;
  return optin >= BwdCfg<128, 4>::kSmem ? 4 : 0;
}

// The tensor-core path applies: bf16/f16, head_dim 64 or 128, sm_80+, enough shared memory.
bool use_mma(DType dt, int64_t head_dim, Device d, bool backward) {
  if (dt != DType::kBF16 && dt != DType::kF16) return false;
  if (head_dim != 64 && head_dim != 128) return false;
  if (cu::device_info(d.index).major < 8) return false;
  if (backward && head_dim == 128) return bwd128_warps(d.index) > 0;
  const int need =
      backward ? BwdCfg<64>::kSmem : (head_dim == 64 ? FwdCfg<64>::kSmem : FwdCfg<128>::kSmem);
  return max_smem_optin(d.index) >= need;
}

void check_simple_head_dim(const char* op, int64_t d) {
  LT_CHECK(d <= kSimpleMaxD, op, ": head_dim ", d,
           " is not supported on CUDA (tensor-core kernels: 64 and 128 in bf16/f16; the simple "
           "kernel: up to ",
           kSimpleMaxD, ")");
}

// ---------------------------------------------------------------- the cuDNN path

AttentionBackend requested_backend(const AttentionOptions& opt) {
  if (opt.backend != AttentionBackend::kAuto) return opt.backend;
  const char* env = std::getenv("LEANTUNE_ATTENTION");
  const std::string v = env ? env : "";
  if (v.empty() || v == "auto") return AttentionBackend::kAuto;
  if (v == "own") return AttentionBackend::kOwn;
  LT_CHECK_INPUT(v == "cudnn", "LEANTUNE_ATTENTION=", v, ": expected auto, own or cudnn");
  return AttentionBackend::kCudnn;
}

// Why this call is outside what the cuDNN path computes (attention_cudnn.h), or "" when inside.
std::string cudnn_scope(const Tensor& q, const Tensor& cu_q, const Tensor& cu_k,
                        const AttentionDims& dm, const AttentionOptions& opt) {
  if (q.dtype() != DType::kBF16 && q.dtype() != DType::kF16) return "not bf16/f16";
  if (dm.d % 8 != 0 || dm.d > 128) return "head_dim " + std::to_string(dm.d);
  if (opt.softcap != 0) return "soft-capped scores";
  if (dm.tq != dm.tk) return "different query and key rows";
  const bool same_tensor = cu_q.shares_storage(cu_k) && cu_q.offset() == cu_k.offset() &&
                           cu_q.dtype() == cu_k.dtype() && cu_q.numel() == cu_k.numel();
  if (same_tensor) return "";
  if (cu_q.device().is_cpu() && cu_k.device().is_cpu() && cu_q.to_i64() == cu_k.to_i64()) return "";
  return "query and key sequences given apart";
}

// Whether this call runs on cuDNN: in scope, wanted and loadable. With kCudnn, in scope but not
// loadable is an error.
bool want_cudnn(const Tensor& q, const Tensor& cu_q, const Tensor& cu_k, const AttentionDims& dm,
                const AttentionOptions& opt, Device d, const char* op) {
  const AttentionBackend want = requested_backend(opt);
  if (want == AttentionBackend::kOwn || !cudnn_scope(q, cu_q, cu_k, dm, opt).empty()) return false;
  std::string why;
  if (cudnn_sdpa::available(d, &why)) return true;
  LT_CHECK_INPUT(want != AttentionBackend::kCudnn, op, ": cuDNN attention was asked for ",
                 "(LEANTUNE_ATTENTION=cudnn) but is unavailable: ", why);
  return false;
}

// cuDNN refused a shape it was given: an error under kCudnn, else a note (once) and our kernels.
void cudnn_refused(const AttentionOptions& opt, const char* op, const std::string& why) {
  LT_CHECK(requested_backend(opt) != AttentionBackend::kCudnn, op,
           ": cuDNN refused this attention (LEANTUNE_ATTENTION=cudnn): ", why);
  static std::once_flag once;
  std::call_once(once, [&] {
    log_message(LogLevel::kInfo, std::string(op) + ": cuDNN refused a shape (" + why +
                                     "); leantune's kernels run it");
  });
}

cudnn_sdpa::Problem cudnn_problem(const Tensor& q, const Seqs& s, const AttentionDims& dm,
                                  const AttentionOptions& opt, double scale, Device d,
                                  cudaStream_t stream) {
  cudnn_sdpa::Problem p;
  p.dtype = q.dtype();
  p.t = dm.tq;
  p.hq = dm.hq;
  p.hk = dm.hk;
  p.d = dm.d;
  p.batch = s.batch;
  p.max_seqlen = std::max(s.max_q, s.max_k);
  p.covered = s.covered;
  p.causal = opt.causal;
  p.window = opt.window;
  p.scale = static_cast<float>(scale);
  p.cu = s.cu_q.data<int32_t>();
  p.dev = d;
  p.stream = stream;
  return p;
}

// Fills what every attention parameter block (FwdParams, BwdParams, SimpleParams) shares: the
// q/k/v rows, the sequence layout, the head counts and causality.
template <typename P>
void set_layout(P& p, const RowsOperand& qr, const RowsOperand& kr, const RowsOperand& vr,
                const Seqs& s, const AttentionDims& dm, const AttentionOptions& opt) {
  p.q = qr.ptr;
  p.k = kr.ptr;
  p.v = vr.ptr;
  p.q_stride = qr.stride;
  p.k_stride = kr.stride;
  p.v_stride = vr.stride;
  p.cu_q = s.cu_q.data<int32_t>();
  p.cu_k = s.cu_k.data<int32_t>();
  p.tq = static_cast<int>(dm.tq);
  p.tk = static_cast<int>(dm.tk);
  p.hq = static_cast<int>(dm.hq);
  p.hk = static_cast<int>(dm.hk);
  p.group = static_cast<int>(dm.group);
  p.batch = s.batch;
  p.causal = opt.causal;
  p.window = static_cast<int>(std::min<int64_t>(opt.window, INT32_MAX));
}

}  // namespace

void attention_fwd_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                        const AttentionOptions& opt, const Tensor& out, const Tensor& lse) {
  const char* op = "attention_fwd_cuda";
  const AttentionDims dm = check_qkv(op, q, k, v);
  const Device d = q.device();
  cu::check_operand(out, d, op, "out");
  cu::check_operand(lse, d, op, "lse");
  LT_CHECK(out.shape() == q.shape() && out.dtype() == q.dtype(), op, ": out ", out.str(), " for q ",
           q.str());
  LT_CHECK(lse.shape() == (Shape{dm.hq, dm.tq}) && lse.dtype() == stat_dtype(q.dtype()), op,
           ": lse ", lse.str(), " for q ", q.str(), " (want [", dm.hq, ", ", dm.tq, "] ",
           dtype_name(stat_dtype(q.dtype())), ")");
  cu::DeviceGuard guard(d);
  const Seqs s = prepare_seqs(cu_seqlens_q, cu_seqlens_k, dm, opt, d, op);
  if (dm.tq == 0) return;
  cudaStream_t stream = cu::stream_of(d);
  const double scale = opt.scale != 0.0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(dm.d));
  LT_CHECK(opt.window >= 0 && opt.softcap >= 0 && (opt.window == 0 || opt.causal), op, ": window ",
           opt.window, " (causal only), softcap ", opt.softcap);
  if (s.batch > 0 && want_cudnn(q, cu_seqlens_q, cu_seqlens_k, dm, opt, d, op)) {
    const RowsOperand qr = rows_operand(q, true), kr = rows_operand(k, true),
                      vr = rows_operand(v, true);
    const OutOperand o = out_operand(out, true);
    std::string why;
    const cudnn_sdpa::Problem p = cudnn_problem(q, s, dm, opt, scale, d, stream);
    if (cudnn_sdpa::fwd(p, {qr.ptr, qr.stride}, {kr.ptr, kr.stride}, {vr.ptr, vr.stride}, o.ptr(),
                        lse, &why)) {
      fill_uncovered_forward(q.dtype(), o.ptr(), lse.data<float>(), dm.tq, dm.hq, dm.d,
                             s.cu_q.data<int32_t>(), s.batch, d, stream);
      o.finish();
      return;
    }
    cudnn_refused(opt, op, why);
  }
  const bool mma = opt.softcap == 0 && use_mma(q.dtype(), dm.d, d, /*backward=*/false);
  if (!mma) check_simple_head_dim(op, dm.d);
  const RowsOperand qr = rows_operand(q, mma), kr = rows_operand(k, mma), vr = rows_operand(v, mma);
  const OutOperand o = out_operand(out, mma);

  if (mma) {
    FwdParams p{};
    set_layout(p, qr, kr, vr, s, dm, opt);
    p.out = o.ptr();
    p.lse = lse.data<float>();
    p.o_stride = dm.hq * dm.d;
    p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
    if (s.batch > 0) {
      fwd_mma(p, q.dtype(), dm.d, s.max_q, stream);
    }
    fill_uncovered_forward(q.dtype(), o.ptr(), lse.data<float>(), dm.tq, dm.hq, dm.d, p.cu_q,
                           s.batch, d, stream);
  } else {
    SimpleParams p{};
    set_layout(p, qr, kr, vr, s, dm, opt);
    p.o = o.ptr();
    p.lse = lse.data_ptr();
    p.d = static_cast<int>(dm.d);
    p.scale = scale;
    p.softcap = opt.softcap;
    p.softcap_inv = opt.softcap > 0 ? 1.0 / opt.softcap : 0.0;
    fwd_simple(p, q.dtype(), stream);
  }
  o.finish();
}

void attention_bwd_cuda(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& cu_seqlens_q,
                        const Tensor& cu_seqlens_k, const AttentionOptions& opt, const Tensor& dq,
                        const Tensor& dk, const Tensor& dv) {
  const char* op = "attention_bwd_cuda";
  const AttentionDims dm = check_qkv(op, q, k, v);
  const Device d = q.device();
  cu::check_on(dout, d, op, "dout");
  cu::check_on(out, d, op, "out");
  cu::check_on(lse, d, op, "lse");
  LT_CHECK(dout.shape() == q.shape() && dout.dtype() == q.dtype() && out.shape() == q.shape() &&
               out.dtype() == q.dtype(),
           op, ": dout ", dout.str(), ", out ", out.str(), " for q ", q.str());
  LT_CHECK(lse.shape() == (Shape{dm.hq, dm.tq}) && lse.dtype() == stat_dtype(q.dtype()), op,
           ": lse ", lse.str(), " for q ", q.str());
  auto check_grad = [&](const Tensor& g, const Tensor& x, const char* name) {
    if (!g.defined()) return;
    cu::check_operand(g, d, op, name);
    LT_CHECK(g.shape() == x.shape() && g.dtype() == x.dtype(), op, ": ", name, " ", g.str(),
             " for ", x.str());
  };
  check_grad(dq, q, "dq");
  check_grad(dk, k, "dk");
  check_grad(dv, v, "dv");
  cu::DeviceGuard guard(d);
  const Seqs s = prepare_seqs(cu_seqlens_q, cu_seqlens_k, dm, opt, d, op);
  if (!dq.defined() && !dk.defined() && !dv.defined()) return;
  cudaStream_t stream = cu::stream_of(d);
  const double scale = opt.scale != 0.0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(dm.d));
  LT_CHECK(opt.window >= 0 && opt.softcap >= 0 && (opt.window == 0 || opt.causal), op, ": window ",
           opt.window, " (causal only), softcap ", opt.softcap);
  // Gradients nobody asked for still have to be written somewhere by the fused kernels.
  auto grad_or_scratch = [&](const Tensor& g, const Tensor& x) {
    return g.defined() ? g : Tensor::empty(x.shape(), x.dtype(), d, MemTag::kWorkspace);
  };
  if (dm.tq > 0 && s.batch > 0 && want_cudnn(q, cu_seqlens_q, cu_seqlens_k, dm, opt, d, op)) {
    const OutOperand gq = out_operand(grad_or_scratch(dq, q), true);
    const OutOperand gk = out_operand(grad_or_scratch(dk, k), true);
    const OutOperand gv = out_operand(grad_or_scratch(dv, v), true);
    const RowsOperand qr = rows_operand(q, true), kr = rows_operand(k, true),
                      vr = rows_operand(v, true), orr = rows_operand(out, true),
                      gr = rows_operand(dout, true);
    std::string why;
    const cudnn_sdpa::Problem p = cudnn_problem(q, s, dm, opt, scale, d, stream);
    if (cudnn_sdpa::bwd(p, {qr.ptr, qr.stride}, {kr.ptr, kr.stride}, {vr.ptr, vr.stride},
                        {orr.ptr, orr.stride}, {gr.ptr, gr.stride}, lse, gq.ptr(), gk.ptr(),
                        gv.ptr(), &why)) {
      // Rows outside every sequence: zero gradients.
      const int* cu = s.cu_q.data<int32_t>();
      zero_uncovered_rows(q.dtype(), gq.ptr(), dm.hq * dm.d, dm.tq, cu, s.batch, d, stream);
      zero_uncovered_rows(q.dtype(), gk.ptr(), dm.hk * dm.d, dm.tk, cu, s.batch, d, stream);
      zero_uncovered_rows(q.dtype(), gv.ptr(), dm.hk * dm.d, dm.tk, cu, s.batch, d, stream);
      if (dq.defined()) gq.finish();
      if (dk.defined()) gk.finish();
      if (dv.defined()) gv.finish();
      return;
    }
    cudnn_refused(opt, op, why);
  }
  const bool mma = opt.softcap == 0 && use_mma(q.dtype(), dm.d, d, /*backward=*/true);
  if (!mma) check_simple_head_dim(op, dm.d);
  const OutOperand gq = out_operand(grad_or_scratch(dq, q), mma);
  const OutOperand gk = out_operand(grad_or_scratch(dk, k), mma);
  const OutOperand gv = out_operand(grad_or_scratch(dv, v), mma);
  if (dm.tq == 0 && dm.tk == 0) return;
  const RowsOperand qr = rows_operand(q, mma), kr = rows_operand(k, mma), vr = rows_operand(v, mma);
  const RowsOperand gr = rows_operand(dout, mma), orr = rows_operand(out, false);
  const Tensor lc = cu::contiguous_ws(lse);
  const DType sdt = stat_dtype(q.dtype());
  Tensor dsum = Tensor::empty({dm.hq, std::max<int64_t>(dm.tq, 1)}, sdt, d, MemTag::kWorkspace);

  if (mma) {
    Tensor lse2 =
        Tensor::empty({dm.hq, std::max<int64_t>(dm.tq, 1)}, DType::kF32, d, MemTag::kWorkspace);
    const int64_t nacc = dm.tq * dm.hq * dm.d;
    Tensor dq_acc = Tensor::empty({std::max<int64_t>(nacc, 1)}, DType::kF32, d, MemTag::kWorkspace);
    if (nacc > 0) {
      CUDA_CHECK(cudaMemsetAsync(dq_acc.data_ptr(), 0, static_cast<size_t>(nacc) * 4, stream));
      LT_CU_DISPATCH_F32_16(q.dtype(), T, {
        attention_bwd_prep_launch<T, float>(
            static_cast<const T*>(gr.ptr), gr.stride, static_cast<const T*>(orr.ptr), orr.stride,
            lc.data<float>(), dsum.data<float>(), lse2.data<float>(), static_cast<int>(dm.tq),
            static_cast<int>(dm.hq), static_cast<int>(dm.d), stream);
      });
    }
    BwdParams p{};
    set_layout(p, qr, kr, vr, s, dm, opt);
    p.dout = gr.ptr;
    p.lse2 = lse2.data<float>();
    p.dsum = dsum.data<float>();
    p.dq_acc = dq_acc.data<float>();
    p.dk = gk.ptr();
    p.dv = gv.ptr();
    p.do_stride = gr.stride;
    p.scale = static_cast<float>(scale);
    p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
    if (s.batch > 0 && dm.tk > 0) {
      bwd_mma(p, q.dtype(), dm.d, dm.d == 128 ? bwd128_warps(d.index) : 8, s.max_k, stream);
    }
    LT_CU_DISPATCH_F32_16(q.dtype(), T, {
      // dq for every row (rows outside sequences got no contribution: zero).
      attention_dq_convert_launch<T>(dq_acc.data<float>(), static_cast<T*>(gq.ptr()), nacc,
                                     static_cast<float>(scale), d, stream);
    });
    // Keys outside every sequence: zero dk, dv.
    zero_uncovered_rows(q.dtype(), gk.ptr(), dm.hk * dm.d, dm.tk, p.cu_k, s.batch, d, stream);
    zero_uncovered_rows(q.dtype(), gv.ptr(), dm.hk * dm.d, dm.tk, p.cu_k, s.batch, d, stream);
  } else {
    LT_CU_DISPATCH_FLOAT(q.dtype(), T, {
      using A = cu::acc_of<T>;
      if (dm.tq > 0)
        attention_bwd_prep_launch<T, A>(
            static_cast<const T*>(gr.ptr), gr.stride, static_cast<const T*>(orr.ptr), orr.stride,
            static_cast<const A*>(lc.data_ptr()), static_cast<A*>(dsum.data_ptr()), nullptr,
            static_cast<int>(dm.tq), static_cast<int>(dm.hq), static_cast<int>(dm.d), stream);
      SimpleParams p{};
      set_layout(p, qr, kr, vr, s, dm, opt);
      p.dout = gr.ptr;
      p.lse_in = lc.data_ptr();
      p.dsum = dsum.data_ptr();
      p.dq = gq.ptr();
      p.dk = gk.ptr();
      p.dv = gv.ptr();
      p.do_stride = gr.stride;
      p.d = static_cast<int>(dm.d);
      p.scale = scale;
      p.softcap = opt.softcap;
      p.softcap_inv = opt.softcap > 0 ? 1.0 / opt.softcap : 0.0;
      bwd_simple(p, q.dtype(), stream);
    });
  }
  if (dq.defined()) gq.finish();
  if (dk.defined()) gk.finish();
  if (dv.defined()) gv.finish();
}

CudnnAttentionStatus cudnn_attention_status_cuda(int device) {
  CudnnAttentionStatus st;
  st.available = cudnn_sdpa::available(Device::cuda(device), &st.why);
  st.calls = cudnn_sdpa::calls();
  st.dense_calls = cudnn_sdpa::dense_calls();
  return st;
}

}  // namespace leantune::kernels
