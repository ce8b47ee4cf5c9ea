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
import re
import subprocess
import sys
import time

from . import harness
from .harness import add_device_argument, device_from_args, generate_flags, train_flags

SYSTEMS = {  # name: (arch, flags); all post-norm: the layers 0.12.2's fused path would take
    "fairseq transformer (reference)": ("transformer", []),
    "transformer_ta": ("transformer_ta", []),
    "transformer_dlcl_postnorm": ("transformer_dlcl_postnorm", []),
    "transformer_rezero": ("transformer_rezero", []),
}


def hypotheses(log):
    return {
        int(i): (float(score), text)
        for i, score, text in re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", log, re.M)
    }


def run(argv, log_path):
    with open(log_path, "w") as log:
        proc = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")),
        )
    if proc.returncode != 0:
        with open(log_path) as log:
            errors = [line.strip() for line in log if re.match(r"\w*(Error|Exception)\b", line)]
        raise RuntimeError(
            errors[-1] if errors else f"exit status {proc.returncode}; see {log_path}"
        )
    return proc.stdout


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

    from fairseq_deep import runs

    rows = []
    for name in args.systems.split(","):
        arch, flags = SYSTEMS[name]
        save = os.path.join(args.out, arch)
        w = str(args.width)
        t0 = time.time()
        if not os.path.exists(os.path.join(save, "checkpoint_last.pt")):
            run(
                runs.command(
                    runs.TRAIN,
                    args.data,
                    "--arch",
                    arch,
                    *flags,
                    "--encoder-layers",
                    str(args.layers),
                    "--decoder-layers",
                    str(args.layers),
                    "--encoder-embed-dim",
                    w,
                    "--decoder-embed-dim",
                    w,
                    "--encoder-ffn-embed-dim",
                    str(2 * args.width),
                    "--decoder-ffn-embed-dim",
                    str(2 * args.width),
                    "--encoder-attention-heads",
                    "4",
                    "--decoder-attention-heads",
                    "4",
                    "--share-all-embeddings",
                    "--dropout",
                    "0.1",
                    "--optimizer",
                    "adam",
                    "--adam-betas",
                    "(0.9, 0.98)",
                    "--lr",
                    "2e-3",
                    "--lr-scheduler",
                    "inverse_sqrt",
                    "--warmup-updates",
                    "400",
                    "--criterion",
                    "label_smoothed_cross_entropy",
                    "--label-smoothing",
                    "0.1",
                    "--max-tokens",
                    "4096",
                    "--max-update",
                    "100000",
                    "--stop-time-hours",
                    str(args.minutes / 60),
                    "--disable-validation",
                    "--no-epoch-checkpoints",
                    "--save-dir",
                    save,
                    "--seed",
                    "1",
                    *train_flags(args.device),
                    "--num-workers",
                    "0",
                    "--no-progress-bar",
                ),
                os.path.join(args.out, f"{arch}.train.log"),
            )
        train_s = time.time() - t0
        hyps, seconds, failed = {}, {}, {}
        for bsz in (1, 64):
            t0 = time.time()
            try:
                hyps[bsz] = hypotheses(
                    run(
                        runs.command(
                            runs.GENERATE,
                            args.data,
                            "--path",
                            os.path.join(save, "checkpoint_last.pt"),
                            "--gen-subset",
                            "test",
                            "--beam",
                            str(args.beam),
                            "--batch-size",
                            str(bsz),
                            *generate_flags(args.device),
                            "--num-workers",
                            "0",
                        ),
                        os.path.join(args.out, f"{arch}.generate{bsz}.log"),
                    )
                )
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
