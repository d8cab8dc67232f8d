// The tensor-core attention forward (FA2 style; design in kernels/attention.cu): one CTA per
// (sequence, q head, block of kBr queries), K/V streamed from the last visible block down.
#include "kernels/acc_math.cuh"
#include "kernels/attention_mma.cuh"

namespace leantune::kernels::attention_detail {
namespace {

// ---------------------------------------------------------------- tensor-core forward

template <typename T, int D>
__device__ __forceinline__ void fwd_tile(const FwdParams& p, const SeqBounds& s, int h, int m,
                                         unsigned char* smem) {
  using C = FwdCfg<D>;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int i0 = m * C::kBr;
  const int rows = min(C::kBr, s.lq - i0);
  const int shift = s.lk - s.lq;  // query i sees keys j <= i + shift
  const int kend = p.causal ? min(s.lk, i0 + rows + shift) : s.lk;
  const int nkb = kend > 0 ? (kend + C::kBc - 1) / C::kBc : 0;
  // A sliding window: the block's first query sees no key before kstart; earlier blocks are
  // skipped (the loop streams blocks nkb-1 down to kb0).
  const bool windowed = p.causal && p.window > 0;
  const int kstart = windowed ? max(0, i0 + shift - p.window + 1) : 0;
  const int kb0 = min(kstart / C::kBc, nkb);
  const int steps = nkb - kb0;
  const int hk = h / p.group;

  const T* qbase = static_cast<const T*>(p.q);
  const T* kbase = static_cast<const T*>(p.k);
  const T* vbase = static_cast<const T*>(p.v);
  const T* qg = qbase + static_cast<int64_t>(s.q0 + i0) * p.q_stride + h * D;
  const T* kg = kbase + static_cast<int64_t>(s.k0) * p.k_stride + hk * D;
  const T* vg = vbase + static_cast<int64_t>(s.k0) * p.v_stride + hk * D;

  const uint32_t q_s = smem_u32(smem);
  const uint32_t kv_s = q_s + C::kQBytes;  // K0, V0, K1, V1
  auto k_buf = [&](int buf) { return kv_s + buf * 2 * C::kKVBytes; };
  auto v_buf = [&](int buf) { return kv_s + buf * 2 * C::kKVBytes + C::kKVBytes; };
  auto load_kv = [&](int n, int buf) {
    const int j0 = n * C::kBc;
    tile_load_async<T, C::kBc, D, C::kThreads>(
        k_buf(buf), kg + static_cast<int64_t>(j0) * p.k_stride, p.k_stride, s.lk - j0, kbase, tid);
    tile_load_async<T, C::kBc, D, C::kThreads>(
        v_buf(buf), vg + static_cast<int64_t>(j0) * p.v_stride, p.v_stride, s.lk - j0, vbase, tid);
  };

  if (steps > 0) {
    tile_load_async<T, C::kBr, D, C::kThreads>(q_s, qg, p.q_stride, rows, qbase, tid);
    load_kv(nkb - 1, 0);
    cp_async_commit();
  }

  float o[C::kMT][C::kDT][4];
  float row_max[C::kMT][2], row_sum[C::kMT][2];
#pragma unroll
  for (int mt = 0; mt < C::kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < C::kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[mt][r] = -INFINITY;
      row_sum[mt][r] = 0.f;
    }
  }
  const int warp_row0 = warp * C::kMT * 16;  // first tile row of this warp
  const uint32_t qa = q_s + warp_row0 * C::kRowBytes + a_off(lane, C::kRowBytes);
  const uint32_t kb_lane = b_off(lane, C::kRowBytes), vb_lane = bt_off(lane, C::kRowBytes);

  for (int it = 0; it < steps; ++it) {
    const int n = nkb - 1 - it;
    const int buf = it & 1;
    cp_async_wait_all();
    // The data of step `it` is visible to all; every warp has finished step it-1, so its
    // buffers may be refilled.
    __syncthreads();
    if (it + 1 < steps) {
      load_kv(n - 1, buf ^ 1);
      cp_async_commit();
    }

    const uint32_t kb = k_buf(buf) + kb_lane, vb = v_buf(buf) + vb_lane;
    // S = Q K^T (kMT x kNT tiles of 16x8 per warp).
    float sacc[C::kMT][C::kNT][4];
#pragma unroll
    for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sacc[mt][nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t a[C::kMT][4];
#pragma unroll
      for (int mt = 0; mt < C::kMT; ++mt) ldmatrix_x4(a[mt], qa + mt * 16 * C::kRowBytes + ks * 32);
      mma_rows<T>(sacc, a, [&](int np, uint32_t(&b)[4]) {
        ldmatrix_x4(b, kb + np * 16 * C::kRowBytes + ks * 32);
      });
    }

    // Scale into the log2 domain; mask keys beyond the sequence, above the diagonal and before
    // the window.
    const int j0 = n * C::kBc;
    const bool need_mask = j0 + C::kBc > s.lk || (p.causal && j0 + C::kBc - 1 > i0 + shift) ||
                           (windowed && j0 <= i0 + rows - 1 + shift - p.window);
#pragma unroll
    for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = sacc[mt][nt][e] * p.scale_log2;
          if (need_mask) {
            const int i = i0 + warp_row0 + mt * 16 + (lane >> 2) + ((e >> 1) << 3);
            const int j = j0 + nt * 8 + ((lane & 3) << 1) + (e & 1);
            if (j >= s.lk || (p.causal && j > i + shift) || (windowed && j <= i + shift - p.window))
              x = -INFINITY;
          }
          sacc[mt][nt][e] = x;
        }

        // Online softmax. A row is spread over the 4 lanes of a quad (t = lane % 4).
#pragma unroll
    for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = row_max[mt][r];
#pragma unroll
        for (int nt = 0; nt < C::kNT; ++nt)
          mx = fmaxf(mx, fmaxf(sacc[mt][nt][2 * r], sacc[mt][nt][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // A row with no visible key so far keeps max -inf: subtract 0 (every p is then 0).
        const float m_use = mx == -INFINITY ? 0.f : mx;
        const float alpha = exp2_ftz(row_max[mt][r] - m_use);
        row_max[mt][r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < C::kNT; ++nt) {
          const float p0 = exp2_ftz(sacc[mt][nt][2 * r] - m_use);
          const float p1 = exp2_ftz(sacc[mt][nt][2 * r + 1] - m_use);
          sacc[mt][nt][2 * r] = p0;
          sacc[mt][nt][2 * r + 1] = p1;
          sum += p0 + p1;
        }
        row_sum[mt][r] = row_sum[mt][r] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < C::kDT; ++dt) {
          o[mt][dt][2 * r] *= alpha;
          o[mt][dt][2 * r + 1] *= alpha;
        }
      }

      // O += P V, P rounded to T as the A operand straight from the accumulators.
#pragma unroll
    for (int kk = 0; kk < C::kBc / 16; ++kk) {
      uint32_t a[C::kMT][4];
#pragma unroll
      for (int mt = 0; mt < C::kMT; ++mt)
        acc_to_a<T>(a[mt], sacc[mt][2 * kk], sacc[mt][2 * kk + 1]);
      mma_rows<T>(o, a, [&](int dp, uint32_t(&b)[4]) {
        ldmatrix_x4_trans(b, vb + kk * 16 * C::kRowBytes + dp * 32);
      });
    }
  }

  // Epilogue: O / l and lse for the rows that exist.
  T* obase = static_cast<T*>(p.out);
#pragma unroll
  for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float mx = row_max[mt][r];
      const bool empty = !(sum > 0.f) || mx == -INFINITY;
      const float inv = empty ? 0.f : 1.f / sum;
      const int i = i0 + warp_row0 + mt * 16 + (lane >> 2) + r * 8;
      if (i < s.lq) {
        T* orow = obase + static_cast<int64_t>(s.q0 + i) * p.o_stride + h * D;
#pragma unroll
        for (int dt = 0; dt < C::kDT; ++dt)
          *reinterpret_cast<uint32_t*>(orow + dt * 8 + ((lane & 3) << 1)) =
              pack2<T>(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
        if ((lane & 3) == 0)
          p.lse[static_cast<int64_t>(h) * p.tq + s.q0 + i] =
              empty ? -INFINITY : (mx + log2f(sum)) * kLn2;
      }
    }
}

template <typename T, int D>
__global__ void __launch_bounds__(FwdCfg<D>::kThreads) attention_fwd_mma_kernel(const FwdParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int h = blockIdx.x % p.hq, b = blockIdx.x / p.hq;
  const SeqBounds s = seq_bounds(p.cu_q, p.cu_k, b, p.tq, p.tk);
  const int nblocks = (s.lq + FwdCfg<D>::kBr - 1) / FwdCfg<D>::kBr;
  for (int rank = blockIdx.z; rank < nblocks; rank += gridDim.z) {
    // Heaviest first: with a causal mask the last query block sees the most keys.
    const int m = p.causal ? nblocks - 1 - rank : rank;
    fwd_tile<T, D>(p, s, h, m, smem);
    __syncthreads();  // the next tile reuses shared memory
  }
}

template <typename T, int D>
void attention_fwd_mma_launch(const FwdParams& p, int64_t max_seqlen_q, cudaStream_t stream) {
  using C = FwdCfg<D>;
  auto kernel = attention_fwd_mma_kernel<T, D>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  const dim3 grid(static_cast<unsigned>(p.batch * p.hq), 1, rank_grid(max_seqlen_q, C::kBr));
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void fwd_mma_dispatch(const FwdParams& p, int64_t d, int64_t max_q, cudaStream_t s) {
  if (d == 64)
    attention_fwd_mma_launch<T, 64>(p, max_q, s);
  else
    attention_fwd_mma_launch<T, 128>(p, max_q, s);
}

}  // namespace

void fwd_mma(const FwdParams& p, DType dt, int64_t head_dim, int64_t max_seqlen_q,
             cudaStream_t stream) {
  if (dt == DType::kBF16)
    fwd_mma_dispatch<__nv_bfloat16>(p, head_dim, max_seqlen_q, stream);
  else
    fwd_mma_dispatch<__half>(p, head_dim, max_seqlen_q, stream);
}

}  // namespace leantune::kernels::attention_detail
