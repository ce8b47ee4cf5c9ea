"""The decisions of the own-data recipe (examples/own_data/run.sh), in Python so that they are tested.

    python -m fairseq_deep.own_data setup [ARCH [TRAIN FLAGS...]]    (settings from the environment)
    python -m fairseq_deep.own_data checkpoint SAVE_DIR N            (what to decode: an average or one)
    python -m fairseq_deep.own_data score REFERENCE GENERATE_OUT HYP_OUT

``setup`` checks every argument before any work (the languages, the raw files, the architecture,
and the whole fairseq-train command line through fairseq's own parser), sizes the run for the
device (CPU: width 256, a 30-minute budget; CUDA: Base width, 8 hours or 50,000 updates) and
prints shell assignments for run.sh: the training and decoding commands, and the seconds to
keep for what follows training (its start-up and last validation, averaging, decoding).  run.sh
gives training what is left of ``MINUTES`` after preparation and that reserve, as fairseq's
``--stop-time-hours``.  ``checkpoint`` averages the last epoch checkpoints of the second half of
training (and the final one), or names ``checkpoint_best.pt`` when there are too few.  ``score``
puts the hypotheses of fairseq-generate back in input order and prints one sacreBLEU line with
its signature (and chrF), and says what fairseq-generate's own BLEU4 is.

Decoding's estimate may take at most :data:`DECODE_SHARE` of the budget: a test set that would take
more is decoded in part, and ``setup`` says so with the MINUTES that decode it all; training warns
after its first updates when the budget cannot reach the end of warm-up (progress.BudgetCheck,
told the recipe's figures through ``FAIRSEQ_DEEP_RECIPE_BUDGET`` to name the MINUTES that would).

The budget's end is a guarantee, not the estimate: run.sh gives fairseq-deep-generate a deadline
(``FAIRSEQ_DEEP_DEADLINE``: the run's start + MINUTES - :data:`END_MARGIN_S`) after which it starts
no batch, and ``score`` then scores the sentences decoded against their own references and says so
in its line.
"""

import argparse
import math
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import ArgumentParser, UserError, report_user_errors
from .prepare import check_aligned, check_inputs
from .runs import Part, Run, read_generate, recipes

PROG = "run.sh"

#: defaults by device; every one can be set by an environment variable of the same name
DEFAULTS = {
    # measured (docs/study.md, equal time): width 128, lr 2e-3, 400 warm-up updates, 2,048-token batches
    # gave a 6 + 6 pre-norm Transformer 32.5 BLEU on Multi30k in 15 minutes on one CPU thread
    "cpu": {
        "MINUTES": 30,
        "WIDTH": 128,
        "MAX_UPDATE": 0,
        "LR": 2e-3,
        "WARMUP": 400,
        "MAX_TOKENS": 2048,
        "LOG_INTERVAL": 10,
    },
    "cuda": {
        "MINUTES": 480,
        "WIDTH": 512,
        "MAX_UPDATE": 50000,
        "LR": 1e-3,
        "WARMUP": 4000,
        "MAX_TOKENS": 4096,
        "LOG_INTERVAL": 100,
    },
}
COMMON = {"WORK": "own_data_run", "VOCAB": 8000, "BEAM": 5, "AVERAGE": 5, "PRECISION": ""}

#: fairseq-generate's batch (sentences)
DECODE_BATCH = 128
#: sentencepiece pieces per raw word (an estimate that errs long for European languages)
PIECES_PER_WORD = 1.3
#: seconds of one decoder step of a batch (128 sentences, beam 5) at width 128 with 6 decoder layers
#: on a CPU, and of validating one sentence of 11 words.  Measured on Multi30k de-en (1,000 test
#: sentences, a model of 36 updates that writes to the length bound) on a 2-core machine shared with
#: 6 other busy processes: decoding 1.9 s a step (5.6 sentences/s at first, 2.1 by the longest
#: batches; 8 minutes in all), validation 0.01-0.035 s a sentence.  A quiet machine is several times
#: faster and a trained model stops early, so 1.5 s errs long on most machines.  (A timing taken at
#: the start, tried, swung tenfold with the machine's load within minutes.)
CPU_STEP = 1.5
CPU_VALID_SENTENCE = 0.04
#: seconds of the budget after decoding's deadline: fairseq-generate's summary and exit, and scoring
END_MARGIN_S = 15
#: the most of the budget that decoding's estimate may take: the budget is for training, so a test
#: set that would take more is decoded in part (an evenly spaced fraction of its sentences in
#: fairseq's order by length: every length in it; progress.DECODE_FRACTION_ENV), and the script
#: says so.  (A 12-minute run on held-out data kept 438 s for decoding 1,000 sentences and
#: start-ups, and trained 238 s.)
DECODE_SHARE = 0.2


@dataclass
class Settings:
    device: str
    minutes: float
    width: int
    max_update: int
    lr: float
    warmup: int
    max_tokens: int
    log_interval: int
    work: str
    vocab: int
    beam: int
    average: int
    precision: str


def _number(env: Dict[str, str], name: str, default, kind):
    value = env.get(name, "")
    if value == "":
        return default
    try:
        number = kind(value)
    except ValueError:
        raise UserError(f"{name}={value}: not a number ({kind.__name__})") from None
    if number < 0 or (isinstance(number, float) and not math.isfinite(number)):
        raise UserError(f"{name}={value}: must be 0 or more")
    return number


def settings_from_env(env: Dict[str, str], device: str) -> Settings:
    """The run's settings: the device's defaults, each replaced by its environment variable."""
    d = {**DEFAULTS[device], **COMMON}
    s = Settings(
        device=device,
        minutes=_number(env, "MINUTES", d["MINUTES"], float),
        width=_number(env, "WIDTH", d["WIDTH"], int),
        max_update=_number(env, "MAX_UPDATE", d["MAX_UPDATE"], int),
        lr=_number(env, "LR", d["LR"], float),
        warmup=_number(env, "WARMUP", d["WARMUP"], int),
        max_tokens=_number(env, "MAX_TOKENS", d["MAX_TOKENS"], int),
        log_interval=_number(env, "LOG_INTERVAL", d["LOG_INTERVAL"], int),
        work=env.get("WORK") or d["WORK"],
        vocab=_number(env, "VOCAB", d["VOCAB"], int),
        beam=_number(env, "BEAM", d["BEAM"], int),
        average=_number(env, "AVERAGE", d["AVERAGE"], int),
        precision=env.get("PRECISION", d["PRECISION"]),
    )
    if s.minutes == 0 and s.max_update == 0:
        raise UserError("MINUTES=0 and MAX_UPDATE=0: give a budget (MINUTES=N, or MAX_UPDATE=N)")
    if s.max_tokens == 0 or s.beam == 0 or s.vocab == 0:
        raise UserError("MAX_TOKENS, BEAM and VOCAB must be 1 or more")
    return s


def reserve_seconds(*args, **kwargs) -> int:
    """:func:`reserve_parts` summed, in whole seconds."""
    return int(math.ceil(sum(reserve_parts(*args, **kwargs).values())))


def reserve_parts(
    test_sentences: int,
    test_words: float,
    valid_sentences: int,
    valid_words: float,
    width: int,
    layers: int,
    startup_s: float,
    device: str = "cpu",
    beam: int = 5,
) -> Dict[str, float]:
    """Seconds of the budget kept for what is not training: three start-ups (fairseq-train,
    averaging, fairseq-generate; ``startup_s`` each), the validation fairseq-train runs after its
    time is up, and decoding: a batch of DECODE_BATCH sentences takes at most 1.2 x its source + 10
    steps (--max-len-a/-b); a step's cost grows with width^1.5 (matrix products and the overhead
    of small ones), the decoder layers and the beam.  ``*_words``: mean raw words per sentence."""
    if device != "cpu":  # a GPU decodes a batch step in milliseconds: start-ups dominate
        return {
            "start-ups": 3 * startup_s + 30,
            "validation": 0.002 * valid_sentences,
            "decoding": 0.01 * test_sentences,
        }
    scale = (width / 128) ** 1.5 * max(1, layers) / 6
    steps = 1.2 * PIECES_PER_WORD * test_words + 10
    decode = math.ceil(test_sentences / DECODE_BATCH) * steps * CPU_STEP * scale * max(1, beam) / 5
    valid = valid_sentences * CPU_VALID_SENTENCE * scale * valid_words / 11
    return {"start-ups": 3 * startup_s + 10, "validation": valid, "decoding": decode}


def decode_fraction(decode_s: float, budget_s: float, share: float = DECODE_SHARE) -> float:
    """The fraction of the test set to decode: 1 unless decoding all of it (``decode_s``, the
    estimate) would take more than ``share`` of the budget (``budget_s``; 0: no time budget)."""
    if budget_s <= 0 or decode_s <= share * budget_s:
        return 1.0
    return share * budget_s / decode_s


def train_run(s: Settings, arch: str, data_bin: str, save_dir: str, extra: Sequence[str]) -> Run:
    """fairseq-train of the recipe but --stop-time-hours, which run.sh adds after preparation;
    ``extra`` comes last and so overrides."""
    return Run.of(
        "train",
        data_bin,
        Part("model", ["--arch", arch]),
        recipes.width(arch, s.width),
        ["--share-all-embeddings"],
        recipes.adam(f"{float(s.lr):g}"),
        recipes.inverse_sqrt(s.warmup),
        recipes.label_smoothed(0.1),
        {
            "max_tokens": s.max_tokens,
            "save_dir": save_dir,
            "keep_last_epochs": max(1, s.average),
            "log_format": "simple",
            "log_interval": s.log_interval,
            "max_update": s.max_update or None,
            "cpu": s.device == "cpu",
        },
        Part("precision", shlex.split(s.precision)),
        Part("extra", extra),
    )


def train_command(
    s: Settings, arch: str, data_bin: str, save_dir: str, extra: Sequence[str]
) -> List[str]:
    """fairseq-train's arguments of :func:`train_run` (run.sh's ``TRAIN``; the program not
    included)."""
    return train_run(s, arch, data_bin, save_dir, extra).arguments(user_dir=False)


def generate_run(s: Settings, data_bin: str) -> Run:
    """fairseq-generate of the test set but --path.  Output at most 1.2 x the source + 10 tokens
    long, so that an undertrained model that repeats itself cannot stretch the decoding time."""
    return Run.of(
        "generate",
        data_bin,
        {
            "gen_subset": "test",
            "beam": s.beam,
            "batch_size": DECODE_BATCH,
            "max_len_a": 1.2,
            "max_len_b": 10,
        },
        recipes.post_process("sentencepiece"),
        {"cpu": s.device == "cpu"},
        Part("precision", shlex.split(s.precision)),
    )


def generate_command(s: Settings, data_bin: str) -> List[str]:
    """fairseq-generate's arguments of :func:`generate_run` but --path (run.sh's ``GENERATE``)."""
    return generate_run(s, data_bin).arguments(user_dir=False)


def interactive_run(data_bin: str, src: str, tgt: str, spm_model: str, device: str) -> Run:
    """fairseq-interactive of raw text (sentencepiece applied and removed) but --path."""
    return Run.of(
        "interactive",
        data_bin,
        recipes.languages(src, tgt),
        recipes.sentencepiece(spm_model),
        ["--cpu"] if device == "cpu" else [],
    )


def check_train_command(cmd: Sequence[str]) -> argparse.Namespace:
    """fairseq-train's parser on the whole command (an unknown option, a bad value, a preset's
    refusal: a :class:`UserError`), without data or a model; returns the parsed arguments."""
    from fairseq import options

    from .cli import PLUGIN_DIR, check_arch

    argv = ["--user-dir", PLUGIN_DIR, *cmd, "--stop-time-hours", "1"]
    check_arch(["fairseq-train", *argv])
    parser = options.get_training_parser()

    def error(message):
        raise UserError(f"fairseq-train: {message}")

    parser.error = error
    return options.parse_args_and_arch(parser, argv)


def sentences_and_words(path: str) -> Tuple[int, float]:
    """Lines of a raw text file and their mean number of space-separated words."""
    from .prepare import open_text

    lines = words = 0
    with open_text(path) as f:
        for line in f:
            lines += 1
            words += len(line.split())
    return lines, words / max(1, lines)


def detect_device(env: Dict[str, str]) -> str:
    if env.get("DEVICE", "").strip() == "--cpu":  # run.sh's old setting
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _shell(name: str, value) -> str:
    if isinstance(value, (list, tuple)):
        return f"{name}=(" + " ".join(shlex.quote(str(v)) for v in value) + ")"
    return f"{name}={shlex.quote(str(value))}"


def setup(argv: Sequence[str], env: Dict[str, str], out=sys.stdout, log=sys.stderr):
    """Check everything run.sh will do and print its shell assignments (nothing is written)."""
    arch = argv[0] if argv else "transformer_dlcl"
    extra = list(argv[1:])
    for name in ("SRC", "TGT", "RAW"):
        if not env.get(name):
            raise UserError(
                f"set {name}: SRC=de TGT=en RAW=path/to/raw bash examples/own_data/run.sh [ARCH] "
                "[fairseq-train flags] (RAW holds train/valid/test.{SRC,TGT}[.gz])"
            )
    src, tgt, raw = env["SRC"], env["TGT"], env["RAW"]
    if not os.path.isdir(raw):
        raise UserError(
            f"RAW={raw}: no such folder (it should hold train, valid and test .{src}/.{tgt} files)"
        )
    device = detect_device(env)
    s = settings_from_env(env, device)
    from .cli import check_arch

    check_arch(["fairseq-train", "--arch", arch])  # a mistyped name: the nearest ones
    prefixes = {split: os.path.join(raw, split) for split in ("train", "valid", "test")}
    files = check_inputs(prefixes, src, tgt)
    check_aligned(
        files, prefixes, src, tgt
    )  # an empty or misaligned file: before any folder is made
    work = s.work
    data_bin = os.path.join(work, "data-bin")
    save_dir = os.path.join(work, "checkpoints", f"{arch}_w{s.width}" if s.width else arch)
    train = train_command(s, arch, data_bin, save_dir, extra)
    args = check_train_command(train)
    generate = generate_command(s, data_bin)
    test_sentences, test_words = sentences_and_words(files[f"test.{src}"])
    valid_sentences, valid_words = sentences_and_words(files[f"valid.{src}"])
    width = getattr(args, "decoder_embed_dim", None) or s.width or 512
    layers = getattr(args, "decoder_layers", None) or 6
    start = float(env.get("RUN_START") or 0)
    startup = (
        max(10.0, time.time() - start) if start else 20.0
    )  # this process's start: python, torch, fairseq
    parts = reserve_parts(
        test_sentences,
        test_words,
        valid_sentences,
        valid_words,
        width,
        layers,
        startup,
        device,
        s.beam,
    )
    budget = int(round(s.minutes * 60))
    decode_all = parts["decoding"]
    fraction = decode_fraction(decode_all, budget)
    parts["decoding"] = decode_all * fraction
    reserve = int(math.ceil(sum(parts.values())))
    resumed = os.path.exists(os.path.join(save_dir, "checkpoint_last.pt"))
    values = {
        "WORK": work,
        "SAVE": save_dir,
        "DATA_BIN": data_bin,
        "PREFIX_TRAIN": prefixes["train"],
        "PREFIX_VALID": prefixes["valid"],
        "PREFIX_TEST": prefixes["test"],
        "VOCAB": s.vocab,
        "BUDGET_S": budget,
        "RESERVE_S": reserve,
        "MARGIN_S": END_MARGIN_S,
        "AVERAGE": s.average,
        "DEVICE_KIND": device,
        "REF": files[f"test.{tgt}"],
        "TRAIN": train,
        "GENERATE": generate,
        "DECODE_FRACTION": f"{fraction:.4f}" if fraction < 1 else "",
        # for training's warning of a budget too small to learn: what is neither training nor decoding, decoding
        "RESERVE_FIXED_S": int(math.ceil(reserve - parts["decoding"])),
        "DECODE_ALL_S": int(math.ceil(decode_all)),
        "DECODE_SHARE": DECODE_SHARE,
        "INTERACTIVE": interactive_run(
            data_bin, src, tgt, os.path.join(work, "spm.model"), device
        ).arguments(user_dir=False),
    }
    for name, value in values.items():
        print(_shell(name, value), file=out)
    width = f"width {s.width}" if s.width else "the architecture's own width"
    budget_text = (
        f"a budget of {s.minutes:g} minutes in all (MINUTES)" if s.minutes else "no time budget"
    )
    print(
        f"{PROG}: {arch} at {width} on {'the CPU' if device == 'cpu' else 'CUDA'}, {budget_text}"
        + (f", at most {s.max_update} updates" if s.max_update else "")
        + f"; {reserve} s of it kept for what follows training ("
        + ", ".join(f"{name} {value:.0f} s" for name, value in parts.items())
        + f" for {test_sentences} test sentences; an estimate)"
        + (
            f"; resuming {save_dir}/checkpoint_last.pt (the time it trained counts)"
            if resumed
            else ""
        ),
        file=log,
    )
    if fraction < 1:
        print(
            f"{PROG}: decoding about {max(1, round(fraction * test_sentences)):,} of the {test_sentences:,} test "
            f"sentences (a subset of every length), since all of them would take about {decode_all:.0f} s, more than "
            f"{DECODE_SHARE:.0%} of the budget; MINUTES={math.ceil(decode_all / DECODE_SHARE / 60)} decodes them all",
            file=log,
        )


# ---------------------------------------------------------------------------------------- checkpoint

_EPOCH = re.compile(r"^checkpoint(\d+)\.pt$")


def choose_checkpoints(last_updates: int, epochs: Sequence[Tuple[str, int]], n: int) -> List[str]:
    """What to average: ``checkpoint_last.pt`` and the newest epoch checkpoints (``(path, updates)``)
    before it, at most ``n`` in all, of the second half of training only (an early checkpoint
    pulls an average back).  Fewer than two: ``[]`` (decode checkpoint_best.pt)."""
    if n < 2:
        return []
    earlier = sorted((u, p) for p, u in epochs if last_updates / 2 <= u < last_updates)
    chosen = [p for _, p in earlier[-(n - 1) :]]
    return chosen + ["checkpoint_last.pt"] if chosen else []


def _updates(path: str) -> int:
    from .checkpoints import load_as_saved as torch_load_checked

    state = torch_load_checked(path)
    history = state.get("optimizer_history") or [{}]
    return int(history[-1].get("num_updates", 0))


def checkpoint(save_dir: str, n: int, log=sys.stderr) -> str:
    """The checkpoint to decode: the average of :func:`choose_checkpoints` (written to
    ``SAVE_DIR/checkpoint_average.pt``) or ``checkpoint_best.pt``."""
    best = os.path.join(save_dir, "checkpoint_best.pt")
    last = os.path.join(save_dir, "checkpoint_last.pt")
    if not os.path.exists(last):
        raise UserError(
            f"{last}: no checkpoint; training saved none (see {save_dir}/../../train.log)"
        )
    epochs = (
        [
            (os.path.join(save_dir, f), _updates(os.path.join(save_dir, f)))
            for f in os.listdir(save_dir)
            if _EPOCH.match(f)
        ]
        if n >= 2
        else []
    )
    last_updates = _updates(last)
    chosen = choose_checkpoints(last_updates, epochs, n)
    if not chosen:
        print(
            f"{PROG}: decoding checkpoint_best.pt (too few epoch checkpoints in the second half of "
            f"training to average: {len(epochs)} epoch(s) kept, {last_updates} updates)",
            file=log,
        )
        return best
    paths = [last if c == "checkpoint_last.pt" else c for c in chosen]
    from fairseq import checkpoint_utils

    from .average_checkpoints import average_checkpoints

    out = os.path.join(save_dir, "checkpoint_average.pt")
    checkpoint_utils.torch_persistent_save(average_checkpoints(paths), out)
    print(
        f"{PROG}: decoding the average of the last {len(paths)} checkpoints "
        f"({', '.join(os.path.basename(p) for p in paths)}; up to update {last_updates}): {out}",
        file=log,
    )
    return out


# --------------------------------------------------------------------------------------------- score


def score(reference: str, generate_out: str, hyp_out: str, out=sys.stdout) -> float:
    """One sacreBLEU line of the hypotheses of ``generate_out`` against ``reference``, written in
    input order to ``hyp_out``.  When fewer sentences were decoded than the test set has (the
    deadline of run.sh's budget stopped decoding), the decoded ones are scored against their own
    references (by sentence id) and the line says so; ``hyp_out`` then has an empty line for each
    sentence not decoded, so that its lines stay those of the test set."""
    import sacrebleu

    from .prepare import read_lines
    from .progress import DEADLINE_STOP, DECODE_SUBSET

    refs = read_lines(reference)
    generated = read_generate(generate_out)
    by_id = generated.detok
    strays = sorted(i for i in by_id if not 0 <= i < len(refs))
    if strays or not by_id:
        raise UserError(
            f"{generate_out}: {len(by_id)} hypotheses for {len(refs)} test sentences in {reference}"
            + (f" (ids {', '.join(map(str, strays[:3]))} are not lines of it)" if strays else "")
        )
    ids = sorted(by_id)
    hyps = [by_id[i] for i in ids]
    with open(hyp_out, "w", encoding="utf-8") as f:
        f.writelines(by_id.get(i, "") + "\n" for i in range(len(refs)))
    chosen = [refs[i] for i in ids]
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()  # objects, for the signature: not runs.score
    b = bleu.corpus_score(hyps, [chosen])
    c = chrf.corpus_score(hyps, [chosen])
    fairseq_bleu = generated.bleu4
    stopped = any(DEADLINE_STOP in line for line in generated.lines)
    subset = any(DECODE_SUBSET in line for line in generated.lines)
    part = ""
    if len(ids) < len(refs):
        why = (
            "the budget ran out while decoding; a larger MINUTES decodes all"
            if stopped
            else "a subset of every length, so that decoding left the budget to training; run.sh's first lines say "
            "the MINUTES that decode all"
            if subset
            else f"fairseq-generate decoded only these; see {generate_out}"
        )
        part = f" on {len(ids):,} of {len(refs):,} test sentences ({why}):"
    print(f"sacreBLEU{part} {b}   (signature {bleu.get_signature()}; {c})", file=out)
    if fairseq_bleu is not None:
        print(
            f'(fairseq-generate\'s own "BLEU4 = {fairseq_bleu}" in {generate_out} is another number: it '
            "splits the same output at spaces only, so punctuation stays on words; report the sacreBLEU line, "
            "which is comparable with published scores)",
            file=out,
        )
    return b.score


def main(argv: Optional[Sequence[str]] = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = ArgumentParser(prog="python -m fairseq_deep.own_data", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["setup", "checkpoint", "score"])
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv[:1])
    rest = argv[1:]
    if a.command == "setup":
        from .quiet import quiet_warnings

        quiet_warnings()
        report_user_errors(lambda: setup(rest, dict(os.environ)), PROG)
    elif a.command == "checkpoint":
        if len(rest) != 2:
            p.error("checkpoint SAVE_DIR N")
        report_user_errors(lambda: print(checkpoint(rest[0], int(rest[1]))), PROG)
    else:
        if len(rest) != 3:
            p.error("score REFERENCE GENERATE_OUT HYP_OUT")
        report_user_errors(lambda: score(*rest), PROG)


if __name__ == "__main__":
    main()
