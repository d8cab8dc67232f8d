#!/usr/bin/env python3
"""torch's scaled_dot_product_attention on the shapes of bench_attention (the yardstick of its
figures): bf16, causal, 4 sequences of 8192 tokens with head_dim 128 (16 query / 8 KV heads) and
head_dim 64 (32 / 16 heads), once per SDPA backend (cudnn, flash). Same FLOP count as
bench_attention: forward 4 L^2 D Hq / 2 per sequence, backward 2.5 x forward; CUDA events, 2
warm-ups, median of --reps calls. The backward is timed alone (autograd.grad from a saved graph).

Prints one JSON object: {"figures": {"torch_<backend>_attention_<fwd|bwd>_tflops[_hd64]": ...},
"errors": {...}, "torch": version}, or {"error": ...} without torch or a GPU.
"""
import argparse
import json
import sys


def median_ms(torch, fn, reps):
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def run(torch, backend, hq, hk, d, seqs, seq_len, reps):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    kind = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(seqs, hq, seq_len, d, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(seqs, hk, seq_len, d, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(seqs, hk, seq_len, d, device=dev, dtype=dt, requires_grad=True)
    dout = torch.randn(seqs, hq, seq_len, d, device=dev, dtype=dt)
    with sdpa_kernel([kind]):
        def fwd():
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        fwd_ms = median_ms(torch, fwd, reps)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        def bwd():
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

        bwd_ms = median_ms(torch, bwd, reps)
    flops = 4.0 * seq_len * seq_len * d * hq / 2.0 * seqs
    return flops / (fwd_ms * 1e-3) / 1e12, 2.5 * flops / (bwd_ms * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(json.dumps({"error": f"torch not importable: {e}"}))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 0
    figures, errors = {}, {}
    for backend in ("cudnn", "flash"):
        for suffix, hq, hk, d in (("", 16, 8, 128), ("_hd64", 32, 16, 64)):
            name = f"torch_{backend}_attention"
            try:
                f, b = run(torch, backend, hq, hk, d, 4, 8192, args.reps)
                figures[f"{name}_fwd_tflops{suffix}"] = f
                figures[f"{name}_bwd_tflops{suffix}"] = b
                print(f"{name}{suffix}: fwd {f:.1f} TFLOP/s, bwd {b:.1f} TFLOP/s", file=sys.stderr)
            except Exception as e:  # a backend that does not support the shape on this GPU
                errors[f"{name}{suffix}"] = str(e).splitlines()[0][:300]
            torch.cuda.empty_cache()
    print(json.dumps({"figures": figures, "errors": errors, "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
