"""A deterministic synthetic translation task that a small model learns in minutes on a CPU.

Source sentences are strings of pseudo-words (3-12 words); the target translates each word
through a fixed lexicon, gives some words two target words (fertility) and swaps each adjacent pair
of words (local reordering), so that a model must learn a lexicon, attention and word order.
The same seed always writes the same files.

    python -m fairseq_deep.data.synthetic OUT_DIR [--train 20000 --valid 500 --test 500 --seed 1]

writes OUT_DIR/{train,valid,test}.{src,tgt}.
"""

import argparse
import os
import random

SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def _lexicon(rng: random.Random, size: int, min_syl: int, max_syl: int):
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(min_syl, max_syl))))
    return sorted(words)


class SyntheticTask:
    def __init__(self, seed: int = 1, vocab_size: int = 300):
        rng = random.Random(seed)
        self.source_words = _lexicon(rng, vocab_size, 1, 3)
        target_words = _lexicon(rng, vocab_size + vocab_size // 5, 2, 3)
        rng.shuffle(target_words)
        self.lexicon = {}
        extra = iter(target_words[vocab_size:])
        for i, w in enumerate(self.source_words):
            t = [target_words[i]]
            if i % 10 == 0:  # fertility: one source word, two target words
                t.append(next(extra))
            self.lexicon[w] = t

    def translate(self, words):
        out = [self.lexicon[w] for w in words]
        for i in range(0, len(out) - 1, 2):  # local reordering
            out[i], out[i + 1] = out[i + 1], out[i]
        return [t for group in out for t in group]

    def sample(self, rng: random.Random, min_len: int = 3, max_len: int = 12):
        words = [rng.choice(self.source_words) for _ in range(rng.randint(min_len, max_len))]
        return " ".join(words), " ".join(self.translate(words))


def write_corpus(
    out_dir: str, train: int = 20000, valid: int = 500, test: int = 500, seed: int = 1
):
    """Write {train,valid,test}.{src,tgt} to out_dir; returns the file prefix of each split."""
    os.makedirs(out_dir, exist_ok=True)
    task = SyntheticTask(seed)
    rng = random.Random(seed + 1)
    prefixes = {}
    for split, n in (("train", train), ("valid", valid), ("test", test)):
        pairs = [task.sample(rng) for _ in range(n)]
        prefix = os.path.join(out_dir, split)
        for side, col in (("src", 0), ("tgt", 1)):
            with open(f"{prefix}.{side}", "w", encoding="utf-8") as f:
                f.writelines(p[col] + "\n" for p in pairs)
        prefixes[split] = prefix
    return prefixes


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("out_dir")
    p.add_argument("--train", type=int, default=20000)
    p.add_argument("--valid", type=int, default=500)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    write_corpus(a.out_dir, a.train, a.valid, a.test, a.seed)


if __name__ == "__main__":
    main()
