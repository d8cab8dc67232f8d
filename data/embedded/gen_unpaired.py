#!/usr/bin/env python3
"""Writes unpaired.jsonl, the built-in KTO demo set, from preferences.jsonl: each pair becomes a
desirable row (prompt, chosen, true) followed by an undesirable one (prompt, rejected, false),
so that every micro-batch holds both kinds, as KTO needs.

Run: python3 data/embedded/gen_unpaired.py   (from the repository root)
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "preferences.jsonl")) as f, \
        open(os.path.join(HERE, "unpaired.jsonl"), "w") as out:
    for line in f:
        p = json.loads(line)
        out.write(json.dumps({"prompt": p["prompt"], "completion": p["chosen"], "label": True}) + "\n")
        out.write(json.dumps({"prompt": p["prompt"], "completion": p["rejected"], "label": False}) + "\n")
