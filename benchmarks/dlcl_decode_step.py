"""Incremental decoding speed of transformer_dlcl against the plain pre-norm Transformer, in process.

Both models (12-layer encoder, 3-layer decoder, d=128, ffn 256, 4 heads; the same architecture
family with ``--dlcl-stacks none`` for the baseline, whose computation equals fairseq's pre-norm
``transformer``: see tests/test_dlcl.py) encode a batch once and decode it step by step with
fairseq's incremental state, without autograd, as beam search does. Runs alternate; the minimum
of each is reported, as a speed ratio DLCL / plain.

    python -m benchmarks.dlcl_decode_step [--batch 40 --steps 20 --runs 12 --threads 1] [--device cuda]

``--device cuda`` (the default where torch sees a GPU) decodes on the GPU and synchronizes it
before every clock reading (``--threads`` then only sets torch's CPU threads); float32.
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/dlcl_decode_step.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.dlcl_decode_step"
    )

import torch

from fairseq_deep.runs import recipes

from . import harness
from .harness import add_device_argument, describe, device_from_args

WIDTH = [*recipes.transformer_size(128, 256, 4), "--decoder-layers", "3"]


def decode(model, src, lengths, prev):
    with torch.no_grad():
        encoder_out = model.encoder(src, lengths)
        state = {}
        for t in range(prev.size(1)):
            model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)


def get_parser():
    p = harness.parser(__doc__, full=True)
    p.add_argument("--batch", type=int, default=40)
    p.add_argument("--steps", type=int, default=20)
    harness.add_rounds(p, 12, flag="--runs")
    harness.add_threads(p, 1)
    add_device_argument(p)
    return p


def main(argv=None):
    a = get_parser().parse_args(argv)
    device_from_args(a)
    torch.set_num_threads(a.threads)
    plain, task = harness.tiny_model("transformer_prenorm_12l", WIDTH)
    dlcl, _ = harness.tiny_model("transformer_dlcl_12l", WIDTH)
    plain, dlcl = plain.to(a.device), dlcl.to(a.device)
    batch = harness.random_batch(task.source_dictionary, bsz=a.batch, src_len=20, tgt_len=a.steps)
    batch = [t.to(a.device) for t in batch]

    def seconds(model):
        return lambda r: harness.timed(lambda: decode(model, *batch), a.device)[1]

    times = harness.alternated(
        {"plain pre-norm": seconds(plain), "transformer_dlcl": seconds(dlcl)}, a.runs
    )
    best = {k: min(v) for k, v in times.items()}
    print(
        f"torch {torch.__version__}, {a.threads} thread(s); {a.steps} steps x {a.batch} sentences, "
        f"min of {a.runs} alternated runs"
        + (f"; {describe(a.device)}" if a.device != "cpu" else "")
    )
    for name, t in best.items():
        print(f"  {name}: {t * 1000:.1f} ms")
    print(f"  speed ratio DLCL / plain: {best['plain pre-norm'] / best['transformer_dlcl']:.3f}")


if __name__ == "__main__":
    main()
