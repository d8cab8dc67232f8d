// cuBLASLt / cuBLAS behind engine/cuda_blas.cuh (handles, cached heuristics, the autotune's
// timing of the heuristic's candidates, workspace), the column reduction, and cuda_ops::gemm
// (contract in engine/ops_cuda_internal.cuh).
#include <cublasLt.h>
#include <cublas_v2.h>

#include <optional>
#include <string>

#include "engine/gemm_tuning.h"
#include "engine/ops_cuda_internal.cuh"

// ================================================================ cuBLASLt / cuBLAS

namespace leantune::cu {
namespace {

constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;  // NVIDIA's advice for Hopper
constexpr int kMaxDevices = 64;

// Handles live for the whole process: destroying them at static destruction can run after the
// CUDA context is gone.
cublasLtHandle_t lt_handle(int device) {
  static std::mutex mu;
  static cublasLtHandle_t handles[kMaxDevices] = {};
  LT_CHECK(device >= 0 && device < kMaxDevices, "device index ", device);
  std::lock_guard<std::mutex> lk(mu);
  if (!handles[device]) {
    DeviceGuard g(device);
    CUBLAS_CHECK(cublasLtCreate(&handles[device]));
  }
  return handles[device];
}

// The legacy handle (f64 only). Callers hold blas_mutex() while they set stream and workspace
// and run, so that threads sharing the handle do not interleave.
std::mutex& blas_mutex() {
  static std::mutex mu;
  return mu;
}
cublasHandle_t blas_handle(int device) {
  static cublasHandle_t handles[kMaxDevices] = {};
  LT_CHECK(device >= 0 && device < kMaxDevices, "device index ", device);
  if (!handles[device]) {
    DeviceGuard g(device);
    CUBLAS_CHECK(cublasCreate(&handles[device]));
  }
  return handles[device];
}

uint32_t pointer_alignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && (v % a) != 0) a >>= 1;
  return a;
}

bool is_64f(const LtGemm& g) { return g.a_type == CUDA_R_64F; }

// Descriptors for one problem, destroyed on scope exit.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void lt_build(const LtGemm& g, LtDescs* x) {
  const bool f64 = is_64f(g);
  const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  const cudaDataType_t scale = f64 ? CUDA_R_64F : CUDA_R_32F;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&x->op, compute, scale));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (g.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                sizeof(g.bias)));
  }
  // Stored (column-major) shapes of A and B before op().
  const uint64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const uint64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x->a, g.a_type, a_rows, a_cols, g.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x->b, g.b_type, b_rows, b_cols, g.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x->d, g.d_type, g.m, g.n, g.ldd));
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&x->pref));
  const uint64_t ws = kLtWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // Split-K partial sums only in the compute type (f32/f64): the in-place and output-type schemes
  // add a rounding per split in a 16-bit output (and in-place ones sum in no fixed order). Every
  // candidate the autotune times writes the real output, so each must be as accurate as the rest.
  const uint32_t reduction =
      CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x->pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof(reduction)));
  // Algorithms that need more alignment than the operands have must be excluded (the default
  // assumes 256-byte aligned buffers).
  const uint32_t al_a = pointer_alignment(g.a), al_b = pointer_alignment(g.b),
                 al_d = pointer_alignment(g.d);
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      x->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
}

using LtKey = std::array<int64_t, 20>;

LtKey lt_key(const LtGemm& g, int device, int requested) {
  return {device,
          static_cast<int64_t>(g.a_type),
          static_cast<int64_t>(g.b_type),
          static_cast<int64_t>(g.d_type),
          g.trans_a,
          g.trans_b,
          g.m,
          g.n,
          g.k,
          g.lda,
          g.ldb,
          g.ldd,
          g.bias != nullptr,
          pointer_alignment(g.a),
          pointer_alignment(g.b),
          pointer_alignment(g.d),
          g.beta != 0.0,
          requested,
          0,
          0};
}

// One heuristic choice. (A std::vector of cublasLtMatmulHeuristicResult_t itself crashes the
// nvcc 13.0 front end, so the results are copied into this.)
struct LtAlgo {
  cublasLtMatmulAlgo_t algo;
  size_t workspace;
};

// Heuristic results for the problem, best first; cached per key.
std::vector<LtAlgo> lt_heuristics(const LtGemm& g, const LtDescs& x, int device, int requested) {
  static std::mutex mu;
  static std::map<LtKey, std::vector<LtAlgo>> cache;
  const LtKey key = lt_key(g, device, requested);
  {
    std::lock_guard<std::mutex> lk(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  constexpr int kMaxRequested = 64;
  LT_CHECK(requested > 0 && requested <= kMaxRequested, "lt_heuristics: ", requested);
  cublasLtMatmulHeuristicResult_t res[kMaxRequested];
  std::memset(res, 0, sizeof(res));
  int returned = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_handle(device), x.op, x.a, x.b, x.d, x.d, x.pref,
                                              requested, res, &returned));
  std::vector<LtAlgo> algos;
  for (int i = 0; i < returned; ++i)
    if (res[i].state == CUBLAS_STATUS_SUCCESS)
      algos.push_back(LtAlgo{res[i].algo, res[i].workspaceSize});
  std::lock_guard<std::mutex> lk(mu);
  cache.emplace(key, algos);
  return algos;
}

// ---------------------------------------------------------------- autotune (gemm_tuning.h)

constexpr int kTuneReps = 5;    // timed calls per candidate and round, after one warm-up call
constexpr int kTuneRounds = 2;  // rounds over the candidates, in alternating order
// Largest scratch copy of an accumulating (beta != 0) output the tuning allocates; larger ones
// (e.g. the fused loss's f32 dW of a 150k vocabulary, about 1 GiB) keep rank 0 rather than
// raise the step's peak memory.
constexpr size_t kTuneScratchMaxBytes = size_t{256} << 20;

size_t lt_type_bytes(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_64F:
      return 8;
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F:
      return 2;
    default:
      LT_THROW(ErrorKind::kInternal, "gemm: output type ", static_cast<int>(t));
  }
}

// Bytes from D's first element to its last (column-major m x n, leading dimension ldd).
size_t lt_output_span_bytes(const LtGemm& g) {
  return static_cast<size_t>((g.n - 1) * g.ldd + g.m) * lt_type_bytes(g.d_type);
}

// The problem as the tuning cache names it: everything lt_key holds except the device.
std::string lt_problem_key(const LtGemm& g) {
  return ::leantune::detail::str_cat(
      "m", g.m, " n", g.n, " k", g.k, " t", g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', " types",
      static_cast<int>(g.a_type), ",", static_cast<int>(g.b_type), ",", static_cast<int>(g.d_type),
      " ld", g.lda, ",", g.ldb, ",", g.ldd, " align", pointer_alignment(g.a), ",",
      pointer_alignment(g.b), ",", pointer_alignment(g.d), g.bias ? " bias" : "",
      g.beta != 0.0 ? " beta" : "");
}

// The GPU model and library version a choice holds for: name, compute capability, SM count
// and cuBLASLt's version (not the UUID: a choice measured on one H200 holds on another).
std::string device_identity(int device) {
  static std::mutex mu;
  static std::string ids[kMaxDevices];
  LT_CHECK(device >= 0 && device < kMaxDevices, "device index ", device);
  std::lock_guard<std::mutex> lk(mu);
  if (ids[device].empty()) {
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    ids[device] =
        ::leantune::detail::str_cat(p.name, "|sm_", p.major, p.minor, "|", p.multiProcessorCount,
                                    " SMs|cuBLASLt ", cublasLtGetVersion());
  }
  return ids[device];
}

// One CUDA event, destroyed on scope exit.
struct Event {
  cudaEvent_t e = nullptr;
  Event() { CUDA_CHECK(cudaEventCreate(&e)); }
  ~Event() {
    if (e) cudaEventDestroy(e);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

// One cublasLtMatmul of g with output `d` (g.d or a scratch copy) and heuristic choice `r`.
cublasStatus_t lt_matmul(const LtGemm& g, const LtDescs& x, void* d, const LtAlgo& r, void* ws,
                         cudaStream_t stream, int device) {
  const float alpha_f = static_cast<float>(g.alpha), beta_f = static_cast<float>(g.beta);
  const void* alpha = is_64f(g) ? static_cast<const void*>(&g.alpha) : &alpha_f;
  const void* beta = is_64f(g) ? static_cast<const void*>(&g.beta) : &beta_f;
  return cublasLtMatmul(lt_handle(device), x.op, alpha, g.a, x.a, g.b, x.b, beta, d, x.d, d, x.d,
                        &r.algo, ws, r.workspace, stream);
}

// Times each candidate on output `d`: one warm-up call, then kTuneReps calls between two events
// on `stream`, in kTuneRounds rounds that visit the candidates in alternating order, keeping each
// one's fastest round (so that no candidate is judged only by the clocks of its turn: the GPU's
// clock and the caches change while the first candidates run). The fastest rank, but rank 0 when
// it is within 1% of the fastest (fewer changes of rounding for no gain); nullopt when no
// candidate ran.
std::optional<gemm_tuning::Choice> lt_time_candidates(const LtGemm& g, const LtDescs& x,
                                                      const std::vector<LtAlgo>& algos, void* d,
                                                      Device dev, cudaStream_t stream) {
  size_t ws_bytes = 0;
  for (const LtAlgo& a : algos) ws_bytes = std::max(ws_bytes, a.workspace);
  Tensor ws;
  if (ws_bytes > 0) ws = workspace(ws_bytes, dev);
  void* wsp = ws.defined() ? ws.data_ptr() : nullptr;
  Event start, stop;
  std::vector<double> ms(algos.size(), -1.0);
  std::vector<char> refused(algos.size(), 0);
  for (size_t i = 0; i < kTuneRounds * algos.size(); ++i) {
    const size_t pass = i / algos.size(), pos = i % algos.size();
    const size_t r = pass % 2 == 0 ? pos : algos.size() - 1 - pos;
    if (refused[r]) continue;
    bool ok = lt_matmul(g, x, d, algos[r], wsp, stream, dev.index) == CUBLAS_STATUS_SUCCESS;
    if (ok) {
      CUDA_CHECK(cudaEventRecord(start.e, stream));
      for (int rep = 0; rep < kTuneReps && ok; ++rep)
        ok = lt_matmul(g, x, d, algos[r], wsp, stream, dev.index) == CUBLAS_STATUS_SUCCESS;
      CUDA_CHECK(cudaEventRecord(stop.e, stream));
      CUDA_CHECK(cudaEventSynchronize(stop.e));
    }
    if (!ok) {
      // An algorithm the heuristic offered may still refuse the problem; clear what its failed
      // launch may have left so that the next check does not report it.
      (void)cudaGetLastError();
      refused[r] = 1;
      ms[r] = -1.0;
      continue;
    }
    float t = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&t, start.e, stop.e));
    const double per_call = static_cast<double>(t) / kTuneReps;
    if (ms[r] < 0.0 || per_call < ms[r]) ms[r] = per_call;
  }
  std::optional<gemm_tuning::Choice> best;
  for (size_t r = 0; r < ms.size(); ++r)
    if (ms[r] >= 0.0 && (!best || ms[r] < best->ms))
      best = gemm_tuning::Choice{static_cast<int>(r), ms[r]};
  if (best && ms[0] >= 0.0 && ms[0] <= best->ms * 1.01) best = gemm_tuning::Choice{0, ms[0]};
  return best;
}

// The rank lt_gemm runs for kLtAutoRank: the cached choice, else the candidates' timing (on the
// real output when beta == 0, since every call overwrites it and lt_gemm's own call follows; on
// a scratch copy when beta != 0, since every call accumulates), else 0.
int lt_choose_rank(const LtGemm& g, const LtDescs& x, const std::vector<LtAlgo>& algos, Device dev,
                   cudaStream_t stream) {
  if (algos.empty() || gemm_tuning::mode() == gemm_tuning::Mode::kOff) return 0;
  const std::string device = device_identity(dev.index), problem = lt_problem_key(g);
  if (const auto c = gemm_tuning::lookup(device, problem, static_cast<int>(algos.size())))
    return c->rank;
  // Timing synchronises the stream, which a graph capture forbids.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    gemm_tuning::note_capture_fallback();
    return 0;
  }
  void* d = g.d;
  Tensor scratch;
  if (g.beta != 0.0) {
    const size_t bytes = lt_output_span_bytes(g);
    if (bytes <= kTuneScratchMaxBytes) {
      try {
        scratch = workspace(bytes, dev);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kOutOfMemory) throw;
      }
    }
    if (!scratch.defined()) {
      gemm_tuning::record(device, problem, gemm_tuning::Choice{0, 0.0}, /*timed=*/false);
      return 0;
    }
    CUDA_CHECK(cudaMemcpyAsync(scratch.data_ptr(), g.d, bytes, cudaMemcpyDeviceToDevice, stream));
    d = scratch.data_ptr();
  }
  const auto c = lt_time_candidates(g, x, algos, d, dev, stream);
  if (!c) return 0;  // nothing ran: lt_gemm's own call of rank 0 reports why
  gemm_tuning::record(device, problem, *c, /*timed=*/true);
  return c->rank;
}

void check_gemm_args(const LtGemm& g) {
  LT_CHECK(g.m > 0 && g.n > 0 && g.k > 0, "gemm: empty problem ", g.m, "x", g.n, "x", g.k);
  LT_CHECK(g.a && g.b && g.d, "gemm: null operand");
  const int64_t a_rows = g.trans_a ? g.k : g.m, b_rows = g.trans_b ? g.n : g.k;
  LT_CHECK(g.lda >= std::max<int64_t>(1, a_rows) && g.ldb >= std::max<int64_t>(1, b_rows) &&
               g.ldd >= std::max<int64_t>(1, g.m),
           "gemm: leading dimensions ", g.lda, ", ", g.ldb, ", ", g.ldd, " too small for ", g.m,
           "x", g.n, "x", g.k);
}

}  // namespace

cudaDataType_t cuda_data_type(DType dt) {
  switch (dt) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF64:
      return CUDA_R_64F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      LT_THROW(ErrorKind::kInternal, "no cuBLAS type for ", dtype_name(dt));
  }
}

namespace {

// Descriptors, candidate list (kLtTuneCandidates, or rank + 1 when more) and the rank to run.
struct LtPlan {
  LtDescs x;
  std::vector<LtAlgo> algos;
  int rank = 0;
};

void lt_plan(const LtGemm& g, Device dev, cudaStream_t stream, int rank, LtPlan* p) {
  check_gemm_args(g);
  LT_CHECK(rank == kLtAutoRank || (rank >= 0 && rank < 64), "lt_gemm: algorithm rank ", rank);
  lt_build(g, &p->x);
  p->algos = lt_heuristics(g, p->x, dev.index, std::max(kLtTuneCandidates, rank + 1));
  p->rank = rank == kLtAutoRank ? lt_choose_rank(g, p->x, p->algos, dev, stream) : rank;
  LT_CHECK(static_cast<int>(p->algos.size()) > p->rank, "cuBLASLt has no algorithm (rank ", p->rank,
           ") for a ", g.m, "x", g.n, "x", g.k, " product of types ", static_cast<int>(g.a_type),
           "/", static_cast<int>(g.b_type), "->", static_cast<int>(g.d_type),
           g.bias ? " with bias" : "");
}

}  // namespace

void lt_gemm(const LtGemm& g, Device dev, cudaStream_t stream, int rank) {
  DeviceGuard guard(dev);
  LtPlan p;
  lt_plan(g, dev, stream, rank, &p);
  const LtAlgo& r = p.algos[static_cast<size_t>(p.rank)];
  Tensor ws;
  if (r.workspace > 0) ws = workspace(r.workspace, dev);
  CUBLAS_CHECK(
      lt_matmul(g, p.x, g.d, r, ws.defined() ? ws.data_ptr() : nullptr, stream, dev.index));
}

int lt_gemm_tuned_rank(const LtGemm& g, Device dev, cudaStream_t stream) {
  DeviceGuard guard(dev);
  LtPlan p;
  lt_plan(g, dev, stream, kLtAutoRank, &p);
  return p.rank;
}

int lt_gemm_algo_count(const LtGemm& g, Device dev, int max) {
  check_gemm_args(g);
  DeviceGuard guard(dev);
  LtDescs x;
  lt_build(g, &x);
  return static_cast<int>(lt_heuristics(g, x, dev.index, max).size());
}

void dgemm(const LtGemm& g, Device dev, cudaStream_t stream) {
  check_gemm_args(g);
  LT_CHECK(g.a_type == CUDA_R_64F && g.b_type == CUDA_R_64F && g.d_type == CUDA_R_64F && !g.bias,
           "dgemm: f64 operands only, no bias");
  const int64_t lim = std::numeric_limits<int>::max();
  LT_CHECK(g.m <= lim && g.n <= lim && g.k <= lim && g.lda <= lim && g.ldb <= lim && g.ldd <= lim,
           "dgemm: dimensions exceed cuBLAS's 32-bit range");
  DeviceGuard guard(dev);
  Tensor ws = workspace(kLtWorkspaceBytes, dev);
  std::lock_guard<std::mutex> lk(blas_mutex());
  cublasHandle_t h = blas_handle(dev.index);
  CUBLAS_CHECK(cublasSetStream(h, stream));
  CUBLAS_CHECK(cublasSetWorkspace(h, ws.data_ptr(), kLtWorkspaceBytes));
  CUBLAS_CHECK(cublasDgemm(
      h, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), &g.alpha,
      static_cast<const double*>(g.a), static_cast<int>(g.lda), static_cast<const double*>(g.b),
      static_cast<int>(g.ldb), &g.beta, static_cast<double*>(g.d), static_cast<int>(g.ldd)));
}

// ---------------------------------------------------------------- column_sum

namespace {

constexpr int kColX = 32;  // columns per block
constexpr int kColY = 8;   // row lanes per block
constexpr int kFinalizeThreads = 256;

// Block (kColX, kColY) over columns [bx*32, +32) and rows [split*rows_per, +rows_per): lane y
// sums rows y, y+8, ...; the 8 lane sums are added in lane order. One split writes `out`
// directly, several write partials[split][col] (A).
template <typename T, typename O, typename A>
__global__ void column_sum_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t ld,
                                  int64_t rows_per, O* __restrict__ out, A* __restrict__ partials) {
  __shared__ A tile[kColY][kColX + 1];
  const int64_t col = blockIdx.x * static_cast<int64_t>(kColX) + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per;
  const int64_t r1 = std::min(rows, r0 + rows_per);
  A acc = 0;
  if (col < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColY) acc += cu::to_acc(x[r * ld + col]);
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    A t = 0;
#pragma unroll
    for (int y = 0; y < kColY; ++y) t += tile[y][threadIdx.x];
    if (partials)
      partials[blockIdx.y * cols + col] = t;
    else
      out[col] = cu::from_acc<O>(t);
  }
}

template <typename A, typename O>
__global__ void column_sum_finalize_kernel(const A* __restrict__ partials, int64_t splits,
                                           int64_t cols, O* __restrict__ out) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= cols) return;
  A t = 0;
  for (int64_t s = 0; s < splits; ++s) t += partials[s * cols + col];
  out[col] = cu::from_acc<O>(t);
}

}  // namespace

void column_sum(const void* x, DType x_type, int64_t rows, int64_t cols, int64_t ld, void* out,
                DType out_type, Device dev, cudaStream_t stream) {
  if (cols == 0) return;
  LT_CHECK(ld >= cols, "column_sum: ld ", ld, " < cols ", cols);
  LT_CHECK((x_type == DType::kF64) == (out_type == DType::kF64), "column_sum: output ",
           dtype_name(out_type), " for input ", dtype_name(x_type));
  DeviceGuard guard(dev);
  const int64_t col_blocks = (cols + kColX - 1) / kColX;
  const int64_t target = static_cast<int64_t>(device_info(dev.index).sm_count) * 8;
  // Split the rows when the columns give too few blocks; keep >= 64 rows per split.
  int64_t splits = std::clamp<int64_t>(target / col_blocks, 1, std::max<int64_t>(rows / 64, 1));
  splits = std::min<int64_t>(splits, 65535);
  const int64_t rows_per = std::max<int64_t>((rows + splits - 1) / splits, 1);
  splits = std::max<int64_t>((rows + rows_per - 1) / rows_per, 1);
  const dim3 block(kColX, kColY);
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits));
  LT_CU_DISPATCH_FLOAT(x_type, T, {
    using A = acc_of<T>;
    LT_CU_DISPATCH_FLOAT(out_type, O, {
      O* o = static_cast<O*>(out);
      if (splits == 1) {
        column_sum_kernel<T, O, A><<<grid, block, 0, stream>>>(static_cast<const T*>(x), rows, cols,
                                                               ld, rows_per, o, nullptr);
        CUDA_CHECK_LAUNCH();
      } else {
        Tensor partials = workspace(static_cast<size_t>(splits * cols) * sizeof(A), dev);
        A* pp = static_cast<A*>(partials.data_ptr());
        column_sum_kernel<T, O, A>
            <<<grid, block, 0, stream>>>(static_cast<const T*>(x), rows, cols, ld, rows_per, o, pp);
        CUDA_CHECK_LAUNCH();
        column_sum_finalize_kernel<A, O>
            <<<static_cast<unsigned>((cols + kFinalizeThreads - 1) / kFinalizeThreads),
               kFinalizeThreads, 0, stream>>>(pp, splits, cols, o);
        CUDA_CHECK_LAUNCH();
      }
    });
  });
}

}  // namespace leantune::cu

// ================================================================ gemm

namespace leantune::cuda_ops {
namespace {

// A 2-D operand as cuBLAS sees a row-major matrix: data, leading dimension, and whether the
// tensor is the transpose of a row-major matrix (then the caller flips its op flag).
struct RowMajor {
  Tensor t;  // keeps a copy alive when one was needed
  const void* ptr = nullptr;
  int64_t ld = 0;
  bool flipped = false;
};

RowMajor as_row_major(const Tensor& x, DType want) {
  RowMajor r;
  const int64_t rows = x.size(0), cols = x.size(1);
  const int64_t s0 = x.strides()[0], s1 = x.strides()[1];
  if (x.dtype() == want) {
    if ((s1 == 1 || cols == 1) && (rows == 1 || s0 >= cols)) {
      r.t = x;
      r.ptr = x.data_ptr();
      r.ld = rows == 1 ? std::max<int64_t>(cols, 1) : std::max<int64_t>(s0, 1);
      return r;
    }
    if ((s0 == 1 || rows == 1) && (cols == 1 || s1 >= rows)) {
      r.t = x;
      r.ptr = x.data_ptr();
      r.ld = cols == 1 ? std::max<int64_t>(rows, 1) : std::max<int64_t>(s1, 1);
      r.flipped = true;
      return r;
    }
  }
  r.t = Tensor::empty(x.shape(), want, x.device(), MemTag::kWorkspace);
  same_device_copy(r.t, x);
  r.ptr = r.t.data_ptr();
  r.ld = std::max<int64_t>(cols, 1);
  return r;
}

}  // namespace

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha,
          double beta) {
  const ops::GemmDims dims = ops::gemm_dims(a, ta, b, tb, c);
  const int64_t m = dims.m, k = dims.k, n = dims.n;
  const Device d = c.device();
  LT_CHECK(a.device() == d && b.device() == d, "gemm: tensors on different devices");
  if (m == 0 || n == 0) return;
  cu::DeviceGuard g(d);
  cudaStream_t s = cu::stream_of(d);
  if (k == 0) {
    if (beta == 0.0) {
      fill(c, 0.0);
    } else {
      LT_CHECK(c.is_contiguous(), "gemm output must be contiguous: ", c.str());
      scale_(c, beta);
    }
    return;
  }
  const bool c_rows = (c.strides()[1] == 1 || n == 1) && (m == 1 || c.strides()[0] >= n);
  LT_CHECK(c_rows, "gemm output must have unit column stride: ", c.str());
  const int64_t ldc = m == 1 ? n : c.strides()[0];

  auto is16 = [](DType t) { return t == DType::kBF16 || t == DType::kF16; };
  DType in_dt;   // dtype a and b are used in
  Tensor c_f32;  // when c's dtype cannot be the output of the product
  if (a.dtype() == DType::kF64 || b.dtype() == DType::kF64 || c.dtype() == DType::kF64) {
    LT_CHECK(a.dtype() == DType::kF64 && b.dtype() == DType::kF64 && c.dtype() == DType::kF64,
             "gemm: mixed f64 inputs");
    in_dt = DType::kF64;
  } else if (a.dtype() == b.dtype() && is16(a.dtype()) &&
             (c.dtype() == a.dtype() || c.dtype() == DType::kF32)) {
    in_dt = a.dtype();
  } else {
    // Mixed inputs: everything in f32, as the host does.
    in_dt = DType::kF32;
    if (c.dtype() != DType::kF32) {
      c_f32 = Tensor::empty(c.shape(), DType::kF32, d, MemTag::kWorkspace);
      if (beta != 0.0) same_device_copy(c_f32, c);
    }
  }
  const RowMajor ra = as_row_major(a, in_dt), rb = as_row_major(b, in_dt);
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS's A is our b.
  cu::gemm_cm(rb.ptr, rb.ld, tb != rb.flipped, ra.ptr, ra.ld, ta != ra.flipped,
              c_f32.defined() ? c_f32.data_ptr() : c.data_ptr(), c_f32.defined() ? n : ldc, n, m, k,
              alpha, beta, in_dt, c_f32.defined() ? DType::kF32 : c.dtype(), nullptr, d, s);
  if (c_f32.defined()) same_device_copy(c, c_f32);
}

}  // namespace leantune::cuda_ops
