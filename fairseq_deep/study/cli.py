"""fairseq-deep-study's command line: its options, the groups and systems they select, and
:func:`main` (run, then results.json, results.md and the plots)."""

import argparse
import json
import logging
import os
import shlex
import signal
import sys
from typing import Dict, List, Tuple

from ..errors import ArgumentParser, UserError, report_user_errors
from ..quiet import quiet_warnings
from ..runs.recipes import PRECISIONS
from .commands import EPOCH, train_command
from .groups import GROUPS, expand_group, parse_depths
from .report import markdown, plot, results
from .runner import Study
from .systems import CUSTOM, System, infer_depth, parse_system

logger = logging.getLogger("fairseq_deep.study")


def get_parser():
    p = ArgumentParser(
        prog="fairseq-deep-study",
        description="Train, translate and score the papers' systems (or your own) with fairseq, and "
        "write results.json, results.md and plots.  See docs/study.md.",
    )
    p.add_argument(
        "--data",
        required=True,
        help="binarized data folder (fairseq-preprocess / "
        "fairseq-deep-prepare's data-bin) with train, valid and test",
    )
    p.add_argument(
        "--out", required=True, help="output folder (runs/, results.json, results.md, plots/)"
    )
    detok = p.add_mutually_exclusive_group()
    detok.add_argument(
        "--spm",
        metavar="MODEL",
        help="the sentencepiece model of the data: scores text after --post-process sentencepiece",
    )
    detok.add_argument(
        "--remove-bpe",
        metavar="KIND",
        help="fairseq-generate --post-process KIND "
        "(subword_nmt, sentencepiece, ...); default: the text as binarized",
    )
    p.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="NAME[:SYS,...]",
        help=f"a built-in group ({', '.join(GROUPS)}), or some of its systems; repeatable",
    )
    p.add_argument(
        "--system",
        action="append",
        default=[],
        metavar="'NAME=ARCH [FLAGS...]'",
        help="a system of your own (split with shlex; FLAGS go to fairseq-train as they are); "
        "repeatable",
    )
    p.add_argument("--baseline", help="the baseline of the --system systems (default: the first)")
    p.add_argument(
        "--depths",
        help="comma-separated encoder depths for wang and bapna, depths N (N encoder + N decoder "
        "layers) for depth and modern (e.g. 6,20), or shapes E+D (E encoder + D decoder layers) "
        "for any of them (e.g. 18+18,48+6)",
    )
    p.add_argument(
        "--max-update", type=int, default=0, help="updates per system (fairseq --max-update)"
    )
    p.add_argument(
        "--minutes",
        type=float,
        default=0,
        help="training minutes per system (fairseq --stop-time-hours)",
    )
    p.add_argument("--seeds", type=int, default=1, help="seeds 1..K per system")
    p.add_argument("--jobs", type=int, default=1, help="systems trained at a time")
    p.add_argument("--cpu", action="store_true", help="fairseq-train/generate --cpu")
    p.add_argument(
        "--width",
        type=int,
        help="model width for every system (Transformers: embed W, FFN 4W, "
        "max(2, W/64) heads; RNMT+: cells W; Deep-Att: embed W/2, cells W); default: the presets'",
    )
    p.add_argument(
        "--recipe",
        choices=["paper", "shared"],
        default="paper",
        help="optimiser and LR schedule: 'paper' (default) gives RNMT+ Chen et al.'s Adam and Eq. 1 "
        "(peak 3.2 x --lr, the paper's RNMT+/Transformer ratio, over --warmup updates), every other "
        "system (Deep-Att included: its paper's fixed 4e-5 does not train in a study's budget) the "
        "shared recipe; 'shared': Adam (0.9, 0.98), inverse_sqrt warm-up to --lr for every system",
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=1000, help="inverse_sqrt warm-up updates")
    p.add_argument("--dropout", type=float, help="default: each preset's own")
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument(
        "--valid-interval",
        type=_valid_interval,
        metavar="N|epoch",
        help="updates between validations and saved checkpoints (default: max-update/10, or 500), "
        "or 'epoch': at the end of every epoch (and where the budget stops training)",
    )
    p.add_argument(
        "--patience",
        type=int,
        default=0,
        metavar="N",
        help="stop a system once its validation loss has not improved for N validations in a row "
        "(fairseq --patience; results say 'plateau'); default 0: train to the budget",
    )
    p.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        default="fp32",
        help="every system's precision (fairseq-train's flag, and fairseq-generate's: --fp16 for "
        "fp16 and amp, --bf16 for bf16); a system whose flags or --train-args name one (--amp, "
        "--bf16, ...) keeps its own",
    )
    p.add_argument("--log-interval", type=int, default=50)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--gen-batch-size", type=int, default=128)
    p.add_argument(
        "--checkpoint", choices=["best", "last"], default="best", help="which checkpoint to decode"
    )
    p.add_argument(
        "--ref",
        help="raw reference text of the test set (plain or .gz), one line per sentence; "
        "default: fairseq-generate's T- lines, post-processed like the hypotheses",
    )
    p.add_argument(
        "--train-args",
        default="",
        help="more fairseq-train flags for every system "
        '(one string, split with shlex), e.g. "--fp16 --clip-norm 1"',
    )
    p.add_argument("--gen-args", default="", help="more fairseq-generate flags (one string)")
    p.add_argument("--bootstrap-samples", type=int, default=1000)
    p.add_argument(
        "--progress-every", type=float, default=60, help="seconds between progress lines"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the fairseq-train commands and stop"
    )
    return p


def _valid_interval(value: str):
    if value == EPOCH:
        return EPOCH
    try:
        every = int(value)
    except ValueError:
        every = 0
    if every < 1:
        raise argparse.ArgumentTypeError(f"expected a number of updates or 'epoch', got {value!r}")
    return every


def select_groups(args) -> Dict[str, Tuple[str, List[System]]]:
    depths = parse_depths(args.depths) if args.depths else None
    groups: Dict[str, Tuple[str, List[System]]] = {}
    for spec in args.group:
        baseline, systems = expand_group(spec, depths)
        groups[spec.partition(":")[0]] = (baseline, systems)
    if args.system:
        systems = [parse_system(v) for v in args.system]
        names = [s.name for s in systems]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise UserError(f"--system: the name {', '.join(dup)} is given twice")
        baseline = args.baseline or names[0]
        if baseline not in names:
            raise UserError(
                f"--baseline {baseline}: not one of the --system names {', '.join(names)}"
            )
        groups[CUSTOM] = (baseline, systems)
    if not groups:
        raise UserError("nothing to run: give --group NAME and/or --system NAME=ARCH")
    common_depth = infer_depth("", getattr(args, "train_args_list", []))
    for _, systems in groups.values():
        for s in systems:
            if s.depth is None:  # --train-args "--encoder-layers N" sets it for every system
                s.depth = common_depth
    for _, systems in groups.values():
        for s in systems:
            _ = s.spec  # the --arch resolved (an unknown one: stop before anything runs)
    return groups


def write_results(study: Study, out: str) -> dict:
    """results.json and results.md of the runs so far (a run not yet ended: its status), each
    written whole (a reader never sees half a file); the summary object."""
    summary = results(study)
    for name, text in (
        ("results.json", json.dumps(summary, indent=1)),
        ("results.md", markdown(summary)),
    ):
        path = os.path.join(out, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    return summary


def main(argv=None) -> int:
    args = get_parser().parse_args(argv)
    if not args.max_update and not args.minutes:
        raise UserError("give a budget: --max-update N and/or --minutes M")
    if args.jobs < 1 or args.seeds < 1:
        raise UserError("--jobs and --seeds must be at least 1")
    if args.patience < 0:
        raise UserError("--patience must be 0 (none) or a number of validations")
    args.train_args_list = shlex.split(args.train_args)
    args.gen_args_list = shlex.split(args.gen_args)
    if args.max_update:
        args.log_interval = max(1, min(args.log_interval, args.max_update))
    groups = select_groups(args)
    if args.dry_run:
        for _, systems in groups.values():
            for s in systems:
                print(
                    s.key,
                    " ".join(
                        shlex.quote(c)
                        for c in train_command(
                            args, s, 1, os.path.join(args.out, "runs", s.group, s.name, "seed1")
                        )[1:]
                    ),
                )
        return 0
    os.makedirs(args.out, exist_ok=True)
    study = Study(args, groups)
    logger.info(
        "%d systems x %d seeds = %d runs, %d at a time, under %s",
        len(study.runs) // args.seeds,
        args.seeds,
        len(study.runs),
        args.jobs,
        args.out,
    )
    study.ended = lambda run: write_results(study, args.out)
    study.run()
    summary = write_results(study, args.out)
    plots_written = plot(study, summary, os.path.join(args.out, "plots"))
    logger.info(
        "wrote %s, %s and %d plots",
        os.path.join(args.out, "results.json"),
        os.path.join(args.out, "results.md"),
        len(plots_written),
    )
    print(markdown(summary))
    failed = [r.label for r in study.runs if r.status != "done"]
    if failed:
        logger.warning(
            "%d run(s) failed: %s (logs under %s/runs)", len(failed), ", ".join(failed), args.out
        )
    return 1 if failed else 0


def cli_main():
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stderr,
        force=True,
    )
    quiet_warnings()

    def terminated(signum, frame):  # SIGTERM as Ctrl-C: the running fairseq processes end too
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminated)
    try:
        code = report_user_errors(main, "fairseq-deep-study")
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
