#!/usr/bin/env python3
"""Generates the embedded DPO demo's preference set (data/embedded/preferences.jsonl).

Each pair shares a story opening (the prompt); the chosen completion continues it in the
stories' grammar with the same child, the rejected one is the same words in reverse order.
Written for this project from the grammar of gen_embedded.py (no third-party text); stdlib only,
seeded, so the file is reproducible.

Run: python3 data/embedded/gen_preferences.py
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = ["Mia", "Leo", "Ava", "Sam", "Ella", "Tom", "Lily", "Ben", "Zoe", "Max", "Nora", "Finn"]
ANIMALS = ["cat", "dog", "rabbit", "fox", "bird", "frog", "duck", "bear", "mouse", "owl"]
PLACES = ["the park", "the garden", "the forest", "the beach", "the farm", "the river"]
OBJECTS = ["a red ball", "a blue kite", "a small boat", "a shiny stone", "a yellow hat"]
FEELINGS = ["happy", "sad", "curious", "brave", "calm"]
WEATHER = ["sunny", "rainy", "windy", "cold", "warm", "cloudy"]


def main():
    r = random.Random(16)
    rows = []
    for _ in range(64):
        n = r.choice(NAMES)
        prompt = f"One {r.choice(WEATHER)} day, {n} went to {r.choice(PLACES)}."
        chosen = (f" {n} saw a {r.choice(ANIMALS)} with {r.choice(OBJECTS)}. "
                  f"{n} felt {r.choice(FEELINGS)}. The end.")
        rejected = " " + " ".join(reversed(chosen.split()))
        rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    with open(os.path.join(HERE, "preferences.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
