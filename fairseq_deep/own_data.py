"""The decisions of the own-data recipe (examples/own_data/run.sh), in Python so that they are tested.

    python -m fairseq_deep.own_data setup [ARCH [TRAIN FLAGS...]]    (settings from the environment)
    python -m fairseq_deep.own_data checkpoint SAVE_DIR N            (what to decode: an average or one)
    python -m fairseq_deep.own_data score REFERENCE GENERATE_OUT HYP_OUT

``setup`` checks every argument before any work (the languages, the raw files, the architecture,
and the whole fairseq-train command line through fairseq's own parser), sizes the run for the
device (CPU: width 128, a 30-minute budget; CUDA: Base width, 8 hours or 50,000 updates), times
the recipe's model on this machine (:func:`measure_speed`: steps of beam search and a forward of a
batch, a freshly initialised model of the architecture and width) and prints shell assignments
for run.sh: the training and decoding commands, and the seconds to keep for what follows training
(its start-up and last validation, averaging, decoding at the speed measured).  run.sh gives
training what is left of ``MINUTES`` after preparation and that reserve, as fairseq's
``--stop-time-hours``.  ``checkpoint`` averages the last epoch checkpoints of the second half of
training (and the final one), or names ``checkpoint_best.pt`` when there are too few, and warns
when training ended before the end of warm-up (:func:`short_of_warmup`).  ``score``
puts the hypotheses of fairseq-generate back in input order and prints one sacreBLEU line with
its signature (and chrF), and says what fairseq-generate's own BLEU4 is.

RAW's validation set is ``valid.SRC``/``.TGT``, or Multi30k's ``val.*`` where those are missing
(said); a missing file's error names the files of RAW that look like it
(``test_2016_flickr.de.gz``).
``setup`` says whether CTranslate2 can serve the model (:func:`why_not_served`: the family's rule
of fairseq-deep-export), and gives run.sh the commands it prints at its end: the export, or for a
model that does not export the path around it (:func:`serving_runs`: distil the training set,
train a :data:`STUDENT_ARCH` student on it, export the student).
A run in a WORK that holds an earlier run's ``train.log``, ``generate.out``, ``score.txt`` and
``test.hyp`` keeps them as ``NAME.N`` (:func:`earlier_run`; said), as the checkpoints and the
preparation are kept and resumed.

Decoding's reserve may take at most :data:`DECODE_SHARE` of the budget (``setup`` says when the
measured bound is more, with the MINUTES that keep enough for all); training warns after its
first updates when the budget cannot reach the end of warm-up (progress.BudgetCheck, told the
recipe's figures through ``FAIRSEQ_DEEP_RECIPE_BUDGET`` to name the MINUTES that would).

The budget's end is a guarantee, not the estimate: run.sh gives fairseq-deep-generate a deadline
(``FAIRSEQ_DEEP_DEADLINE``: the run's start + MINUTES - :data:`END_MARGIN_S`).  Decoding measures
its own speed on its first batches, decodes the whole test set when the time left allows, and
only otherwise an evenly spaced subset sized by that speed (:func:`fairseq_deep.progress.decoding_plan`),
saying so with the speed; it starts no batch after the deadline.  ``score`` then scores the
sentences decoded against their own references and says so in its line.
"""

import argparse
import math
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .average_checkpoints import average_checkpoints
from .checkpoints import load_as_saved
from .cli import PLUGIN_DIR, check_arch
from .errors import ArgumentParser, UserError, report_user_errors
from .models import families
from .models.families import Spec
from .prepare import check_aligned, check_inputs, find_file, open_text, read_lines
from .progress import (
    DEADLINE_STOP,
    DECODE_FRACTION_ENV,
    DECODE_SUBSET,
    RECIPE_BUDGET_ENV,
    recipe_minutes,
)
from .quiet import quiet_warnings
from .runs import Part, Run, flags, read_generate, recipes

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
#: decoding's length limit: at most MAX_LEN_A x the source + MAX_LEN_B tokens (fairseq-generate's
#: --max-len-a/b; CTranslate2 given the same by serving.length_limit)
MAX_LEN_A, MAX_LEN_B = 1.2, 10
#: sentencepiece pieces per raw word (an estimate that errs long for European languages)
PIECES_PER_WORD = 1.3
#: decoder steps of beam search timed by :func:`measure_speed` (then scaled to the length bound)
PROBE_STEPS = 8
#: seconds of the budget after decoding's deadline: fairseq-generate's summary and exit, and scoring
END_MARGIN_S = 15
#: the splits of RAW, and the other names of a split taken where its own files are missing (Multi30k
#: names its validation set val.de.gz, val.en.gz)
SPLITS = ("train", "valid", "test")
SPLIT_NAMES = {"valid": ("val",)}
#: what a run of run.sh writes in WORK and a later run would overwrite (the preparation and the
#: checkpoints are reused, not rewritten): an earlier run's are kept as NAME.N (:func:`earlier_run`)
RUN_FILES = ("train.log", "generate.out", "score.txt", "test.hyp")
#: the most of the budget that decoding's reserve may take: the budget is for training.  Decoding
#: itself decides how much of the test set the time left allows, from its own speed (progress's
#: decoding plan): all of it when it fits, else an evenly spaced subset.  (A 12-minute run on
#: held-out data once kept 438 s for decoding 1,000 sentences and start-ups, and trained 238 s.)
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


@dataclass
class Speed:
    """Decoding and validation measured on this machine with this model (:func:`measure_speed`),
    for a batch of ``batch`` sentences of ``pieces`` source pieces: ``encoder_s``, its encoder;
    ``step_s``, one decoder step of beam search; ``forward_s``, the teacher-forced forward of the
    batch (validation's work)."""

    encoder_s: float
    step_s: float
    forward_s: float
    pieces: float
    batch: int = DECODE_BATCH

    def decoding_s(self, sentences: int) -> float:
        """At most: every batch decoded to the length bound (1.2 x the source + 10 steps, as the
        recipe's --max-len-a/-b, and the end of sentence), as an untrained model does; a trained
        one ends most sentences well before it."""
        steps = 1.2 * self.pieces + 10 + 1
        return math.ceil(sentences / self.batch) * (self.encoder_s + steps * self.step_s)

    def validation_s(self, sentences: int, words: float, test_words: float) -> float:
        return sentences / self.batch * self.forward_s * words / max(1e-9, test_words)

    def update_s(self, max_tokens: int) -> float:
        """One training update of ``max_tokens`` tokens: a forward and a backward (twice a
        forward's work) of that many.  fairseq stops at --stop-time-hours after the update it is
        in, so the last one runs past it."""
        return 3 * self.forward_s * max_tokens / (self.batch * self.pieces)


def measure_speed(args, vocab: int, words: float, beam: int, device: str) -> Speed:
    """Times the model of ``args`` (fairseq-train's parsed arguments of the recipe; built as
    fairseq-train builds it, with a dictionary of ``vocab`` pieces, freshly initialised) on this
    machine, on a batch of :data:`DECODE_BATCH` sentences of ``words`` raw words in pieces (random
    ones: the time of a step does not depend on what it reads): its encoder, :data:`PROBE_STEPS`
    steps of fairseq's beam search (``beam``; the encoder's time taken off) and one forward.
    Nothing is written."""
    import torch
    from fairseq import tasks
    from fairseq.data import Dictionary
    from fairseq.sequence_generator import SequenceGenerator

    d = Dictionary()
    while len(d) < vocab:
        d.add_symbol(f"w{len(d)}")
    task = tasks.translation.TranslationTask(args, d, d)
    torch.manual_seed(1)
    model = task.build_model(args).eval().to(device)
    if device != "cpu" and getattr(args, "fp16", False):
        model.half()
    elif device != "cpu" and getattr(args, "bf16", False):
        model.to(torch.bfloat16)
    pieces = max(2, round(PIECES_PER_WORD * words) + 1)  # the end of sentence included
    gen = torch.Generator().manual_seed(1)

    def batch(n):
        src = torch.randint(d.nspecial, len(d), (n, pieces), generator=gen)
        src[:, -1] = d.eos()
        prev = torch.cat([src[:, -1:], src[:, :-1]], dim=1)
        lengths = torch.full((n,), pieces)
        return src.to(device), lengths.to(device), prev.to(device)

    def timed(fn):
        if device != "cpu":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device != "cpu":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    search = SequenceGenerator([model], d, beam_size=beam, max_len_a=0, max_len_b=PROBE_STEPS)
    with torch.no_grad():
        model(*batch(2))  # the first call's allocations are not a step's
        src, lengths, prev = batch(DECODE_BATCH)
        encoder_s = timed(lambda: model.encoder(src, src_lengths=lengths))
        forward_s = timed(lambda: model(src, lengths, prev))
        net_input = {"src_tokens": src, "src_lengths": lengths}
        search_s = timed(lambda: search.generate([model], {"net_input": net_input}))
    steps = PROBE_STEPS + 1  # fairseq's last step writes the end of sentence
    return Speed(
        encoder_s=encoder_s,
        step_s=max(0.0, search_s - encoder_s) / steps,
        forward_s=forward_s,
        pieces=pieces,
    )


def reserve_parts(
    speed: Speed,
    test_sentences: int,
    test_words: float,
    valid_sentences: int,
    valid_words: float,
    startup_s: float,
    device: str = "cpu",
    max_tokens: int = 0,
) -> Dict[str, float]:
    """Seconds of the budget for what is not training, at the ``speed`` measured: three start-ups
    (fairseq-train, averaging, fairseq-generate; ``startup_s`` each), the update in progress when
    the time is up (of ``max_tokens``) and the validation fairseq-train runs then, and decoding the
    whole test set (at most: see :meth:`Speed.decoding_s`).  ``*_words``: mean raw words per
    sentence."""
    return {
        "start-ups": 3 * startup_s + (10 if device == "cpu" else 30),
        "last update": speed.update_s(max_tokens),
        "validation": speed.validation_s(valid_sentences, valid_words, test_words),
        "decoding": speed.decoding_s(test_sentences),
    }


def train_run(s: Settings, arch: Spec, data_bin: str, save_dir: str, extra: Sequence[str]) -> Run:
    """fairseq-train of the recipe (``arch``: the --arch resolved, :func:`families.spec`) but
    --stop-time-hours, which run.sh adds after preparation; ``extra`` comes last and so overrides."""
    return Run.of(
        "train",
        data_bin,
        Part("model", ["--arch", arch.arch]),
        recipes.width(arch, s.width),
        ["--share-all-embeddings"],
        recipes.adam(f"{float(s.lr):g}"),
        recipes.inverse_sqrt(s.warmup),
        recipes.label_smoothed(0.1),
        recipes.budget(max_tokens=s.max_tokens),
        recipes.saving(save_dir=save_dir, keep_last_epochs=max(1, s.average)),
        Part("logging", flags({"log_format": "simple", "log_interval": s.log_interval})),
        recipes.budget(max_update=s.max_update or None),
        {"cpu": s.device == "cpu"},
        Part("precision", shlex.split(s.precision)),
        Part("extra", extra),
        arch=arch,
    )


def train_command(
    s: Settings, arch: Spec, data_bin: str, save_dir: str, extra: Sequence[str]
) -> List[str]:
    """fairseq-train's arguments of :func:`train_run` (run.sh's ``TRAIN``; the program not
    included)."""
    return train_run(s, arch, data_bin, save_dir, extra).arguments(user_dir=False)


def search(s: Settings, **settings) -> Part:
    """The recipe's beam search (``settings``: more of :func:`recipes.decoding`'s).  Output at most
    1.2 x the source + 10 tokens long, so that an undertrained model that repeats itself cannot
    stretch the decoding time."""
    return recipes.decoding(
        **settings, beam=s.beam, batch_size=DECODE_BATCH, max_len_a=MAX_LEN_A, max_len_b=MAX_LEN_B
    )


def on_device(s: Settings) -> List[Part]:
    """The recipe's device and precision options of a decoding run."""
    return [
        Part("settings", flags({"cpu": s.device == "cpu"})),
        Part("precision", shlex.split(s.precision)),
    ]


def generate_run(s: Settings, data_bin: str) -> Run:
    """fairseq-generate of the test set but --path (:func:`search`)."""
    return Run.of(
        "generate",
        data_bin,
        search(s, gen_subset="test"),
        recipes.post_process("sentencepiece"),
        *on_device(s),
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


# ----------------------------------------------------------------------------------------- serving

#: the student of a model that CTranslate2 cannot serve: a pre-norm Transformer of the recipe's width,
#: 6 + 6 layers (the family's baseline, which fairseq-deep-export folds into fairseq's transformer)
STUDENT_ARCH = "transformer_prenorm"


def why_not_served(args: argparse.Namespace) -> Optional[str]:
    """None when the recipe's model (one of this package's) is served by CTranslate2 after
    training (fairseq-deep-export: it reduces to fairseq's transformer), else why not (the family's
    declared rule).  The rules read what a model is built of (its history, its layers), never its
    weights, so a freshly built model of the recipe's options (a dictionary of a few pieces: fast)
    answers for the trained one."""
    import torch
    from fairseq import tasks
    from fairseq.data import Dictionary

    from .models.reduction import why_not_transformer

    d = Dictionary()
    with torch.random.fork_rng():
        model = tasks.translation.TranslationTask(args, d, d).build_model(args)
    return why_not_transformer(families.spec(args.arch).model, model)


def distill_run(s: Settings, data_bin: str, destdir: str) -> Run:
    """fairseq-deep-distill of ``data_bin``'s training split into ``destdir`` with the recipe's
    decoding (:func:`search`), but --path (the teacher)."""
    return Run.of("distill", data_bin, search(s), *on_device(s), flags({"destdir": destdir}))


def export_run(s: Settings, data_bin: str, out: str, checkpoint: Optional[str] = None) -> Run:
    """fairseq-deep-export to CTranslate2 (``out``), its timing of the ways to serve done with the
    recipe's decoding (beam, length limit, batch): what it finds fastest is for the translations
    the recipe makes (``translate.py --fastest``).  Without ``checkpoint``, run.sh adds it."""
    return Run.of(
        "export",
        None,
        flags(
            {
                "checkpoint": checkpoint,
                "data": data_bin,
                "out": out,
                "timing_beam": s.beam,
                "timing_max_len_a": MAX_LEN_A,
                "timing_max_len_b": MAX_LEN_B,
                "timing_batch_size": DECODE_BATCH,
            }
        ),
    )


def serving_runs(s: Settings, data_bin: str, work: str, served: bool) -> Dict[str, Run]:
    """What run.sh prints at its end to serve the model with CTranslate2, but the checkpoint it
    decoded (run.sh adds it): a model that reduces, ``export`` (fairseq-deep-export); one that does
    not, the path around it (docs/distill.md): ``distill`` (the teacher's translations of the
    training set, fairseq-deep-distill, with the recipe's decoding), ``student`` (a
    :data:`STUDENT_ARCH` trained on them by the recipe's settings) and ``export`` of the student."""
    ct2 = os.path.join(work, "ctranslate2")
    if served:
        return {"export": export_run(s, data_bin, ct2)}
    distilled = os.path.join(work, "distilled")
    save = os.path.join(work, "checkpoints", f"student_{STUDENT_ARCH}_w{s.width}")
    return {
        "distill": distill_run(s, data_bin, distilled),
        "student": train_run(s, families.spec(STUDENT_ARCH), distilled, save, []),
        "export": export_run(s, distilled, ct2, os.path.join(save, "checkpoint_best.pt")),
    }


def check_train_command(cmd: Sequence[str]) -> argparse.Namespace:
    """fairseq-train's parser on the whole command (an unknown option, a bad value, a preset's
    refusal: a :class:`UserError`), without data or a model; returns the parsed arguments."""
    from fairseq import options

    argv = ["--user-dir", PLUGIN_DIR, *cmd, *recipes.budget(stop_time_hours=1)]
    check_arch(["fairseq-train", *argv])
    parser = options.get_training_parser()

    def error(message):
        raise UserError(f"fairseq-train: {message}")

    parser.error = error
    return options.parse_args_and_arch(parser, argv)


def sentences_and_words(path: str) -> Tuple[int, float]:
    """Lines of a raw text file and their mean number of space-separated words."""
    lines = words = 0
    with open_text(path) as f:
        for line in f:
            lines += 1
            words += len(line.split())
    return lines, words / max(1, lines)


def _has(prefix: str, *langs: str) -> bool:
    """``PREFIX.LANG`` (plain or .gz) of every one of ``langs`` is there."""
    return all(any(os.path.exists(f"{prefix}.{lang}{gz}") for gz in ("", ".gz")) for lang in langs)


def split_prefixes(raw: str, src: str, tgt: str) -> Dict[str, str]:
    """RAW's prefix of each split: ``RAW/SPLIT``, or one of the split's other names
    (:data:`SPLIT_NAMES`: Multi30k's ``val``) where ``SPLIT.SRC`` or ``SPLIT.TGT`` is missing and
    both files of the other name are there (plain or .gz)."""
    prefixes = {}
    for split in SPLITS:
        prefix = os.path.join(raw, split)
        if not _has(prefix, src, tgt):
            prefix = next(
                (
                    os.path.join(raw, other)
                    for other in SPLIT_NAMES.get(split, ())
                    if _has(os.path.join(raw, other), src, tgt)
                ),
                prefix,
            )
        prefixes[split] = prefix
    return prefixes


def look_alikes(raw: str, split: str, lang: str) -> List[str]:
    """The files of RAW that may be ``split``'s in ``lang`` under another name (its other names
    and ``SPLIT*.LANG[.gz]``: Multi30k's ``test_2016_flickr.de.gz``)."""
    stems = (split, *SPLIT_NAMES.get(split, ()))
    lang_end = re.compile(rf"\.{re.escape(lang)}(\.gz)?$")
    return sorted(
        name for name in os.listdir(raw) if name.startswith(stems) and lang_end.search(name)
    )


def find_inputs(raw: str, src: str, tgt: str) -> Tuple[Dict[str, str], Dict[str, str]]:
    """``(prefixes, files)`` of the splits (:func:`split_prefixes`, :func:`check_inputs`); a
    missing file's error names the files of RAW that look like it, and what to do."""
    prefixes = split_prefixes(raw, src, tgt)
    for split, prefix in prefixes.items():
        for lang in (src, tgt):
            try:
                find_file(prefix, lang)
            except UserError as e:
                alikes = look_alikes(raw, split, lang)
                if not alikes:
                    raise
                raise UserError(
                    f"{e}; {raw} holds {', '.join(alikes)}: name (or link) the one to use "
                    f"{split}.{lang}{'.gz' if alikes[0].endswith('.gz') else ''}"
                ) from None
    return prefixes, check_inputs(prefixes, src, tgt)


def earlier_run(work: str) -> Tuple[int, List[Tuple[str, str]]]:
    """What a new run in ``work`` would overwrite (:data:`RUN_FILES` there) and the names it is
    kept under: ``NAME.N``, N the first number no file of :data:`RUN_FILES` has yet, so that an
    earlier run's files keep one number (``.1`` the first run's, ``.2`` the second's, ...).
    ``(0, [])`` when there is none.  run.sh renames them (``EARLIER``); nothing is written here."""
    present = [name for name in RUN_FILES if os.path.exists(os.path.join(work, name))]
    if not present:
        return 0, []
    n = 1
    while any(os.path.exists(os.path.join(work, f"{name}.{n}")) for name in RUN_FILES):
        n += 1
    return n, [(os.path.join(work, name), os.path.join(work, f"{name}.{n}")) for name in present]


def detect_device(env: Dict[str, str]) -> str:
    if env.get("DEVICE", "").strip() == "--cpu":  # run.sh's old setting
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _shell(name: str, value) -> str:
    if isinstance(value, (list, tuple)):
        return f"{name}=(" + " ".join(shlex.quote(str(v)) for v in value) + ")"
    return f"{name}={shlex.quote(str(value))}"


def setup(
    argv: Sequence[str],
    env: Dict[str, str],
    out=sys.stdout,
    log=sys.stderr,
    measure: Callable[..., Speed] = measure_speed,
    served: Callable[[argparse.Namespace], Optional[str]] = why_not_served,
):
    """Check everything run.sh will do, time the model's decoding here (``measure``), and print
    run.sh's shell assignments (nothing is written)."""
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
    check_arch(["fairseq-train", "--arch", arch])  # a mistyped name: the nearest ones
    prefixes, files = find_inputs(raw, src, tgt)
    check_aligned(
        files, prefixes, src, tgt
    )  # an empty or misaligned file: before any folder is made
    work = s.work
    data_bin = os.path.join(work, "data-bin")
    save_dir = os.path.join(work, "checkpoints", f"{arch}_w{s.width}" if s.width else arch)
    train = train_command(s, families.spec(arch), data_bin, save_dir, extra)
    args = check_train_command(train)
    generate = generate_command(s, data_bin)
    test_sentences, test_words = sentences_and_words(files[f"test.{src}"])
    valid_sentences, valid_words = sentences_and_words(files[f"valid.{src}"])
    start = float(env.get("RUN_START") or 0)
    startup = (
        max(10.0, time.time() - start) if start else 20.0
    )  # this process's start: python, torch, fairseq
    speed = measure(args, s.vocab, test_words, s.beam, device)
    parts = reserve_parts(
        speed,
        test_sentences,
        test_words,
        valid_sentences,
        valid_words,
        startup,
        device,
        s.max_tokens,
    )
    budget = int(round(s.minutes * 60))
    decode_all = parts["decoding"]
    if budget > 0:
        parts["decoding"] = min(decode_all, DECODE_SHARE * budget)
    reserve = int(math.ceil(sum(parts.values())))
    resumed = os.path.exists(os.path.join(save_dir, "checkpoint_last.pt"))
    _, renamed = earlier_run(work)
    own = families.spec(arch).family is None  # fairseq's own: ct2-fairseq-converter converts it
    why_not = None if own else served(args)
    serving = {} if own else serving_runs(s, data_bin, work, why_not is None)
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
        # for training's warning of a budget too small to learn: what is neither training nor decoding, decoding
        "RESERVE_FIXED_S": int(math.ceil(reserve - parts["decoding"])),
        "DECODE_ALL_S": int(math.ceil(decode_all)),
        "DECODE_SHARE": DECODE_SHARE,
        "INTERACTIVE": interactive_run(
            data_bin, src, tgt, os.path.join(work, "spm.model"), device
        ).arguments(user_dir=False),
        "EARLIER": [path for pair in renamed for path in pair],  # run.sh: mv FROM TO, in pairs
        # what run.sh prints at its end to serve the model with CTranslate2 (the checkpoint added)
        "SERVE": "" if own else "export" if why_not is None else "distill",
        **{f"SERVE_{step.upper()}": run.console() for step, run in serving.items()},
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
        + f" for {test_sentences:,} test sentences, at the speed measured here: "
        f"{speed.step_s * 1000:.0f} ms a step of beam search of {speed.batch} sentences)"
        + (
            f"; resuming {save_dir}/checkpoint_last.pt (the time it trained counts)"
            if resumed
            else ""
        ),
        file=log,
    )
    if own:
        print(
            f"{PROG}: {arch} is fairseq's own model: CTranslate2's ct2-fairseq-converter converts "
            "its checkpoint as it is",
            file=log,
        )
    elif why_not is None:
        print(
            f"{PROG}: {arch} exports to CTranslate2 (fairseq-deep-export, docs/export.md): the end "
            "of this run prints the command",
            file=log,
        )
    else:
        print(
            f"{PROG}: {arch} does not export to CTranslate2 ({why_not}); the end of this run "
            f"prints the commands that distil it into a {STUDENT_ARCH} student that does "
            "(docs/distill.md)",
            file=log,
        )
    for split, prefix in prefixes.items():
        name = os.path.basename(prefix)
        if name != split:  # Multi30k's val.*
            print(
                f"{PROG}: the {split} set is {files[f'{split}.{src}']} and "
                f"{files[f'{split}.{tgt}']} (no {split}.{src}, {split}.{tgt} in {raw}: "
                f"{name}.* taken instead)",
                file=log,
            )
    if renamed:
        print(
            f"{PROG}: the earlier run's files in {work} are kept (this run writes new ones): "
            + ", ".join(f"{os.path.basename(a)} as {os.path.basename(b)}" for a, b in renamed),
            file=log,
        )
    if decode_all > parts["decoding"]:
        print(
            f"{PROG}: decoding all {test_sentences:,} test sentences could take up to {decode_all:.0f} s at the "
            f"speed measured here (an untrained model writes every sentence to the length bound), more than "
            f"{DECODE_SHARE:.0%} of the budget: {parts['decoding']:.0f} s are kept for it. Decoding measures its "
            "own speed on its first batches and decodes them all if the time left allows, else a subset of "
            f"every length, and says so; MINUTES={math.ceil(decode_all / DECODE_SHARE / 60)} keeps enough for "
            "all at this bound",
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


def _num_updates(state: Dict) -> int:
    history = state.get("optimizer_history") or [{}]
    return int(history[-1].get("num_updates", 0))


def _updates(path: str) -> int:
    return _num_updates(load_as_saved(path))


def _cfg_section(state: Dict, name: str) -> Dict:
    """A section of the checkpoint's fairseq configuration (``{}`` in one saved without it)."""
    cfg = state.get("cfg") or {}
    return (cfg.get(name) if hasattr(cfg, "get") else None) or {}


def short_of_warmup(state: Dict, recipe: Optional[str] = None) -> Optional[str]:
    """The warning of a training that ended before the end of its warm-up (the checkpoint's
    updates fewer than its ``--warmup-updates``: the learning rate never reached its peak, e.g.
    383 of 400 updates in the budget), with what to do: a larger MINUTES (the one that reaches it
    at the run's own speed, with the recipe's figures, :data:`RECIPE_BUDGET_ENV`) or MAX_UPDATE,
    or a shorter warm-up; None when warm-up ended.  Training's own warning foresees this after its
    first updates (progress.BudgetCheck), but only where the speed of those updates says so:
    validations and saves slow it later."""
    updates = _num_updates(state)
    warmup = int(_cfg_section(state, "lr_scheduler").get("warmup_updates") or 0)
    if updates >= warmup:
        return None
    max_update = int(_cfg_section(state, "optimization").get("max_update") or 0)
    if max_update and updates >= max_update:
        larger = f"a larger MAX_UPDATE ({warmup:,} or more)"
    else:
        seconds = float((state.get("extra_state") or {}).get("previous_training_time") or 0)
        minutes = recipe_minutes(recipe, seconds * warmup / max(1, updates)) if seconds else None
        larger = (
            f"a larger MINUTES ({minutes} reaches it at this run's speed)"
            if minutes
            else ("a larger MINUTES")
        )
    return (
        f"training ended after {updates:,} updates, before the end of warm-up (--warmup-updates "
        f"{warmup:,}): the learning rate never reached its peak. {larger[0].upper()}{larger[1:]}, "
        f"or a shorter warm-up (WARMUP={max(1, updates // 2)} or less), trains past it"
    )


def checkpoint(save_dir: str, n: int, log=sys.stderr, recipe: Optional[str] = None) -> str:
    """The checkpoint to decode: the average of :func:`choose_checkpoints` (written to
    ``SAVE_DIR/checkpoint_average.pt``) or ``checkpoint_best.pt``; first a warning when training
    ended before the end of warm-up (:func:`short_of_warmup`; ``recipe``: run.sh's figures)."""
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
    state = load_as_saved(last)
    last_updates = _num_updates(state)
    warning = short_of_warmup(state, recipe)
    if warning:
        print(f"{PROG}: warning: {warning}", file=log)
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
    subsets = [line for line in generated.lines if DECODE_SUBSET in line]
    fixed = any(DECODE_FRACTION_ENV in line for line in subsets)
    part = ""
    if len(ids) < len(refs):
        why = (
            "the budget ran out while decoding; a larger MINUTES decodes all"
            if stopped
            else f"a subset of every length, as {DECODE_FRACTION_ENV} asked"
            if fixed
            else "a subset of every length, as much as the time left allowed at the decoding speed measured; "
            f'{generate_out}\'s "{DECODE_SUBSET}" line says the speed and the time that decodes all'
            if subsets
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
        quiet_warnings()
        report_user_errors(lambda: setup(rest, dict(os.environ)), PROG)
    elif a.command == "checkpoint":
        if len(rest) != 2:
            p.error("checkpoint SAVE_DIR N")
        recipe = os.environ.get(RECIPE_BUDGET_ENV)
        report_user_errors(lambda: print(checkpoint(rest[0], int(rest[1]), recipe=recipe)), PROG)
    else:
        if len(rest) != 3:
            p.error("score REFERENCE GENERATE_OUT HYP_OUT")
        report_user_errors(lambda: score(*rest), PROG)


if __name__ == "__main__":
    main()
