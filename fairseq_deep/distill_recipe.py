"""The decisions of the distillation recipe (examples/distill/run.sh), in Python so that they are tested.

    python -m fairseq_deep.distill_recipe setup [STUDENT TRAIN FLAGS...]   (settings from the environment)
    python -m fairseq_deep.distill_recipe teacher SAVE_DIR                 (the own-data teacher to distil)

A teacher (``TEACHER=path.pt`` with ``DATA_BIN``, or none: the own-data recipe's DLCL model,
trained first by examples/own_data/run.sh in ``WORK/teacher``) -> its translations of the training
set (fairseq-deep-distill) -> a student (:data:`fairseq_deep.own_data.STUDENT_ARCH` at the
teacher's width by default, ``STUDENT_ARCH`` and the flags after it settable) trained on them in a
time budget -> its test-set translations scored (fairseq-deep-score) -> fairseq-deep-export to
CTranslate2 -> CTranslate2's translations scored too.

``setup`` checks everything before any work (the teacher's file and its width, the data-bin, the
raw test files, the student's whole fairseq-train command through fairseq's parser, the
distillation's through fairseq-deep-distill's) and prints shell assignments for run.sh.  The
budget ``MINUTES`` is split at the start and said: :data:`DISTILL_SHARE` of it for distillation
(run.sh stops it at its share; the same command resumes it), the rest for the student's training
less :data:`fairseq_deep.own_data.DECODE_SHARE` kept for decoding, export and scoring.  The
settings are the own-data recipe's (:func:`fairseq_deep.own_data.settings_from_env`: WIDTH, LR,
WARMUP, MAX_TOKENS, BEAM, AVERAGE, PRECISION, ...), so a student is trained as the recipe trains a
model.
"""

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from . import own_data
from .cli import PLUGIN_DIR, check_arch
from .errors import ArgumentParser, UserError, report_user_errors
from .models import families
from .quiet import quiet_warnings
from .runs import Run, flags, recipes

PROG = "run.sh"
#: the share of MINUTES for the teacher's translations of the training set (the rest: the student)
DISTILL_SHARE = 0.4
#: the own-data recipe's model, the teacher trained when none is given
TEACHER_ARCH = "transformer_dlcl"
#: the recipe's folder when WORK is not set
WORK = "distill_run"
#: the CTranslate2 translator run.sh pipes the test source through (examples/export/translate.py;
#: the tests' dry run gives a stub)
TRANSLATE_ENV = "TRANSLATE_SCRIPT"


@dataclass
class Plan:
    """What run.sh does, as values: the runs (the teacher's path left out of ``distill``: run.sh
    adds it once there is one), the budget's split in seconds, the paths."""

    distill: Run
    student: Run
    generate: Run
    export: Run
    translate: List[str]
    budget_s: int
    distill_s: int
    reserve_s: int
    save: str
    distilled: str
    ct2: str


def teacher_width(path: str) -> int:
    """The teacher's model width (``encoder_embed_dim`` of the checkpoint's configuration; its
    ``args`` in an older one); a file that is not a checkpoint is one line (load_as_saved's)."""
    from .checkpoints import load_as_saved

    state = load_as_saved(path, "TEACHER")
    cfg = state.get("cfg") or {}
    model = cfg.get("model") if hasattr(cfg, "get") else None
    if model is None:
        model = state.get("args") or argparse.Namespace()
    if isinstance(model, argparse.Namespace):  # fairseq keeps a model's args as a Namespace
        model = vars(model)
    width = model.get("encoder_embed_dim") if hasattr(model, "get") else None
    if not width:
        raise UserError(f"TEACHER={path}: no encoder_embed_dim in its configuration; set WIDTH")
    return int(width)


def own_teacher(save_root: str) -> str:
    """The own-data recipe's decoded model in ``save_root`` (its WORK): the average it wrote, else
    checkpoint_best.pt (what run.sh of own_data decoded)."""
    save = os.path.join(save_root, "checkpoints")
    folders = (
        sorted(f for f in os.listdir(save) if f.startswith(TEACHER_ARCH))
        if os.path.isdir(save)
        else []
    )
    for folder in folders:
        for name in ("checkpoint_average.pt", "checkpoint_best.pt"):
            path = os.path.join(save, folder, name)
            if os.path.isfile(path):
                return path
    raise UserError(f"{save}: no {TEACHER_ARCH} checkpoint (examples/own_data/run.sh saved none)")


def plan(
    s: own_data.Settings,
    data_bin: str,
    work: str,
    student_arch: str,
    student_flags: Sequence[str],
    translate_script: str,
    spm: Optional[str],
) -> Plan:
    """The recipe's runs for settings ``s`` (the student's width: ``s.width``)."""
    distilled = os.path.join(work, "distilled")
    spec = families.spec(student_arch)
    save = os.path.join(work, "checkpoints", f"student_{student_arch}_w{s.width}")
    ct2 = os.path.join(work, "ctranslate2")
    budget = int(round(s.minutes * 60))
    distill_s = int(DISTILL_SHARE * budget)
    reserve = int(math.ceil(own_data.DECODE_SHARE * budget))
    translate = [
        translate_script,
        ct2,
        *flags(
            {
                "spm": spm,
                "beam": s.beam,
                "max_len_a": own_data.MAX_LEN_A,
                "max_len_b": own_data.MAX_LEN_B,
                "batch": own_data.DECODE_BATCH,
                "device": "cpu" if s.device == "cpu" else "cuda",
                "fastest": True,  # the export's choice: backend, compute type, threads
            }
        ),
    ]
    return Plan(
        distill=own_data.distill_run(s, data_bin, distilled),
        student=own_data.train_run(s, spec, distilled, save, student_flags),
        generate=own_data.generate_run(s, distilled),
        export=own_data.export_run(s, distilled, ct2),
        translate=translate,
        budget_s=budget,
        distill_s=distill_s,
        reserve_s=reserve,
        save=save,
        distilled=distilled,
        ct2=ct2,
    )


def check_distill_command(cmd: Sequence[str]) -> argparse.Namespace:
    """fairseq-deep-distill's own parser (fairseq-generate's and its options) on the whole command
    but --path (an unknown option, a bad value: a :class:`UserError`)."""
    from fairseq import options

    from .distill import add_distill_args

    parser = add_distill_args(options.get_generation_parser())

    def error(message):
        raise UserError(f"fairseq-deep-distill: {message}")

    parser.error = error
    argv = ["--user-dir", PLUGIN_DIR, *cmd[1:], *recipes.decoding(path="TEACHER.pt")]
    return options.parse_args_and_arch(parser, argv)


def _file(env: Dict[str, str], name: str) -> Optional[str]:
    path = env.get(name) or None
    if path is not None and not os.path.isfile(path):
        raise UserError(f"{name}={path}: no such file")
    return path


def setup(
    argv: Sequence[str],
    env: Dict[str, str],
    out=sys.stdout,
    log=sys.stderr,
    translate_script: str = "examples/export/translate.py",
):
    """Check everything run.sh will do and print its shell assignments (nothing is written)."""
    student_arch = env.get("STUDENT_ARCH") or own_data.STUDENT_ARCH
    check_arch(["fairseq-train", "--arch", student_arch])
    device = own_data.detect_device(env)
    work = env.get("WORK") or WORK
    teacher = env.get("TEACHER") or ""
    if teacher:
        if not env.get("DATA_BIN"):
            raise UserError(f"TEACHER={teacher}: set DATA_BIN too (the data-bin it was trained on)")
        data_bin = env["DATA_BIN"]
        width = teacher_width(teacher)
        ref, source = _file(env, "REF"), _file(env, "SOURCE")
        spm = _file(env, "SPM")
        beside = os.path.join(os.path.dirname(os.path.normpath(data_bin)), "spm.model")
        if spm is None and os.path.isfile(beside):
            spm = beside  # fairseq-deep-prepare's DESTDIR/spm.model beside DESTDIR/data-bin
    else:
        for name in ("SRC", "TGT", "RAW"):
            if not env.get(name):
                raise UserError(
                    f"set TEACHER=CK.pt DATA_BIN=DIR, or {name} (SRC, TGT, RAW: the own-data "
                    "recipe trains the teacher first): SRC=de TGT=en RAW=path/to/raw bash "
                    "examples/distill/run.sh"
                )
        if not os.path.isdir(env["RAW"]):
            raise UserError(f"RAW={env['RAW']}: no such folder")
        prefixes, files = own_data.find_inputs(env["RAW"], env["SRC"], env["TGT"])
        data_bin = os.path.join(work, "teacher", "data-bin")
        width = None
        ref, source = files[f"test.{env['TGT']}"], files[f"test.{env['SRC']}"]
        spm = os.path.join(work, "teacher", "spm.model")
    if teacher and not os.path.isdir(data_bin):
        raise UserError(f"DATA_BIN={data_bin}: no such folder")
    if teacher and not any(f.startswith("dict.") for f in os.listdir(data_bin)):
        raise UserError(f"DATA_BIN={data_bin}: no dict.*.txt (not a data-bin)")
    s = own_data.settings_from_env({"WORK": work, **env}, device)
    if teacher and not env.get("WIDTH"):
        s.width = width  # the teacher's width
    if ref is not None and source is None:
        raise UserError(f"REF={ref}: set SOURCE too (the raw test source CTranslate2 translates)")
    p = plan(s, data_bin, work, student_arch, list(argv), translate_script, spm)
    check_distill_command(p.distill.console())
    args = own_data.check_train_command(p.student.arguments(user_dir=False))
    if families.spec(student_arch).family is not None and own_data.why_not_served(args):
        raise UserError(
            f"STUDENT_ARCH={student_arch}: CTranslate2 cannot serve it "
            f"({own_data.why_not_served(args)}); take one that exports ({own_data.STUDENT_ARCH})"
        )
    values = {
        "WORK": work,
        "TEACHER": teacher,
        "TEACHER_MINUTES": env.get("TEACHER_MINUTES") or own_data.DEFAULTS[device]["MINUTES"],
        "DATA_BIN": data_bin,
        "SAVE": p.save,
        "DISTILLED": p.distilled,
        "CT2": p.ct2,
        "BUDGET_S": p.budget_s,
        "DISTILL_S": p.distill_s,
        "RESERVE_S": p.reserve_s,
        "MARGIN_S": own_data.END_MARGIN_S,
        "AVERAGE": s.average,
        "REF": ref or "",
        "SOURCE": source or "",
        "DISTILL": p.distill.console(),
        "STUDENT": p.student.console(),
        "GENERATE": p.generate.console(),
        "EXPORT": p.export.console(),
        "TRANSLATE": p.translate,
    }
    for name, value in values.items():
        print(own_data._shell(name, value), file=out)
    who = (
        f"the teacher {teacher}"
        if teacher
        else (
            f"a {TEACHER_ARCH} teacher trained first by examples/own_data/run.sh in "
            f"{os.path.join(work, 'teacher')} (TEACHER_MINUTES={values['TEACHER_MINUTES']})"
        )
    )
    budget = (
        f"MINUTES={s.minutes:g}: {p.distill_s} s for distillation (it resumes when run again), "
        f"the student trains for what is left less {p.reserve_s} s kept for decoding, export and "
        "scoring"
        if p.budget_s
        else "no time budget (MINUTES=0): distillation to its end, training to MAX_UPDATE"
    )
    print(
        f"{PROG}: {who} -> {p.distilled} -> a {student_arch} student at width {s.width} -> "
        f"{p.ct2}; {budget}" + ("" if ref else "; no REF: the translations are not scored"),
        file=log,
    )


def main(argv: Optional[Sequence[str]] = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = ArgumentParser(
        prog="python -m fairseq_deep.distill_recipe", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("command", choices=["setup", "teacher"])
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv[:1])
    rest = argv[1:]
    if a.command == "setup":
        quiet_warnings()
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        script = os.environ.get(TRANSLATE_ENV) or os.path.join(
            here, "examples", "export", "translate.py"
        )
        report_user_errors(lambda: setup(rest, dict(os.environ), translate_script=script), PROG)
    else:
        if len(rest) != 1:
            p.error("teacher WORK")
        report_user_errors(lambda: print(own_teacher(rest[0])), PROG)


if __name__ == "__main__":
    main()
