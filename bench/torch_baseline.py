#!/usr/bin/env python3
"""PyTorch + transformers baseline for bench_train_step: the same model and batch shape.

A Hugging Face config.json (bench/configs/*.json) becomes a randomly initialised
AutoModelForCausalLM built directly on the GPU with sdpa attention; parameters are fp32 (the
master copy) and the step runs under bf16 autocast, as the HF Trainer does with bf16=True;
torch.optim.AdamW (fused). The batch is --seqs sequences of --seq-len random tokens with random
labels (the model shifts them, as leantune does within each packed sequence), so attention sees
the same sequences as leantune's packed batch with cu_seqlens {0, L, 2L, ...}. Eager mode (no
torch.compile).

Gradient checkpointing: "off", "on", or "auto" (off, then on after an out-of-memory error).

Prints progress on stderr and one JSON object as the last line of stdout:
  {"tokens_per_s", "step_s", "peak_gib" (torch.cuda.max_memory_allocated over the run, model
   creation included), "gradient_checkpointing", "oom_without_checkpointing", "loss",
   "torch", "transformers", "device"}
or {"error": "..."} when torch/transformers are missing or the step cannot run.
"""
import argparse
import gc
import json
import sys
import time


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def build_model(torch, transformers, config_path, checkpointing):
    with open(config_path) as f:
        cfg_dict = json.load(f)
    cfg = transformers.AutoConfig.for_model(
        **{k: v for k, v in cfg_dict.items() if k not in ("architectures", "transformers_version")}
    )
    cfg.use_cache = False
    kwargs = {"attn_implementation": "sdpa"}
    with torch.device("cuda"):
        try:
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, **kwargs)
        except TypeError:  # transformers < 4.56 names it torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, torch_dtype=torch.float32, **kwargs
            )
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    return model, cfg


def run(torch, transformers, args, checkpointing):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model, cfg = build_model(torch, transformers, args.config, checkpointing)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    gen = torch.Generator(device="cuda").manual_seed(99)
    shape = (args.seqs, args.seq_len)
    ids = torch.randint(0, cfg.vocab_size, shape, device="cuda", generator=gen)
    labels = torch.randint(0, cfg.vocab_size, shape, device="cuda", generator=gen)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=labels, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.detach()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = None
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0) / args.steps
    result = {
        "tokens_per_s": args.seqs * args.seq_len / step_s,
        "step_s": step_s,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "gradient_checkpointing": checkpointing,
        "loss": float(loss),
    }
    del model, opt, ids, labels
    torch.cuda.empty_cache()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="a Hugging Face config.json")
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--gradient-checkpointing", choices=["off", "on", "auto"], default="auto")
    args = ap.parse_args()
    try:
        import torch
        import transformers
    except Exception as e:  # noqa: BLE001 - any import failure means no baseline
        print(json.dumps({"error": "torch/transformers not importable: %s" % e}))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no CUDA device"}))
        return 0
    modes = {"off": [False], "on": [True], "auto": [False, True]}[args.gradient_checkpointing]
    oom_without = False
    result = None
    for checkpointing in modes:
        try:
            log("torch baseline: %s, gradient checkpointing %s" % (args.config, checkpointing))
            result = run(torch, transformers, args, checkpointing)
            break
        except torch.cuda.OutOfMemoryError as e:
            log("torch baseline: out of memory (%s)" % str(e).splitlines()[0])
            if not checkpointing:
                oom_without = True
        except Exception as e:  # noqa: BLE001 - reported in the JSON
            print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}))
            return 0
        # The failed attempt's tensors are only unreachable once the exception is gone.
        gc.collect()
        torch.cuda.empty_cache()
    if result is None:
        print(
            json.dumps(
                {"error": "out of memory in every mode tried", "oom_without_checkpointing": oom_without}
            )
        )
        return 0
    result["oom_without_checkpointing"] = oom_without
    result["torch"] = torch.__version__
    result["transformers"] = transformers.__version__
    result["device"] = torch.cuda.get_device_name(0)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
