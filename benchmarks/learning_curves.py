"""Learning curves per update of RNMT+, multi-layer attention and Deep-Att against their baselines (issue 25).

Every system of a family trains with fairseq-train on the same data, batches, seed and (unless the
row says otherwise) the same optimiser and schedule: Adam (0.9, 0.98), inverse_sqrt warm-up over
``--warmup`` updates to ``--lr``, label-smoothed cross-entropy 0.1, ``--max-tokens`` tokens per
update, validation every ``--valid-interval`` updates.  The table gives each system's valid loss
(bits, label-smoothed, as fairseq logs it) at every validation, with the seconds since its
training started in brackets.

Families (``--family``, repeatable; sizes follow ``--width`` W as fairseq-deep-study's --width):

* ``rnmt``: fairseq's own ``lstm`` (bidirectional encoder, W cells, 2 + 2 layers), ``rnmt_plus``
  2 + 2 at lr and at 3x lr, with what fairseq-deep-study now passes it (Adam (0.9, 0.999, 1e-6),
  Eq. 1 to 3.2 x lr) at dropout 0.1 and at the preset's 0.3, and ``transformer_prenorm`` 6 + 6
  (FFN 4W, W/64 heads, at least 2); dropout 0.1 everywhere else (attention dropout too).
* ``dou``: ``transformer_agg_baseline`` (post-norm, 6 + 6), ``transformer_mla2``,
  ``transformer_hier_agg``.
* ``zhou``: ``deep_att_ff_2x2`` and ``deep_att_noff_2x2`` (embeddings W/2, W cells) with the
  shared Adam, and ``deep_att_ff_2x2`` with the paper's ``--optimizer deep_att`` (Adam, l_f 4e-5,
  l_r 5e-4, L2 r = 2, fixed rates; fairseq-deep-study's --recipe paper before issue 25).

``--systems a,b`` keeps only the named rows.  Runs go to ``--out`` (one directory per system, its
fairseq log in ``log``); a system whose log already holds ``--updates`` updates is not rerun.

    OMP_NUM_THREADS=1 python -m benchmarks.learning_curves --data prep/data-bin --family rnmt \\
        --width 128 --updates 300 --valid-interval 50 --jobs 2 --out curves
"""

if __name__ == "__main__" and not __package__:  # run as a file, the package's imports would fail
    raise SystemExit(
        "benchmarks/learning_curves.py is a module of the benchmarks package: run it from the "
        "repository root as python -m benchmarks.learning_curves"
    )

import concurrent.futures
import os

from fairseq_deep import runs
from fairseq_deep.models.families import spec
from fairseq_deep.runs import Part, recipes

from . import harness
from .harness import add_device_argument, device_from_args

DEEP_ATT_PAPER = list(recipes.deep_att())


def transformer(w):
    """fairseq-deep-study's --width W of a Transformer (FFN 4W, W/64 heads, at least 2)."""
    return [*recipes.transformer_size(w, 4 * w, max(2, w // 64)), *recipes.dropout("0.1")]


def rnn(w, embed=None):
    return list(recipes.rnn_size(embed or w, w))


def families(w, lr, warmup=100):
    """{family: [(name, arch, flags, lr or None = --lr)]}"""
    two = ["--encoder-layers", "2", "--decoder-layers", "2", "--dropout", "0.1"]
    # what fairseq-deep-study --recipe paper passes RNMT+ (issue 25): Chen et al.'s Adam, Eq. 1 to 3.2 x lr
    eq1 = [word for part in recipes.paper(spec("rnmt_plus"), lr, warmup) for word in part]
    return {
        "rnmt": [
            (
                "lstm_2x2",
                "lstm",
                rnn(w) + two + ["--decoder-out-embed-dim", str(w), "--encoder-bidirectional"],
                None,
            ),
            ("rnmt_plus_2x2", "rnmt_plus", rnn(w) + two + ["--attention-dropout", "0.1"], None),
            (
                "rnmt_plus_2x2_lr3x",
                "rnmt_plus",
                rnn(w) + two + ["--attention-dropout", "0.1"],
                3 * lr,
            ),
            (
                "rnmt_plus_2x2_eq1",
                "rnmt_plus",
                rnn(w) + two + ["--attention-dropout", "0.1"] + eq1,
                None,
            ),
            (
                "rnmt_plus_2x2_eq1_dropout0.3",
                "rnmt_plus",
                rnn(w) + two + ["--dropout", "0.3", "--attention-dropout", "0.3"] + eq1,
                None,
            ),
            ("transformer_prenorm", "transformer_prenorm", transformer(w), None),
        ],
        "dou": [
            ("baseline", "transformer_agg_baseline", transformer(w), None),
            ("mla2", "transformer_mla2", transformer(w), None),
            ("hierarchical", "transformer_hier_agg", transformer(w), None),
        ],
        "zhou": [
            ("noff_2x2", "deep_att_noff_2x2", rnn(w, max(1, w // 2)), None),
            ("ff_2x2", "deep_att_ff_2x2", rnn(w, max(1, w // 2)), None),
            (
                "ff_2x2_paper_optimizer",
                "deep_att_ff_2x2",
                rnn(w, max(1, w // 2)) + DEEP_ATT_PAPER,
                None,
            ),
        ],
    }


def train_run(args, name, arch, flags, lr) -> runs.Run:
    """fairseq-train of a row: its flags, the study's optimiser unless it names its own (Adam
    (0.9, 0.98), inverse_sqrt warm-up from 1e-7 to ``lr`` or --lr), the shared settings."""
    shared = (
        []
        if recipes.gives(flags, "optimizer")
        else [
            recipes.adam(lr or args.lr),
            recipes.inverse_sqrt(args.warmup, recipes.WARMUP_INIT_LR),
        ]
    )
    return runs.Run.of(
        "train",
        args.data,
        Part("model", ["--arch", arch, *flags]),
        *shared,
        recipes.label_smoothed(0.1),
        recipes.budget(max_tokens=args.max_tokens, max_update=args.updates),
        recipes.seed(args.seed),
        recipes.saving(validate_interval_updates=args.valid_interval, validate_interval=100000),
        recipes.saving(save_dir=os.path.join(args.out, name), no_epoch_checkpoints=True),
        recipes.json_log(25),
        ["--skip-invalid-size-inputs-valid-test"],
        recipes.device(args.device),
    )


def curve(log_path):
    """[(updates, valid loss, seconds since training started)] from a fairseq json log."""
    if not os.path.exists(log_path):
        return []
    with open(log_path, errors="replace") as f:
        return [
            (int(r["num_updates"]), float(r["loss"]), seconds)
            for seconds, r in runs.timed_records(f)
            if r["kind"] == "valid"
        ]


def get_parser():
    p = harness.parser(__doc__)
    p.add_argument("--data", help="fairseq data-bin (required to run)")
    p.add_argument("--family", action="append", choices=["rnmt", "dou", "zhou"])
    p.add_argument("--systems", default="", help="comma-separated system names to keep")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--updates", type=int, default=300)
    p.add_argument("--valid-interval", type=int, default=50)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1, help="systems trained at once")
    p.add_argument("--out", default="learning_curves")
    add_device_argument(p)
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    device_from_args(args)
    if not args.data:
        raise SystemExit("error: --data DATA_BIN is required")
    keep = set(filter(None, args.systems.split(",")))
    table = families(args.width, args.lr, args.warmup)
    rows = [
        (f, *s) for f in (args.family or ["rnmt"]) for s in table[f] if not keep or s[0] in keep
    ]
    todo = []
    for _, name, arch, flags, lr in rows:
        log = os.path.join(args.out, name, "log")
        done = curve(log)
        if not (done and done[-1][0] >= args.updates):
            os.makedirs(os.path.dirname(log), exist_ok=True)
            todo.append((name, train_run(args, name, arch, flags, lr), log))
    group = runs.Processes()  # Ctrl-C ends the running ones and starts no more

    def train(name, run, log):
        if not group.stopping.is_set():
            print("running", name, flush=True)
            runs.execute(run, log, processes=group)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        try:
            for future in [pool.submit(train, *job) for job in todo]:
                future.result()
        except KeyboardInterrupt:
            group.stop()
            raise
    for fam in args.family or ["rnmt"]:
        print(f"\n{fam}: valid loss (bits) at updates (seconds)\n")
        for _, name, *_ in [r for r in rows if r[0] == fam]:
            pts = curve(os.path.join(args.out, name, "log"))
            print(
                harness.markdown_row(
                    [name, " | ".join(f"{u}: {loss:.2f} ({sec:.0f}s)" for u, loss, sec in pts)]
                )
            )


if __name__ == "__main__":
    main()
