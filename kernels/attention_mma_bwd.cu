// The tensor-core attention backward (FA2 style, KV-block parallel; design in
// kernels/attention.cu): one CTA per (sequence, KV head, block of kBc keys), dK/dV summed over the
// GQA group in registers, dQ added with f32 atomics.
#include "kernels/acc_math.cuh"
#include "kernels/attention_mma.cuh"

namespace leantune::kernels::attention_detail {
namespace {

// ---------------------------------------------------------------- tensor-core backward

template <typename T, int D, int W>
__device__ __forceinline__ void bwd_tile(const BwdParams& p, const SeqBounds& s, int hk, int n,
                                         unsigned char* smem) {
  using C = BwdCfg<D, W>;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int j0 = n * C::kBc;
  const int shift = s.lk - s.lq;
  // Query blocks that see at least one key of this block (with a sliding window, query i sees
  // key j only while i < j - shift + window).
  const bool windowed = p.causal && p.window > 0;
  const int m_start = p.causal ? max(0, j0 - shift) / C::kBr : 0;
  const int i_end = windowed ? min(s.lq, j0 + C::kBc - 1 - shift + p.window) : s.lq;
  const int m_end = i_end > 0 ? (i_end + C::kBr - 1) / C::kBr : 0;
  const int nm = max(0, m_end - m_start);
  const int total = nm * p.group;

  const T* qbase = static_cast<const T*>(p.q);
  const T* kbase = static_cast<const T*>(p.k);
  const T* vbase = static_cast<const T*>(p.v);
  const T* dobase = static_cast<const T*>(p.dout);

  const uint32_t k_s = smem_u32(smem);
  const uint32_t v_s = k_s + C::kKBytes;
  const uint32_t q_s0 = v_s + C::kKBytes;  // Q0, Q1, dO0, dO1
  auto q_buf = [&](int buf) { return q_s0 + buf * C::kQBytes; };
  auto do_buf = [&](int buf) { return q_s0 + (2 + buf) * C::kQBytes; };
  const uint32_t ds_s = q_s0 + 4 * C::kQBytes;
  unsigned char* ds_ptr = smem + (ds_s - k_s);
  float* lse_s = reinterpret_cast<float*>(smem + (ds_s - k_s) + C::kDsBytes);  // [2][kBr]
  float* dsum_s = lse_s + 2 * C::kBr;                                          // [2][kBr]

  // Iteration `it` covers query head hk*group + it / nm and query block m_start + it % nm.
  auto head_of = [&](int it) { return hk * p.group + it / nm; };
  auto block_of = [&](int it) { return m_start + it % nm; };
  auto load_q = [&](int it, int buf) {
    const int h = head_of(it), i0 = block_of(it) * C::kBr;
    const int64_t row = s.q0 + i0;
    tile_load_async<T, C::kBr, D, C::kThreads>(q_buf(buf), qbase + row * p.q_stride + h * D,
                                               p.q_stride, s.lq - i0, qbase, tid);
    tile_load_async<T, C::kBr, D, C::kThreads>(do_buf(buf), dobase + row * p.do_stride + h * D,
                                               p.do_stride, s.lq - i0, dobase, tid);
  };
  // Row statistics of iteration `it` for row tid (< kBr): plain loads (the per-sequence offsets
  // break 16-byte alignment), stored to shared memory after the step's compute has hidden the
  // latency.
  auto load_stats = [&](int it, float* l2, float* ds) {
    const int h = head_of(it), i = block_of(it) * C::kBr + tid;
    if (i < s.lq) {
      const int64_t idx = static_cast<int64_t>(h) * p.tq + s.q0 + i;
      *l2 = p.lse2[idx];
      *ds = p.dsum[idx];
    } else {
      *l2 = INFINITY;
      *ds = 0.f;
    }
  };

  float dk[C::kDT][4], dv[C::kDT][4];
#pragma unroll
  for (int dt = 0; dt < C::kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dk[dt][e] = 0.f;
      dv[dt][e] = 0.f;
    }

  if (total > 0) {
    const T* kg = kbase + static_cast<int64_t>(s.k0 + j0) * p.k_stride + hk * D;
    const T* vg = vbase + static_cast<int64_t>(s.k0 + j0) * p.v_stride + hk * D;
    tile_load_async<T, C::kBc, D, C::kThreads>(k_s, kg, p.k_stride, s.lk - j0, kbase, tid);
    tile_load_async<T, C::kBc, D, C::kThreads>(v_s, vg, p.v_stride, s.lk - j0, vbase, tid);
    load_q(0, 0);
    cp_async_commit();
    if (tid < C::kBr) load_stats(0, &lse_s[tid], &dsum_s[tid]);
  }

  const int key_row0 = warp * 16;  // this warp's first key row in the block
  const int dq_r = warp % C::kDqRowGroups, dq_c = warp / C::kDqRowGroups;
  const uint32_t kv_a = key_row0 * C::kRowBytes + a_off(lane, C::kRowBytes);
  const uint32_t qb_lane = b_off(lane, C::kRowBytes), qt_lane = bt_off(lane, C::kRowBytes);
  const uint32_t ds_a = ds_s + b_off(lane, C::kDsRowBytes) + dq_r * 32;
  const uint32_t kt_b = k_s + bt_off(lane, C::kRowBytes) + dq_c * C::kDqCols * 2;

  for (int it = 0; it < total; ++it) {
    const int buf = it & 1;
    const int h = head_of(it), i0 = block_of(it) * C::kBr;
    cp_async_wait_all();
    // Step `it`'s Q, dO and statistics are visible; every warp has finished step it-1.
    __syncthreads();
    float next_l2 = 0.f, next_ds = 0.f;
    const bool more = it + 1 < total;
    if (more) {
      load_q(it + 1, buf ^ 1);
      cp_async_commit();
      if (tid < C::kBr) load_stats(it + 1, &next_l2, &next_ds);
    }
    const float* l2 = lse_s + buf * C::kBr;
    const float* dsm = dsum_s + buf * C::kBr;

    const uint32_t qb = q_buf(buf) + qb_lane, dob = do_buf(buf) + qb_lane;
    const uint32_t qt = q_buf(buf) + qt_lane, dot = do_buf(buf) + qt_lane;
    // S^T = K_w Q^T and dP^T = V_w dO^T: 16 keys x kBr queries per warp.
    float st[C::kNT][4], dpt[C::kNT][4];
#pragma unroll
    for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        st[nt][e] = 0.f;
        dpt[nt][e] = 0.f;
      }
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t ak[4], av[4];
      ldmatrix_x4(ak, k_s + kv_a + ks * 32);
      ldmatrix_x4(av, v_s + kv_a + ks * 32);
      mma_rows2<T>(st, ak, dpt, av, [&](int np, uint32_t(&bq)[4], uint32_t(&bd)[4]) {
        const uint32_t off = np * 16 * C::kRowBytes + ks * 32;
        ldmatrix_x4(bq, qb + off);
        ldmatrix_x4(bd, dob + off);
      });
    }

    // P^T from the saved statistics, masked to exact zeros; dS^T = P^T (dP^T - Dsum).
    const bool need_mask = i0 + C::kBr > s.lq || j0 + C::kBc > s.lk ||
                           (p.causal && j0 + C::kBc - 1 > i0 + shift) ||
                           (windowed && j0 <= i0 + C::kBr - 1 + shift - p.window);
#pragma unroll
    for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = nt * 8 + ((lane & 3) << 1) + (e & 1);
        float pv = exp2_ftz(st[nt][e] * p.scale_log2 - l2[qc]);
        if (need_mask) {
          const int j = j0 + key_row0 + (lane >> 2) + ((e >> 1) << 3);
          const int i = i0 + qc;
          if (i >= s.lq || j >= s.lk || (p.causal && j > i + shift) ||
              (windowed && j <= i + shift - p.window))
            pv = 0.f;
        }
        st[nt][e] = pv;
        dpt[nt][e] = pv * (dpt[nt][e] - dsm[qc]);
      }

      // dV += P^T dO and dK += dS^T Q (A operands from the accumulators, B = dO / Q transposed).
#pragma unroll
    for (int kk = 0; kk < C::kBr / 16; ++kk) {
      uint32_t ap[4], as[4];
      acc_to_a<T>(ap, st[2 * kk], st[2 * kk + 1]);
      acc_to_a<T>(as, dpt[2 * kk], dpt[2 * kk + 1]);
      mma_rows2<T>(dv, ap, dk, as, [&](int dp, uint32_t(&bd)[4], uint32_t(&bq)[4]) {
        const uint32_t off = kk * 16 * C::kRowBytes + dp * 32;
        ldmatrix_x4_trans(bd, dot + off);
        ldmatrix_x4_trans(bq, qt + off);
      });
    }

    // dS^T (rounded to T) into shared memory: [kBc keys][kBr queries].
#pragma unroll
    for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int kr = key_row0 + (lane >> 2) + r * 8;
        const int off = kr * C::kDsRowBytes + nt * 16 + ((lane & 3) << 2);
        *reinterpret_cast<uint32_t*>(ds_ptr + off) = pack2<T>(dpt[nt][2 * r], dpt[nt][2 * r + 1]);
      }
    __syncthreads();

    // dQ[kBr, D] += dS K over the block's keys; this warp: 16 queries x kDqCols columns.
    float dqa[C::kDqNT][4];
#pragma unroll
    for (int dt = 0; dt < C::kDqNT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dqa[dt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < C::kBc / 16; ++kk) {
      uint32_t a[4];
      // A = dS (query rows, key columns) read transposed from dS^T.
      ldmatrix_x4_trans(a, ds_a + kk * 16 * C::kDsRowBytes);
#pragma unroll
      for (int dp = 0; dp < C::kDqNT / 2; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, kt_b + kk * 16 * C::kRowBytes + dp * 32);
        mma_16816<T>(dqa[2 * dp], a, b[0], b[1]);
        mma_16816<T>(dqa[2 * dp + 1], a, b[2], b[3]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = i0 + dq_r * 16 + (lane >> 2) + r * 8;
      if (i < s.lq) {
        float* dst = p.dq_acc + (static_cast<int64_t>(s.q0 + i) * p.hq + h) * D +
                     dq_c * C::kDqCols + ((lane & 3) << 1);
#pragma unroll
        for (int dt = 0; dt < C::kDqNT; ++dt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
          // One 8-byte vector atomic per pair (sm_90+): the column is even and the row's start a
          // multiple of D, so dst + dt * 8 is 8-byte aligned.
          atomicAdd(reinterpret_cast<float2*>(dst + dt * 8),
                    make_float2(dqa[dt][2 * r], dqa[dt][2 * r + 1]));
#else
          atomicAdd(dst + dt * 8, dqa[dt][2 * r]);
          atomicAdd(dst + dt * 8 + 1, dqa[dt][2 * r + 1]);
#endif
        }
      }
    }

    // Statistics of the next step into the other buffer (last read in step it-1).
    if (more && tid < C::kBr) {
      lse_s[(buf ^ 1) * C::kBr + tid] = next_l2;
      dsum_s[(buf ^ 1) * C::kBr + tid] = next_ds;
    }
  }

  // dK * scale and dV for the keys that exist (zeros when no query sees them).
  T* dkp = static_cast<T*>(p.dk);
  T* dvp = static_cast<T*>(p.dv);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = j0 + key_row0 + (lane >> 2) + r * 8;
    if (j < s.lk) {
      const int64_t base = (static_cast<int64_t>(s.k0 + j) * p.hk + hk) * D + ((lane & 3) << 1);
#pragma unroll
      for (int dt = 0; dt < C::kDT; ++dt) {
        *reinterpret_cast<uint32_t*>(dkp + base + dt * 8) =
            pack2<T>(dk[dt][2 * r] * p.scale, dk[dt][2 * r + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dvp + base + dt * 8) =
            pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
      }
    }
  }
}

template <typename T, int D, int W>
__global__ void __launch_bounds__(BwdCfg<D, W>::kThreads, 1)
    attention_bwd_mma_kernel(const BwdParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int hk = blockIdx.x % p.hk, b = blockIdx.x / p.hk;
  const SeqBounds s = seq_bounds(p.cu_q, p.cu_k, b, p.tq, p.tk);
  const int nblocks = (s.lk + BwdCfg<D, W>::kBc - 1) / BwdCfg<D, W>::kBc;
  // Rank order = key block order: with a causal mask the first key block is seen by the most
  // queries.
  for (int n = blockIdx.z; n < nblocks; n += gridDim.z) {
    bwd_tile<T, D, W>(p, s, hk, n, smem);
    __syncthreads();  // the next tile reuses shared memory
  }
}

template <typename T, int D, int W>
void attention_bwd_mma_launch(const BwdParams& p, int64_t max_seqlen_k, cudaStream_t stream) {
  using C = BwdCfg<D, W>;
  auto kernel = attention_bwd_mma_kernel<T, D, W>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  const dim3 grid(static_cast<unsigned>(p.batch * p.hk), 1, rank_grid(max_seqlen_k, C::kBc));
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void bwd_mma_dispatch(const BwdParams& p, int64_t d, int warps, int64_t max_k, cudaStream_t s) {
  if (d == 64)
    attention_bwd_mma_launch<T, 64, 8>(p, max_k, s);
  else if (warps == 8)
    attention_bwd_mma_launch<T, 128, 8>(p, max_k, s);
  else
    attention_bwd_mma_launch<T, 128, 4>(p, max_k, s);
}

}  // namespace

void bwd_mma(const BwdParams& p, DType dt, int64_t head_dim, int warps, int64_t max_seqlen_k,
             cudaStream_t stream) {
  if (dt == DType::kBF16)
    bwd_mma_dispatch<__nv_bfloat16>(p, head_dim, warps, max_seqlen_k, stream);
  else
    bwd_mma_dispatch<__half>(p, head_dim, warps, max_seqlen_k, stream);
}

}  // namespace leantune::kernels::attention_detail
