// Attention on cuDNN's fused SDPA (flash attention inside cuDNN, tuned per GPU by NVIDIA): the
// packed variable-length batch of kernels/attention.h as one cuDNN frontend graph per shape
// bucket, forward and backward. Contract and restrictions: kernels/attention_cudnn.h.
//
// Two forms of graph express the batch:
// - Ragged ("THD"), any packing: each operand is a [B, H, S, D] tensor with strides
//   [S*stride, D, stride, 1] plus a ragged-offset tensor [B+1] i64 that places sequence b at
//   element cu[b] * stride, and a padding mask with per-sequence lengths seq_len:[B] i32. The
//   softmax statistics (cuDNN's "Stats", the natural-log log-sum-exp of the scaled scores, f32)
//   are ragged too, token-major [T, Hq].
// - Dense, when every sequence has the longest length S and together they cover every row
//   (T == B * S == cu[B], so cu is 0, S, 2S, ...; kernels::dense_batch):
//   the same [B, H, S, D] operands with no offsets, lengths or padding mask (the layout torch's
//   cuDNN SDPA hands it), and statistics packed [B, Hq, S, 1].
// Our lse is [Hq, T]; the engine's strided copy moves it into the statistics' layout before the
// backward and back after the forward (an f32 workspace of T * Hq). Causal masks are top-left
// aligned: the path's query and key sequences coincide, where top-left and bottom-right masks are
// one mask, and top-left is the alignment torch and Transformer Engine use. A sliding window is
// the diagonal band's left bound (key j kept when j > i - window), as in kernels/attention.h.
// LEANTUNE_CUDNN_GRAPH=ragged forces the ragged form, =ragged_bottom_right also the bottom-right
// alignment (bench_attention compares the three; the gpu tests run each).
//
// Shape buckets: a graph is built (validated, planned by heuristics mode A, compiled) once per
// (device, direction, form, dtype, heads, head_dim, strides, mask, scale, B bucket, S bucket, T
// bucket) and cached for the process. Ragged: B is rounded up to a power of two (the padding
// entries get length 0), S (the longest sequence) and T (the packed rows, cuDNN's workspace
// bound) to a power of two too, so that a run with varying packing builds a handful of graphs,
// not one per step. Dense: B and S as they are, for at most 16 shapes per process (later ones
// take the ragged form). A shape cuDNN refuses is cached as refused: a refused dense graph is
// retried in the ragged form, a refused ragged one sends the caller to its own kernel at once.
//
// Scratch (kWorkspace): seq_len and the ragged offsets (a few KiB), the T * Hq f32 statistics,
// and cuDNN's own workspace (the backward's dQ accumulator among others), all from the caching
// allocator. cuDNN is loaded with dlopen (the frontend's dynamic loading), so that a machine
// without it still runs our kernels.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "engine/cuda_utils.cuh"
#include "kernels/attention_cudnn.h"
#include "kernels/attention_ragged.h"

#if LEANTUNE_WITH_CUDNN_FRONTEND
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>

// The frontend's handle on the dlopen'ed library (it calls every cuDNN function through it).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace leantune::kernels::cudnn_sdpa {
namespace {

std::atomic<int64_t> g_calls{0}, g_dense_calls{0};

#if LEANTUNE_WITH_CUDNN_FRONTEND

// ---------------------------------------------------------------- kernels

constexpr int kMaxRagged = 9;  // backward: q, k, v, o, dO, stats, dq, dk, dv
struct RaggedMult {
  int64_t mult[kMaxRagged];
  int n;
};

// seq[b] (b < nb) = ragged_len, off[k][b] (b <= nb) = ragged_start * mult[k]
// (kernels/attention_ragged.h: cu clamped, padding entries empty, lengths clipped to cap).
__global__ void ragged_prep_kernel(const int32_t* __restrict__ cu, int batch, int nb, int64_t t,
                                   int64_t cap, int32_t* __restrict__ seq,
                                   int64_t* __restrict__ off, RaggedMult m) {
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b <= nb; b += gridDim.x * blockDim.x) {
    const int64_t start = ragged_start(cu, b, batch, t);
    if (b < nb) seq[b] = static_cast<int32_t>(ragged_len(cu, b, batch, t, cap));
    for (int k = 0; k < m.n; ++k) off[static_cast<int64_t>(k) * (nb + 1) + b] = start * m.mult[k];
  }
}

// The device buffers one call hands cuDNN besides the operands: seq_len [nb] i32 and the ragged
// offsets [n][nb + 1] i64, in one workspace.
struct Ragged {
  Tensor buf;
  int32_t* seq = nullptr;
  int64_t* off = nullptr;
  int nb = 0;
  int64_t* offsets(int k) const { return off + static_cast<int64_t>(k) * (nb + 1); }
};

Ragged ragged(const Problem& p, int nb, int64_t cap, const std::vector<int64_t>& mult) {
  LT_CHECK(mult.size() <= static_cast<size_t>(kMaxRagged), "attention (cuDNN): too many operands");
  Ragged r;
  r.nb = nb;
  const int64_t seq_bytes = (static_cast<int64_t>(nb) * 4 + 15) / 16 * 16;
  const int64_t bytes = seq_bytes + static_cast<int64_t>(mult.size()) * (nb + 1) * 8;
  r.buf = cu::workspace(static_cast<size_t>(bytes), p.dev);
  auto* base = static_cast<uint8_t*>(r.buf.data_ptr());
  r.seq = reinterpret_cast<int32_t*>(base);
  r.off = reinterpret_cast<int64_t*>(base + seq_bytes);
  RaggedMult m{};
  m.n = static_cast<int>(mult.size());
  for (size_t k = 0; k < mult.size(); ++k) m.mult[k] = mult[k];
  const int threads = 128;
  const int blocks = static_cast<int>(std::min<int64_t>((nb + threads) / threads, 1024));
  ragged_prep_kernel<<<blocks, threads, 0, p.stream>>>(p.cu, p.batch, nb, p.t, cap, r.seq, r.off,
                                                       m);
  CUDA_CHECK_LAUNCH();
  return r;
}

namespace fe = cudnn_frontend;
using TensorAttr = fe::graph::Tensor_attributes;
using TensorPtr = std::shared_ptr<TensorAttr>;

// ---------------------------------------------------------------- the library and handles

struct Library {
  bool ok = false;
  std::string why;
};

const Library& library() {
  static const Library lib = [] {
    Library l;
    const char* env = std::getenv("LEANTUNE_CUDNN_LIBRARY");
    std::vector<std::string> names;
    if (env && *env)
      names.push_back(env);
    else
      names = {"libcudnn.so.9", "libcudnn.so"};
    void* h = nullptr;
    std::string errors;
    for (const std::string& n : names) {
      h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h) break;
      const char* e = dlerror();
      errors += (errors.empty() ? "" : "; ") + std::string(e ? e : n.c_str());
    }
    if (!h) {
      l.why = "cuDNN 9 not found (" + errors +
              "); put libcudnn.so.9 on LD_LIBRARY_PATH or name it in LEANTUNE_CUDNN_LIBRARY";
      return l;
    }
    fe::cudnn_dlhandle = h;
    // The frontend opens the CUDA runtime itself: pin it to the one this library runs on.
    const std::string cudart = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), 0);
    try {
      const size_t v = fe::detail::get_backend_version();
      if (v < 90000) {
        l.why = "cuDNN " + std::to_string(v) + " is older than 9.0";
        return l;
      }
    } catch (const std::exception& e) {
      l.why = std::string("cuDNN loaded but unusable: ") + e.what();
      return l;
    }
    l.ok = true;
    return l;
  }();
  return lib;
}

// One handle per device; cudnnSetStream and the execution it precedes happen under its mutex.
struct Handle {
  cudnnHandle_t h = nullptr;
  std::mutex mu;
};

Handle& handle(Device dev) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<Handle>> handles;
  std::lock_guard<std::mutex> lk(mu);
  std::unique_ptr<Handle>& slot = handles[dev.index];
  if (!slot) {
    auto h = std::make_unique<Handle>();
    const cudnnStatus_t st = fe::detail::create_handle(&h->h);
    LT_CHECK(st == CUDNN_STATUS_SUCCESS, "attention (cuDNN): cudnnCreate failed on ", dev.str(),
             ": status ", static_cast<int>(st));
    slot = std::move(h);
  }
  return *slot;
}

// ---------------------------------------------------------------- graphs

enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSeqQ,
  kSeqKV,
  kOff = 20,  // kOff + k: the ragged offsets of operand k, in the order of Ragged
};

constexpr size_t kMaxDenseShapes = 16;

// How a call's graph expresses its batch (the file comment): dense or ragged, and the causal
// diagonal's alignment.
struct Form {
  bool dense = false;
  bool top_left = true;
};

Form form_of(const Problem& p) {
  const char* env = std::getenv("LEANTUNE_CUDNN_GRAPH");
  const std::string v = env ? env : "";
  Form f;
  if (v == "ragged" || v == "ragged_bottom_right") {
    f.top_left = v == "ragged";
    return f;
  }
  LT_CHECK_INPUT(v.empty() || v == "auto", "LEANTUNE_CUDNN_GRAPH=", v,
                 ": expected auto, ragged or ragged_bottom_right");
  if (!dense_batch(p.batch, p.t, p.max_seqlen, p.covered)) return f;
  // Dense graphs are built per exact (B, S), not per bucket: past kMaxDenseShapes of them, new
  // shapes take the ragged form, so that a run whose equal-length batches keep changing shape
  // does not build a graph per step.
  static std::mutex mu;
  static std::set<std::pair<int, int64_t>> admitted;
  std::lock_guard<std::mutex> lk(mu);
  const std::pair<int, int64_t> shape{p.batch, p.max_seqlen};
  if (admitted.count(shape) == 0 && admitted.size() < kMaxDenseShapes) admitted.insert(shape);
  f.dense = admitted.count(shape) > 0;
  return f;
}

// A call's graph: its form and its B, S and T (buckets when ragged, the batch's own when dense).
struct GraphShape {
  Form form;
  int nb = 0;
  int64_t s = 0, tcap = 0;
};

GraphShape shape_in(const Problem& p, Form f) {
  GraphShape g;
  g.form = f;
  if (g.form.dense) {
    g.nb = p.batch;
    g.s = p.max_seqlen;
    g.tcap = p.t;
  } else {
    g.nb = static_cast<int>(pow2_bucket(p.batch, 1));
    g.s = pow2_bucket(p.max_seqlen, 64);
    g.tcap = pow2_bucket(p.t, 64);
  }
  return g;
}

struct Key {
  int dev = 0, backward = 0, dense = 0, top_left = 0, dtype = 0;
  int64_t nb = 0, s = 0, tcap = 0, hq = 0, hk = 0, d = 0, window = 0;
  int causal = 0;
  uint32_t scale_bits = 0;
  std::vector<int64_t> strides;
  auto tie() const {
    return std::tie(dev, backward, dense, top_left, dtype, nb, s, tcap, hq, hk, d, window, causal,
                    scale_bits, strides);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Graph {
  std::shared_ptr<fe::graph::Graph> g;
  int64_t workspace = 0;
  bool ok = false;
  std::string why;
};

Key make_key(const Problem& p, const GraphShape& gs, bool backward, std::vector<int64_t> strides) {
  Key k;
  k.dev = p.dev.index;
  k.backward = backward ? 1 : 0;
  k.dense = gs.form.dense ? 1 : 0;
  k.top_left = gs.form.top_left ? 1 : 0;
  k.dtype = static_cast<int>(p.dtype);
  k.nb = gs.nb;
  k.s = gs.s;
  k.tcap = gs.tcap;
  k.hq = p.hq;
  k.hk = p.hk;
  k.d = p.d;
  k.window = p.window;
  k.causal = p.causal ? 1 : 0;
  std::memcpy(&k.scale_bits, &p.scale, 4);
  k.strides = std::move(strides);
  return k;
}

// A ragged graph's common inputs: seq_len twice (q and kv) and one ragged-offset tensor per
// operand. A dense graph has none.
struct Inputs {
  TensorPtr seq_q, seq_kv;
  std::vector<TensorPtr> off;
  TensorPtr offset(size_t k) const { return k < off.size() ? off[k] : nullptr; }
};

Inputs graph_inputs(fe::graph::Graph& g, const Form& f, int64_t nb, int n_ragged) {
  Inputs in;
  if (f.dense) return in;
  auto seq = [&](const char* name, int64_t uid) {
    return g.tensor(TensorAttr()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({nb, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::INT32));
  };
  in.seq_q = seq("seq_q", kSeqQ);
  in.seq_kv = seq("seq_kv", kSeqKV);
  for (int k = 0; k < n_ragged; ++k)
    in.off.push_back(g.tensor(TensorAttr()
                                  .set_name("ragged_offset_" + std::to_string(k))
                                  .set_uid(kOff + k)
                                  .set_dim({nb + 1, 1, 1, 1})
                                  .set_stride({1, 1, 1, 1})
                                  .set_data_type(fe::DataType_t::INT64)));
  return in;
}

// A [nb, h, s, d] operand with row stride `stride` (elements), ragged when `off` is set.
TensorAttr& shape_rows(TensorAttr& t, int64_t nb, int64_t h, int64_t s, int64_t d, int64_t stride,
                       const TensorPtr& off) {
  t.set_dim({nb, h, s, d}).set_stride({s * stride, d, stride, 1});
  return off ? t.set_ragged_offset(off) : t;
}

// An output operand of a graph: marked, given its uid and its ragged rows.
void output_rows(const TensorPtr& t, int64_t uid, int64_t nb, int64_t h, int64_t s, int64_t d,
                 int64_t stride, const TensorPtr& off) {
  t->set_output(true).set_uid(uid);
  shape_rows(*t, nb, h, s, d, stride, off);
}

TensorPtr input_rows(fe::graph::Graph& g, const char* name, int64_t uid, int64_t nb, int64_t h,
                     int64_t s, int64_t d, int64_t stride, const TensorPtr& off) {
  TensorAttr t;
  t.set_name(name).set_uid(uid);
  shape_rows(t, nb, h, s, d, stride, off);
  return g.tensor(t);
}

// The statistics [nb, hq, s, 1] f32: ragged token-major ([T, Hq] rows), or dense packed.
void set_stats_layout(TensorAttr& t, int64_t nb, int64_t hq, int64_t s, const TensorPtr& off) {
  t.set_dim({nb, hq, s, 1}).set_data_type(fe::DataType_t::FLOAT);
  if (off)
    t.set_stride({s * hq, 1, hq, 1}).set_ragged_offset(off);
  else
    t.set_stride({hq * s, s, 1, 1});
}

template <typename Attr>
void set_mask(Attr& a, const Problem& p, const Form& f, const Inputs& in, int64_t tcap) {
  a.set_attn_scale(p.scale);
  if (!f.dense) {
    a.set_padding_mask(true).set_seq_len_q(in.seq_q).set_seq_len_kv(in.seq_kv);
    a.set_max_total_seq_len_q(tcap).set_max_total_seq_len_kv(tcap);
  }
  if (p.causal) {
    a.set_diagonal_alignment(f.top_left ? fe::DiagonalAlignment_t::TOP_LEFT
                                        : fe::DiagonalAlignment_t::BOTTOM_RIGHT);
    a.set_diagonal_band_right_bound(0);
    // A window past int's range covers any sequence cuDNN takes: clamped, not wrapped.
    if (p.window > 0)
      a.set_diagonal_band_left_bound(
          static_cast<int>(std::min<int64_t>(p.window, std::numeric_limits<int>::max())));
  }
}

// Validates, plans and compiles; false with the frontend's message when cuDNN refuses.
bool finish(Graph& out, Handle& h) {
  auto step = [&](fe::error_t st, const char* what) {
    if (st.is_good()) return true;
    out.why = std::string(what) + ": " + st.get_message();
    return false;
  };
  fe::graph::Graph& g = *out.g;
  if (!step(g.validate(), "validate")) return false;
  if (!step(g.build_operation_graph(h.h), "operation graph")) return false;
  if (!step(g.create_execution_plans({fe::HeurMode_t::A}), "execution plans")) return false;
  if (!step(g.check_support(h.h), "support")) return false;
  if (!step(g.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "plans")) return false;
  int64_t ws = 0;
  if (!step(g.get_workspace_size(ws), "workspace size")) return false;
  out.workspace = ws;
  out.ok = true;
  return true;
}

fe::DataType_t io_type(DType dt) {
  return dt == DType::kF16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

std::shared_ptr<fe::graph::Graph> new_graph(DType dt) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io_type(dt))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// Ragged operand order. Forward: q, k, v, o, stats. Backward: q, k, v, o, dO, stats, dq, dk, dv.
struct Qkv {
  TensorPtr q, k, v;
};

Qkv qkv_inputs(fe::graph::Graph& g, const Problem& p, int nb, int64_t s,
               const std::vector<int64_t>& st, const Inputs& in) {
  return {input_rows(g, "q", kQ, nb, p.hq, s, p.d, st[0], in.offset(0)),
          input_rows(g, "k", kK, nb, p.hk, s, p.d, st[1], in.offset(1)),
          input_rows(g, "v", kV, nb, p.hk, s, p.d, st[2], in.offset(2))};
}

Graph build_fwd(const Problem& p, const GraphShape& gs, const std::vector<int64_t>& st, Handle& h) {
  const int nb = gs.nb;
  const int64_t s = gs.s;
  Graph out;
  out.g = new_graph(p.dtype);
  fe::graph::Graph& g = *out.g;
  const Inputs in = graph_inputs(g, gs.form, nb, 5);
  const Qkv x = qkv_inputs(g, p, nb, s, st, in);
  fe::graph::SDPA_attributes a;
  a.set_name("sdpa").set_generate_stats(true);
  set_mask(a, p, gs.form, in, gs.tcap);
  auto [o, stats] = g.sdpa(x.q, x.k, x.v, a);
  output_rows(o, kO, nb, p.hq, s, p.d, st[3], in.offset(3));
  stats->set_output(true).set_uid(kStats);
  set_stats_layout(*stats, nb, p.hq, s, in.offset(4));
  finish(out, h);
  return out;
}

Graph build_bwd(const Problem& p, const GraphShape& gs, const std::vector<int64_t>& st, Handle& h) {
  const int nb = gs.nb;
  const int64_t s = gs.s;
  Graph out;
  out.g = new_graph(p.dtype);
  fe::graph::Graph& g = *out.g;
  const Inputs in = graph_inputs(g, gs.form, nb, 9);
  const Qkv x = qkv_inputs(g, p, nb, s, st, in);
  const TensorPtr o = input_rows(g, "o", kO, nb, p.hq, s, p.d, st[3], in.offset(3));
  const TensorPtr dout = input_rows(g, "dO", kDO, nb, p.hq, s, p.d, st[4], in.offset(4));
  TensorAttr stats_attr;
  stats_attr.set_name("stats").set_uid(kStats);
  set_stats_layout(stats_attr, nb, p.hq, s, in.offset(5));
  const TensorPtr stats = g.tensor(stats_attr);
  fe::graph::SDPA_backward_attributes a;
  a.set_name("sdpa_backward");
  set_mask(a, p, gs.form, in, gs.tcap);
  auto [dq, dk, dv] = g.sdpa_backward(x.q, x.k, x.v, o, dout, stats, a);
  output_rows(dq, kDQ, nb, p.hq, s, p.d, st[6], in.offset(6));
  output_rows(dk, kDK, nb, p.hk, s, p.d, st[7], in.offset(7));
  output_rows(dv, kDV, nb, p.hk, s, p.d, st[8], in.offset(8));
  finish(out, h);
  return out;
}

// The cached graph of this problem (built on first use; a refusal is cached too).
std::shared_ptr<Graph> graph_for(const Problem& p, const GraphShape& gs, bool backward,
                                 const std::vector<int64_t>& strides, Handle& h) {
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<Graph>> cache;
  const Key key = make_key(p, gs, backward, strides);
  std::lock_guard<std::mutex> lk(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  // Building uses the handle, which another thread may be executing a graph on (under h.mu).
  std::lock_guard<std::mutex> hk(h.mu);
  auto built = std::make_shared<Graph>(backward ? build_bwd(p, gs, strides, h)
                                                : build_fwd(p, gs, strides, h));
  cache.emplace(key, built);
  return built;
}

// Runs a built graph with the operands of `ptrs` (uid -> device pointer) on p.stream.
void execute(const Problem& p, const Graph& graph, Handle& h,
             std::unordered_map<int64_t, void*>& ptrs, const char* what) {
  Tensor ws;
  if (graph.workspace > 0) ws = cu::workspace(static_cast<size_t>(graph.workspace), p.dev);
  std::lock_guard<std::mutex> lk(h.mu);
  const cudnnStatus_t st = fe::detail::set_stream(h.h, p.stream);
  LT_CHECK(st == CUDNN_STATUS_SUCCESS, what, ": cudnnSetStream failed: status ",
           static_cast<int>(st));
  fe::error_t r = graph.g->execute(h.h, ptrs, ws.defined() ? ws.data_ptr() : nullptr);
  LT_CHECK(r.is_good(), what, ": cuDNN failed: ", r.get_message());
  g_calls.fetch_add(1, std::memory_order_relaxed);
}

// The graph of this problem (null, with the reason, when cuDNN cannot run it). `strides` are the
// operands' row strides in the graph's order.
std::shared_ptr<Graph> graph_of(const Problem& p, const GraphShape& gs, bool backward,
                                const std::vector<int64_t>& strides, std::string* why) {
  if (!available(p.dev, why)) return nullptr;
  if (p.batch <= 0 || p.t <= 0) {
    *why = "empty batch";
    return nullptr;
  }
  std::shared_ptr<Graph> graph = graph_for(p, gs, backward, strides, handle(p.dev));
  if (graph->ok) return graph;
  *why = graph->why;
  return nullptr;
}

// The call's graph shape and graph: the form form_of picks, and when cuDNN refuses a dense graph,
// the ragged form of the same batch before giving up (null, with the reason).
std::shared_ptr<Graph> choose_graph(const Problem& p, bool backward,
                                    const std::vector<int64_t>& strides, GraphShape* gs,
                                    std::string* why) {
  Form f = form_of(p);
  *gs = shape_in(p, f);
  std::shared_ptr<Graph> graph = graph_of(p, *gs, backward, strides, why);
  if (graph || !f.dense) return graph;
  f.dense = false;
  *gs = shape_in(p, f);
  return graph_of(p, *gs, backward, strides, why);
}

// Runs `graph` with the operands of `ptrs`, adding a ragged graph's sequence lengths and offsets.
void run(const Problem& p, const GraphShape& gs, const Graph& graph,
         const std::vector<int64_t>& strides, std::unordered_map<int64_t, void*> ptrs,
         const char* what) {
  Ragged r;
  if (!gs.form.dense) {
    r = ragged(p, gs.nb, gs.s, strides);
    ptrs[kSeqQ] = r.seq;
    ptrs[kSeqKV] = r.seq;
    for (size_t i = 0; i < strides.size(); ++i)
      ptrs[kOff + static_cast<int64_t>(i)] = r.offsets(static_cast<int>(i));
  }
  execute(p, graph, handle(p.dev), ptrs, what);
  if (gs.form.dense) g_dense_calls.fetch_add(1, std::memory_order_relaxed);
}

// The statistics buffer of a call ([T, Hq] ragged, [B, Hq, S] dense), and our lse [Hq, T] viewed
// in its layout, for the strided copies between them.
Tensor stats_buffer(const Problem& p, const GraphShape& gs) {
  return gs.form.dense ? Tensor::empty({gs.nb, p.hq, gs.s}, DType::kF32, p.dev, MemTag::kWorkspace)
                       : Tensor::empty({p.t, p.hq}, DType::kF32, p.dev, MemTag::kWorkspace);
}

Tensor lse_as_stats(const Tensor& lse, const GraphShape& gs) {
  if (!gs.form.dense) return lse.transpose(0, 1);
  const Shape& st = lse.strides();
  return make_view(lse, {gs.nb, lse.size(0), gs.s}, {gs.s * st[1], st[0], st[1]}, lse.offset());
}

#endif  // LEANTUNE_WITH_CUDNN_FRONTEND

}  // namespace

int64_t calls() { return g_calls.load(std::memory_order_relaxed); }
int64_t dense_calls() { return g_dense_calls.load(std::memory_order_relaxed); }

#if LEANTUNE_WITH_CUDNN_FRONTEND

bool available(Device dev, std::string* why) {
  const Library& lib = library();
  if (!lib.ok) {
    if (why) *why = lib.why;
    return false;
  }
  if (cu::device_info(dev.index).major < 8) {
    if (why) *why = "cuDNN's fused attention needs sm_80 or newer";
    return false;
  }
  return true;
}

bool fwd(const Problem& p, Rows q, Rows k, Rows v, void* out, const Tensor& lse, std::string* why) {
  const std::vector<int64_t> strides = {q.stride, k.stride, v.stride, p.hq * p.d, p.hq};
  GraphShape gs;
  const std::shared_ptr<Graph> graph = choose_graph(p, false, strides, &gs, why);
  if (!graph) return false;
  Tensor stats = stats_buffer(p, gs);
  run(p, gs, *graph, strides,
      {{kQ, const_cast<void*>(q.ptr)},
       {kK, const_cast<void*>(k.ptr)},
       {kV, const_cast<void*>(v.ptr)},
       {kO, out},
       {kStats, stats.data_ptr()}},
      "attention_fwd_cuda");
  ops::copy(lse_as_stats(lse, gs), stats);
  return true;
}

bool bwd(const Problem& p, Rows q, Rows k, Rows v, Rows out, Rows dout, const Tensor& lse, void* dq,
         void* dk, void* dv, std::string* why) {
  const std::vector<int64_t> strides = {q.stride, k.stride,   v.stride,   out.stride, dout.stride,
                                        p.hq,     p.hq * p.d, p.hk * p.d, p.hk * p.d};
  GraphShape gs;
  const std::shared_ptr<Graph> graph = choose_graph(p, true, strides, &gs, why);
  if (!graph) return false;
  Tensor stats = stats_buffer(p, gs);
  ops::copy(stats, lse_as_stats(lse, gs));
  run(p, gs, *graph, strides,
      {{kQ, const_cast<void*>(q.ptr)},
       {kK, const_cast<void*>(k.ptr)},
       {kV, const_cast<void*>(v.ptr)},
       {kO, const_cast<void*>(out.ptr)},
       {kDO, const_cast<void*>(dout.ptr)},
       {kStats, stats.data_ptr()},
       {kDQ, dq},
       {kDK, dk},
       {kDV, dv}},
      "attention_bwd_cuda");
  return true;
}

#else  // built without the frontend headers

bool available(Device, std::string* why) {
  if (why)
    *why = "leantune was built without the cuDNN frontend headers (scripts/cudnn_frontend.sh)";
  return false;
}
bool fwd(const Problem&, Rows, Rows, Rows, void*, const Tensor&, std::string* why) {
  return available(Device::cpu(), why);
}
bool bwd(const Problem&, Rows, Rows, Rows, Rows, Rows, const Tensor&, void*, void*, void*,
         std::string* why) {
  return available(Device::cpu(), why);
}

#endif

}  // namespace leantune::kernels::cudnn_sdpa
