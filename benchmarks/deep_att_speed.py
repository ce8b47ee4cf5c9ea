"""Training and generation speed of Deep-Att with F-F connections against fairseq's ``lstm``.

Both models are built through fairseq's own parser, at the sizes of Zhou et al. (2016) Sec. 4.2 by
default (embeddings 256, 512 cells, n_e = n_d = 2), and run on the same random batches:

* training: words/s (target tokens per second) over forward, backward and an optimizer step;
* generation: target tokens/s of fairseq's beam search (beam 3, as in the paper).

fairseq's ``lstm`` is set up as its nearest relative: a bidirectional encoder of the same depth and
width (its two directions play the two columns), the same decoder depth and width, attention.
It prints one line per model and the ratios deep_att / lstm.

    python -m benchmarks.deep_att_speed                      # paper sizes (slow on CPU)
    python -m benchmarks.deep_att_speed --embed 64 --hidden 128 --steps 3 --gen-batches 1  # smoke

``--device cuda`` (the default where torch sees a GPU) runs both models and their batches on the
GPU (fairseq's ``lstm`` then uses cuDNN) and synchronizes it before every clock reading; float32.
``--cell-impl triton`` builds Deep-Att with ``--deep-att-cell-impl triton`` (the fused Triton cell,
issue 16; CUDA, or on a CPU Triton's interpreter with ``TRITON_INTERPRET=1``: far too slow to time).
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/deep_att_speed.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.deep_att_speed"
    )

import os

import torch
from fairseq.data import Dictionary
from fairseq.sequence_generator import SequenceGenerator

import fairseq_deep  # noqa: F401  (registers deep_att)
from fairseq_deep.runs import recipes

from . import harness
from .harness import add_device_argument, build_model, clock, describe, device_from_args


def dictionary(n):
    """A vocabulary of ``n`` entries, fairseq's special symbols included."""
    return harness.dictionary(n - Dictionary().nspecial)


def models(a, d):
    E, n = str(a.embed), a.layers
    deep = build_model(
        [
            "--arch",
            "deep_att_ff",
            *recipes.layers(n, n),
            *recipes.rnn_size(a.embed, a.hidden),
            *recipes.dropout("0.1"),
            "--deep-att-cell-impl",
            a.cell_impl,
        ],
        d,
        a.device,
    )
    lstm = build_model(
        [
            "--arch",
            "lstm",
            *recipes.layers(n, n),
            "--encoder-bidirectional",
            *recipes.rnn_size(a.embed, a.hidden),
            "--decoder-out-embed-dim",
            E,
            *recipes.dropout("0.1"),
        ],
        d,
        a.device,
    )
    return {"deep_att_ff": deep, "lstm": lstm}


def batch(d, a, seed):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(d.nspecial, len(d), (a.batch, a.src_len), generator=g)
    tgt = torch.randint(d.nspecial, len(d), (a.batch, a.tgt_len), generator=g)
    src[:, -1] = tgt[:, -1] = d.eos()
    prev = torch.cat([torch.full((a.batch, 1), d.eos()), tgt[:, :-1]], 1)
    return tuple(t.to(a.device) for t in (src, torch.full((a.batch,), a.src_len), prev, tgt))


def train_speed(model, d, a):
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    batches = [batch(d, a, s) for s in range(a.steps + 1)]
    words, elapsed = 0, 0.0
    for i, (src, lengths, prev, tgt) in enumerate(batches):
        t0 = clock(a.device)
        logits, _ = model(src, lengths, prev)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i > 0:  # the first step warms up
            elapsed += clock(a.device) - t0
            words += tgt.numel()
    return words / elapsed


@torch.no_grad()
def generation_speed(model, d, a):
    model.eval()
    gen = SequenceGenerator(
        [model], d, beam_size=a.beam, max_len_a=0, max_len_b=a.tgt_len, min_len=a.tgt_len
    )  # fixed output length: the same work for both
    tokens, elapsed = 0, 0.0
    for i in range(a.gen_batches + 1):
        src, lengths, _, _ = batch(d, a, 1000 + i)
        t0 = clock(a.device)
        hyps = gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
        if i > 0:
            elapsed += clock(a.device) - t0
            tokens += sum(len(h[0]["tokens"]) for h in hyps)
    return tokens / elapsed


def get_parser():
    p = harness.parser(__doc__, full=True)
    p.add_argument("--embed", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=2, help="n_e = n_d")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--tgt-len", type=int, default=30)
    p.add_argument("--steps", type=int, default=10, help="timed training steps (after one warm-up)")
    p.add_argument("--gen-batches", type=int, default=2, help="timed generation batches")
    p.add_argument("--beam", type=int, default=3)
    harness.add_threads(p, 0, "torch threads (0: torch's default)")
    harness.add_json(p, help="also write the figures to this file")
    p.add_argument(
        "--cell-impl",
        choices=["loop", "triton"],
        default="loop",
        help="Deep-Att's --deep-att-cell-impl: the Python loop or the fused Triton cell (CUDA)",
    )
    add_device_argument(p)
    return p


def main(argv=None):
    a = get_parser().parse_args(argv)
    device_from_args(a)
    if a.cell_impl == "triton" and a.device != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit(
            "error: --cell-impl triton runs Triton kernels, which need --device cuda (or "
            "TRITON_INTERPRET=1 before triton is imported: the interpreter, far too slow to time)"
        )
    if a.device != "cpu":
        print(describe(a.device), flush=True)
    harness.set_threads(a.threads)
    d = dictionary(a.vocab)
    results = {}
    if a.cell_impl != "loop":
        print(f"deep_att_ff with --deep-att-cell-impl {a.cell_impl}", flush=True)
    for name, model in models(a, d).items():
        results[name] = {
            "params": sum(q.numel() for q in model.parameters()),
            "train_words_per_s": train_speed(model, d, a),
            "gen_tokens_per_s": generation_speed(model, d, a),
        }
        r = results[name]
        print(
            f"{name:12s} params {r['params']:>10,d}  train {r['train_words_per_s']:9.1f} words/s  "
            f"generate {r['gen_tokens_per_s']:9.1f} tokens/s",
            flush=True,
        )
    deep, lstm = results["deep_att_ff"], results["lstm"]
    results["ratio"] = {
        k: deep[k] / lstm[k] for k in ("params", "train_words_per_s", "gen_tokens_per_s")
    }
    print(
        "ratio deep_att_ff / lstm: "
        + ", ".join(f"{k} {v:.2f}" for k, v in results["ratio"].items())
    )
    results["settings"] = vars(a)
    if a.json:
        harness.write_json(a.json, results, indent=2)


if __name__ == "__main__":
    main()
