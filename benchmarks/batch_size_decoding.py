"""Does a trained model translate the same at ``--batch-size 1`` and at ``--batch-size 64``?

Issue 23: on the official fairseq 0.12.2, post-norm models of the package decoded through the
layers' fused "BetterTransformer" path and their translations depended on the batch size (a
transparent-attention model: BLEU 21.96 at batch size 1, 40.81 at 64).  This script trains each
system with the real ``fairseq-train`` for a few minutes on real data, decodes the test set with
``fairseq-generate`` at both batch sizes from the same checkpoint, and counts the sentences whose
hypothesis differs; fairseq's own post-norm ``transformer`` runs beside them as the reference
(on 0.12.2 it still takes the fused path: the bug the package turns off for its own layers).

Decoding in a padded batch is not bit-for-bit the same arithmetic as decoding alone (other matrix
shapes, other summation orders), so scores agree to about 1e-6 and a beam can part at a near-tie;
the count of differing hypotheses of fairseq's reference on ve-fairseq is that floor.

    python -m benchmarks.batch_size_decoding --data M30K_BIN --out bsz --minutes 3
    (run it with the Python of each stack: 3.10 + fairseq 0.12.2, 3.11 + ve-fairseq)
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/batch_size_decoding.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.batch_size_decoding"
    )

import json
import os
import sys
import time

from fairseq_deep import runs
from fairseq_deep.runs import Part, recipes

from . import harness
from .harness import add_device_argument, device_from_args

SYSTEMS = {  # name: (arch, flags); all post-norm: the layers 0.12.2's fused path would take
    "fairseq transformer (reference)": ("transformer", []),
    "transformer_ta": ("transformer_ta", []),
    "transformer_dlcl_postnorm": ("transformer_dlcl_postnorm", []),
    "transformer_rezero": ("transformer_rezero", []),
}


def hypotheses(generated: runs.Generated):
    """{sentence id: (score, hypothesis)} of fairseq-generate's H- lines."""
    return {i: (generated.scores[i], text) for i, text in generated.tokens.items()}


def run(run: runs.Run, log_path):
    """The result of ``run`` (its output also in ``log_path``); RuntimeError with its error line
    where it failed."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    result = runs.execute(run, log_path, env=env)
    if not result.ok:
        raise RuntimeError(result.error() or f"exit status {result.returncode}; see {log_path}")
    return result


def train_run(args, arch, flags, save) -> runs.Run:
    """fairseq-train of a system for --minutes: width W (FFN 2W, 4 heads), --layers on both sides,
    Adam (0.9, 0.98) with inverse_sqrt warm-up over 400 updates to 2e-3."""
    return runs.Run.of(
        "train",
        args.data,
        Part("model", ["--arch", arch, *flags]),
        recipes.layers(args.layers, args.layers),
        recipes.transformer_size(args.width, 2 * args.width, 4),
        ["--share-all-embeddings", *recipes.dropout("0.1")],
        recipes.adam("2e-3"),
        recipes.inverse_sqrt(400),
        recipes.label_smoothed(0.1),
        recipes.budget(max_tokens="4096", max_update="100000"),
        recipes.budget(stop_time_hours=str(args.minutes / 60)),
        recipes.saving(disable_validation=True, no_epoch_checkpoints=True, save_dir=save),
        recipes.seed("1"),
        recipes.device(args.device),
        ["--num-workers", "0", "--no-progress-bar"],
    )


def generate_run(args, save, batch_size) -> runs.Run:
    return runs.Run.of(
        "generate",
        args.data,
        recipes.decoding(path=os.path.join(save, "checkpoint_last.pt"), gen_subset="test"),
        recipes.decoding(beam=args.beam, batch_size=batch_size),
        recipes.device(args.device, program="generate"),
        ["--num-workers", "0"],
    )


def get_parser():
    p = harness.parser(__doc__)
    p.add_argument("--data", required=True, help="fairseq-preprocess output with a test split")
    p.add_argument("--out", required=True)
    p.add_argument("--minutes", type=float, default=3.0, help="training time per system")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="comma-separated names of " + ", ".join(SYSTEMS),
    )
    add_device_argument(p, note="the fused path of issue 23 is taken on either device")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    device_from_args(args)
    os.makedirs(args.out, exist_ok=True)
    import fairseq
    import torch

    rows = []
    for name in args.systems.split(","):
        arch, flags = SYSTEMS[name]
        save = os.path.join(args.out, arch)
        t0 = time.time()
        if not os.path.exists(os.path.join(save, "checkpoint_last.pt")):
            run(train_run(args, arch, flags, save), os.path.join(args.out, f"{arch}.train.log"))
        train_s = time.time() - t0
        hyps, seconds, failed = {}, {}, {}
        for bsz in (1, 64):
            t0 = time.time()
            try:
                decoded = run(
                    generate_run(args, save, bsz),
                    os.path.join(args.out, f"{arch}.generate{bsz}.log"),
                )
                hyps[bsz] = hypotheses(decoded.generated)
            except (
                RuntimeError
            ) as e:  # fairseq's own transformer on 0.12.2 + torch 2.x: "Mask Type ..."
                hyps[bsz], failed[bsz] = {}, str(e)
            seconds[bsz] = time.time() - t0
        one, many = hyps[1], hyps[64]
        same = [i for i in one if i in many and one[i][1] == many[i][1]]
        rows.append(
            dict(
                system=name,
                arch=arch,
                sentences=len(one),
                decoded_64=len(many),
                differing=len(one) - len(same),
                failed=failed,
                max_score_diff=max((abs(one[i][0] - many[i][0]) for i in same), default=0.0),
                train_s=round(train_s),
                generate_s={b: round(s, 1) for b, s in seconds.items()},
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    header = (
        f"fairseq {fairseq.__version__}, torch {torch.__version__}, Python {sys.version.split()[0]}; "
        f"{args.device}, {args.layers}+{args.layers} layers, width {args.width}, "
        f"{args.minutes} min of training, beam {args.beam}"
    )
    lines = [
        header,
        "",
        harness.markdown_table(
            [
                "system",
                "sentences",
                "hypotheses differing (bsz 1 vs 64)",
                "max score diff (same hyps)",
            ],
            [
                [
                    r["system"],
                    r["sentences"],
                    *(
                        [r["differing"], f"{r['max_score_diff']:.1e}"]
                        if not r["failed"]
                        else [
                            "; ".join(
                                f"batch size {b} failed: {e}" for b, e in r["failed"].items()
                            ),
                            "",
                        ]
                    ),
                ]
                for r in rows
            ],
            "lrrr",
        ),
    ]
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    harness.write_json(os.path.join(args.out, "results.json"), dict(header=header, rows=rows))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
