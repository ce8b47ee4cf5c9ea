"""Training and decoding speed of the Dou et al. (2018) variants against the plain Transformer.

    python -m benchmarks.aggregation_speed [--layers 6 --embed-dim 256 --ffn-dim 1024 --heads 4]
        [--batch 32 --src-len 24 --tgt-len 24 --train-steps 8 --gen-len 24 --beam 4 --rounds 3]

In one process, on fixed random batches, for every variant of Table 1 (rows 1-7: baseline,
dense, linear, iterative, hierarchical, MLA k=2, k=3; all on both stacks, post-norm, same depth
and width) it measures

* training speed: target words/s of forward + backward + Adam step (dropout 0.1, train mode);
* decoding speed: target tokens/s of fairseq's ``SequenceGenerator`` (beam ``--beam``, incremental
  decoding), with the output length forced to ``--gen-len`` (min_len = max_len) so that every
  variant decodes the same number of steps whatever its random weights prefer;

rounds alternate the variants (A B C ... A B C ...) and the median over ``--rounds`` is reported
(a round's decoding speed is itself the median of ``--gen-repeats`` generations),
with each variant's ratio to the baseline (1.00 = as fast; 0.79 = 21% slower, the paper's figure for
multi-layer attention decoding).  ``--threads`` sets torch's intra-op threads.  Numbers go to
stdout as a markdown table and to ``--json`` if given.  Close other CPU-heavy work first.
``--device cuda`` (the default where torch sees a GPU) runs the models and batches on the GPU and
synchronizes it before every clock reading; float32 on either device.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/aggregation_speed.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.aggregation_speed"
    )

import argparse
import statistics
import sys

import torch
from fairseq.sequence_generator import SequenceGenerator

import fairseq_deep  # noqa: F401  (registers the architectures)
from fairseq_deep.runs import recipes

from . import harness
from .harness import add_device_argument, clock, describe, device_from_args

VARIANTS = [  # label, --arch (Table 1 row)
    ("1 baseline", "transformer_agg_baseline"),
    ("2 dense", "transformer_dense"),
    ("3 linear", "transformer_linear_agg"),
    ("4 iterative", "transformer_iterative_agg"),
    ("5 hierarchical", "transformer_hier_agg"),
    ("6 MLA k=2", "transformer_mla2"),
    ("7 MLA k=3", "transformer_mla3"),
]


def build(arch, a, dictionary):
    return harness.build_model(
        [
            "--arch",
            arch,
            *recipes.layers(a.layers, a.layers),
            *recipes.transformer_size(a.embed_dim, a.ffn_dim, a.heads),
            *recipes.dropout("0.1"),
            "--share-all-embeddings",
            *a.extra,
        ],
        dictionary,
        a.device,
        a.seed,
    )


def batch(dictionary, a, g):
    lo, hi = dictionary.nspecial, len(dictionary)
    src = torch.randint(lo, hi, (a.batch, a.src_len), generator=g)
    src[:, -1] = dictionary.eos()
    tgt = torch.randint(lo, hi, (a.batch, a.tgt_len), generator=g)
    prev = torch.cat([torch.full((a.batch, 1), dictionary.eos()), tgt[:, :-1]], dim=1)
    return tuple(t.to(a.device) for t in (src, torch.full((a.batch,), a.src_len), prev, tgt))


def train_wps(model, opt, data, steps, device):
    model.train()
    src, lengths, prev, tgt = data

    def step():
        opt.zero_grad()
        out, _ = model(src, lengths, prev)
        loss = torch.nn.functional.cross_entropy(out.view(-1, out.size(-1)), tgt.view(-1))
        loss.backward()
        opt.step()

    step()  # warm-up
    start = clock(device)
    for _ in range(steps):
        step()
    return steps * tgt.numel() / (clock(device) - start)


def gen_tps(model, dictionary, data, a):
    model.eval()
    src, lengths = data[0][: a.gen_batch], data[1][: a.gen_batch]
    gen = SequenceGenerator(
        [model], dictionary, beam_size=a.beam, max_len_a=0, max_len_b=a.gen_len, min_len=a.gen_len
    )
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    with torch.no_grad():
        gen.forward(sample)  # warm-up
        seconds = []
        for _ in range(a.gen_repeats):  # one generation is a few tens of ms on a GPU: take a median
            hyps, s = harness.timed(lambda: gen.forward(sample), a.device)
            seconds.append(s)
    tokens = sum(len(h[0]["tokens"]) for h in hyps)
    return tokens / statistics.median(seconds)


def get_parser():
    p = harness.parser(__doc__)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--embed-dim", type=int, default=256)
    p.add_argument("--ffn-dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=2000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--src-len", type=int, default=24)
    p.add_argument("--tgt-len", type=int, default=24)
    p.add_argument("--train-steps", type=int, default=8)
    p.add_argument("--gen-batch", type=int, default=16)
    p.add_argument("--gen-len", type=int, default=24)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument(
        "--gen-repeats",
        type=int,
        default=3,
        help="timed generations per round and variant (median)",
    )
    harness.add_rounds(p, 3)
    harness.add_threads(p, 0, "torch intra-op threads (0: torch's default)")
    p.add_argument(
        "--variants", default="", help="comma-separated --arch names (default: all of Table 1)"
    )
    p.add_argument("--seed", type=int, default=1)
    harness.add_json(p, "")
    add_device_argument(p)
    p.add_argument(
        "--extra", nargs=argparse.REMAINDER, default=[], help="more model flags, for every variant"
    )
    return p


def main(argv=None):
    a = get_parser().parse_args(argv)
    device_from_args(a)
    harness.set_threads(a.threads)
    variants = [v for v in VARIANTS if not a.variants or v[1] in a.variants.split(",")]
    if variants[0][1] != "transformer_agg_baseline":
        variants = [VARIANTS[0]] + variants
    d = harness.dictionary(a.vocab)
    data = batch(d, a, torch.Generator().manual_seed(a.seed))
    models = {arch: build(arch, a, d) for _, arch in variants}
    opts = {arch: torch.optim.Adam(m.parameters(), lr=1e-4) for arch, m in models.items()}
    params = {arch: sum(x.numel() for x in m.parameters()) for arch, m in models.items()}

    def measure(label, arch):
        def one_round(r):
            speeds = (
                train_wps(models[arch], opts[arch], data, a.train_steps, a.device),
                gen_tps(models[arch], d, data, a),
            )
            print(
                f"[round {r + 1}] {label}: train {speeds[0]:.0f} w/s, generate {speeds[1]:.1f} tok/s",
                file=sys.stderr,
                flush=True,
            )
            return speeds

        return one_round

    rounds = harness.alternated({arch: measure(label, arch) for label, arch in variants}, a.rounds)
    train = {arch: [t for t, _ in speeds] for arch, speeds in rounds.items()}
    gen = {arch: [g for _, g in speeds] for arch, speeds in rounds.items()}
    base = variants[0][1]
    med = lambda xs: statistics.median(xs)  # noqa: E731
    rows = []
    print(
        f"\n{a.layers}+{a.layers} layers, d={a.embed_dim}, ffn={a.ffn_dim}, heads={a.heads}; train batch "
        f"{a.batch}x{a.tgt_len}, generate {a.gen_batch} sentences x {a.gen_len} tokens beam {a.beam}; "
        f"median of {a.rounds} rounds; torch threads {torch.get_num_threads()}"
        + (f"; {describe(a.device)}" if a.device != "cpu" else "")
        + "\n"
    )
    for label, arch in variants:
        rows.append(
            {
                "label": label,
                "arch": arch,
                "params": params[arch],
                "train_wps": med(train[arch]),
                "train_ratio": med(train[arch]) / med(train[base]),
                "gen_tps": med(gen[arch]),
                "gen_ratio": med(gen[arch]) / med(gen[base]),
                "train_all": train[arch],
                "gen_all": gen[arch],
            }
        )
    print(
        harness.markdown_table(
            [
                "Table 1 row",
                "arch",
                "params",
                "train words/s",
                "ratio",
                "generate tokens/s",
                "ratio",
            ],
            [
                [
                    r["label"],
                    r["arch"],
                    f"{r['params'] / 1e6:.2f}M",
                    f"{r['train_wps']:.0f}",
                    f"{r['train_ratio']:.2f}",
                    f"{r['gen_tps']:.1f}",
                    f"{r['gen_ratio']:.2f}",
                ]
                for r in rows
            ],
        )
    )
    if a.json:
        harness.write_json(a.json, {"args": vars(a), "rows": rows})


if __name__ == "__main__":
    main()
