#!/usr/bin/env python3
"""Writes the tokenizer golden files in tests/data/golden/tokenizer/ (see the README there).

Oracles: the `regex` module for the GPT-2 and LLaMA-3 split patterns, and Hugging Face
`tokenizers` for BPE encoding. Run from the repository root:
    pip install tokenizers==0.23.3 regex
    python3 tools/gen_tokenizer_golden.py
Deterministic: the same versions write the same files.
"""
import json
import lzma
import os
import random
import sys

import regex
import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
          r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
OUT = "tests/data/golden/tokenizer"
TOKENIZERS_VERSION = "0.23.3"

# Hand-picked cases: contractions, digit runs, white-space runs before letters, digits,
# punctuation and line breaks, carriage returns, Unicode letters, numbers and spaces.
CASES = [
    "In the beginning God created the heaven and the earth.",
    "I'm sure you're right; we've said it's theirs, they'll know, he'd go. DON'T 'S 'Re",
    "'sam 'llama ''s x's",
    "12345 1,000,000 3.14159 2024-01-02 v1.2.3",
    "a  b   c\t\td\n\ne  \n f\r\ng \r\n\r\n h",
    "   leading and trailing   ",
    "\n\n\nParagraph\n\n  indented\n\t\ttabbed",
    "...!!! ?? (hello) [x] {y} <|not special|> a.b,c;d:e",
    "naïve café Ελληνικά русский 日本語のテキスト 한국어",
    "emoji 😀👍🏽 and ½ ² Ⅻ ٣ numbers",
    "non-breaking\u00a0space, ideographic\u3000space, line\u2028separator",
    "tab\tthen\u000bvt\u000cff\u0085nel",
    "x",
    " ",
    "  ",
    "\n",
    "'",
    "''",
    " 's",
    "end.\n",
    "AND the LORD spake unto Moses, saying,",
]


def random_cases(n, seed):
    rng = random.Random(seed)
    alphabet = (list("abcXYZ019 '\t\n\r.,!?-_()") + [" ", " ", "  ", "'s", "'LL", "\r\n"] +
                ["é", "ß", "Ω", "ж", "中", "ー", "٣", "½", "Ⅻ", "\u00a0", "\u2003", "\u3000",
                 "😀", "\u0301", "\u200b", "§", "€", "\u0085"])
    out = []
    for _ in range(n):
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))))
    return out


def kjv_text():
    with lzma.open("data/kjv.txt.xz", "rt", encoding="utf-8") as f:
        return f.read()


def train(text, llama3):
    model = models.BPE(ignore_merges=llama3)
    tok = Tokenizer(model)
    if llama3:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|user|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    return tok


def main():
    if tokenizers.__version__ != TOKENIZERS_VERSION:
        sys.exit(f"tokenizers {tokenizers.__version__} found; the golden files are written with "
                 f"{TOKENIZERS_VERSION}: pip install tokenizers=={TOKENIZERS_VERSION}")
    os.makedirs(OUT, exist_ok=True)
    cases = CASES + random_cases(400, seed=20240601)
    kjv = kjv_text()

    pre = {"oracle": f"regex {regex.__version__}", "gpt2": GPT2, "llama3": LLAMA3, "cases": []}
    for s in cases:
        pre["cases"].append({"text": s, "gpt2": regex.findall(GPT2, s),
                             "llama3": regex.findall(LLAMA3, s)})
    with open(f"{OUT}/pretokenize.json", "w", encoding="utf-8") as f:
        json.dump(pre, f, ensure_ascii=True, indent=0)
        f.write("\n")

    # Training text: the first 100 kB of the bundled corpus plus the cases.
    train_text = kjv[:100_000] + "\n".join(cases)
    for name, llama3 in (("gpt2", False), ("llama3", True)):
        tok = train(train_text, llama3)
        tok.save(f"{OUT}/hf_{name}_tokenizer.json")
        enc = {"oracle": f"tokenizers {tokenizers.__version__}", "cases": []}
        for s in cases + [kjv[200_000:203_000]]:
            enc["cases"].append({"text": s, "ids": tok.encode(s, add_special_tokens=False).ids})
        with open(f"{OUT}/hf_{name}_encode.json", "w", encoding="utf-8") as f:
            json.dump(enc, f, ensure_ascii=True, indent=0)
            f.write("\n")
    print(f"wrote {OUT}: {len(cases)} pre-tokenization cases, 2 tokenizers")


if __name__ == "__main__":
    main()
