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

--device cpu (bench/cpu_suite.sh): the same model on the CPU in fp32 (no autocast), with
torch.optim.AdamW's default implementation, --threads intra-op threads, and the tokens of --tokens
(a JSONL file of {"input_ids": [...]} rows of --seq-len tokens, the very rows leantune trains on;
labels = input_ids, shifted by the model as leantune shifts them). peak_gib is then the process's
peak RSS.

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


def build_model(torch, transformers, config_path, checkpointing, device):
    with open(config_path) as f:
        cfg_dict = json.load(f)
    cfg = transformers.AutoConfig.for_model(
        **{k: v for k, v in cfg_dict.items() if k not in ("architectures", "transformers_version")}
    )
    cfg.use_cache = False
    kwargs = {"attn_implementation": "sdpa"}
    with torch.device(device):
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


def token_batches(torch, args):
    """The --tokens file's rows as [seqs, seq_len] batches, one per step (warm-up steps first)."""
    rows = []
    with open(args.tokens) as f:
        for line in f:
            ids = json.loads(line)["input_ids"]
            if len(ids) != args.seq_len:
                raise ValueError("%s: a row of %d tokens, expected --seq-len %d"
                                 % (args.tokens, len(ids), args.seq_len))
            rows.append(ids)
    need = (args.warmup + args.steps) * args.seqs
    if len(rows) < need:
        raise ValueError("%s: %d rows, %d steps of %d need %d"
                         % (args.tokens, len(rows), args.warmup + args.steps, args.seqs, need))
    t = torch.tensor(rows[:need], dtype=torch.long)
    return [t[i * args.seqs:(i + 1) * args.seqs] for i in range(args.warmup + args.steps)]


def run(torch, transformers, args, checkpointing):
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model, cfg = build_model(torch, transformers, args.config, checkpointing, args.device)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True) if cuda else \
            torch.optim.AdamW(model.parameters(), lr=1e-5)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    if args.tokens:
        batches = [(b, b) for b in token_batches(torch, args)]
    else:
        gen = torch.Generator(device=args.device).manual_seed(99)
        shape = (args.seqs, args.seq_len)
        ids = torch.randint(0, cfg.vocab_size, shape, device=args.device, generator=gen)
        labels = torch.randint(0, cfg.vocab_size, shape, device=args.device, generator=gen)
        batches = [(ids, labels)] * (args.warmup + args.steps)

    def step(ids, labels):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            out = model(input_ids=ids, labels=labels, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.detach()

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for ids, labels in batches[:args.warmup]:
        step(ids, labels)
    sync()
    t0 = time.perf_counter()
    loss = None
    for ids, labels in batches[args.warmup:]:
        loss = step(ids, labels)
    sync()
    step_s = (time.perf_counter() - t0) / args.steps
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    result = {
        "tokens_per_s": args.seqs * args.seq_len / step_s,
        "step_s": step_s,
        "peak_gib": peak,
        "gradient_checkpointing": checkpointing,
        "loss": float(loss),
    }
    del model, opt, batches
    if cuda:
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
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--threads", type=int, default=0, help="cpu: intra-op threads (0: torch's)")
    ap.add_argument("--tokens", default="", help="JSONL of input_ids rows (default: random)")
    args = ap.parse_args()
    try:
        import torch
        import transformers
    except Exception as e:  # noqa: BLE001 - any import failure means no baseline
        print(json.dumps({"error": "torch/transformers not importable: %s" % e}))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no CUDA device"}))
        return 0
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    modes = {"off": [False], "on": [True], "auto": [False, True]}[args.gradient_checkpointing]
    oom_without = False
    result = None
    for checkpointing in modes:
        try:
            log("torch baseline: %s, gradient checkpointing %s" % (args.config, checkpointing))
            result = run(torch, transformers, args, checkpointing)
            break
        except (torch.cuda.OutOfMemoryError, MemoryError) as e:
            log("torch baseline: out of memory (%s)" % str(e).splitlines()[0])
            if not checkpointing:
                oom_without = True
        except Exception as e:  # noqa: BLE001 - reported in the JSON
            print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}))
            return 0
        # The failed attempt's tensors are only unreachable once the exception is gone.
        gc.collect()
        if args.device == "cuda":
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
    if args.device == "cuda":
        result["device"] = torch.cuda.get_device_name(0)
    else:
        result["device"] = "cpu"
        result["threads"] = torch.get_num_threads()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
