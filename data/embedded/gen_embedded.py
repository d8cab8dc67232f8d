#!/usr/bin/env python3
"""Generates the embedded default run's dataset and tokenizer (data/embedded/).

stories.jsonl: short children's stories from a small hand-written grammar (written for this
project; no third-party text), one {"text": ...} per line. They have enough structure for a
tiny model to learn visibly within a minute on two CPU cores.
tokenizer.json: a byte-level BPE (Qwen2's pre-tokenizer regex + ByteLevel, 1024 tokens)
trained on the stories with Hugging Face `tokenizers`; tokenizer_config.json carries a ChatML
template and the special tokens.

Run: /work/venv/bin/python data/embedded/gen_embedded.py   (versions recorded in VERSIONS.json)
"""
import json
import os
import random

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))

NAMES = ["Mia", "Leo", "Ava", "Sam", "Ella", "Tom", "Lily", "Ben", "Zoe", "Max", "Nora", "Finn"]
ANIMALS = ["cat", "dog", "rabbit", "fox", "bird", "frog", "duck", "bear", "mouse", "owl"]
PLACES = ["the park", "the garden", "the forest", "the beach", "the farm", "the river",
          "the hill", "the school", "the market", "the lake"]
OBJECTS = ["a red ball", "a blue kite", "a small boat", "a shiny stone", "a yellow hat",
           "a big box", "a green apple", "a little drum", "a warm blanket", "a paper star"]
FEELINGS = ["happy", "sad", "curious", "tired", "brave", "scared", "excited", "calm"]
WEATHER = ["sunny", "rainy", "windy", "cold", "warm", "cloudy"]
ACTIONS = ["played with", "looked at", "found", "shared", "carried", "painted", "hid", "lost"]


def story(r):
    n1, n2 = r.sample(NAMES, 2)
    a = r.choice(ANIMALS)
    p = r.choice(PLACES)
    o = r.choice(OBJECTS)
    f1, f2 = r.sample(FEELINGS, 2)
    w = r.choice(WEATHER)
    act = r.choice(ACTIONS)
    s = [f"One {w} day, {n1} went to {p}."]
    s.append(f"{n1} saw a {a} near a tree.")
    s.append(f"The {a} had {o}.")
    s.append(f"{n1} felt {f1}.")
    if r.random() < 0.5:
        s.append(f"{n1} called {n2}, and {n2} came to {p} too.")
        s.append(f"{n1} and {n2} {act} {o} with the {a}.")
    else:
        s.append(f"{n1} {act} {o} with the {a}.")
    s.append(f"At the end of the day, {n1} was {f2}.")
    if r.random() < 0.6:
        s.append(f"The {a} said, \"Thank you, {n1}!\"")
    s.append("The end.")
    return " ".join(s)


def main():
    r = random.Random(1234)
    stories = [story(r) for _ in range(4000)]
    with open(os.path.join(HERE, "stories.jsonl"), "w") as f:
        for s in stories:
            f.write(json.dumps({"text": s}) + "\n")

    tok = Tokenizer(models.BPE())
    qwen2_split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                   r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(qwen2_split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(stories, trainer=trainer)
    tok.save(os.path.join(HERE, "tokenizer.json"))

    chatml = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
              "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "chat_template": chatml,
        "model_max_length": 2048,
    }
    with open(os.path.join(HERE, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)
        f.write("\n")
    with open(os.path.join(HERE, "VERSIONS.json"), "w") as f:
        json.dump({"tokenizers": tokenizers.__version__}, f, indent=1)
        f.write("\n")
    print(len(stories), "stories;", tok.get_vocab_size(), "tokens")


if __name__ == "__main__":
    main()
