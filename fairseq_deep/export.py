"""Serve what you train: ``fairseq-deep-export`` (docs/export.md).

    fairseq-deep-export --checkpoint CK.pt --data DATA_BIN --out OUT
        [--format ctranslate2|fairseq] [--quantization int8|int8_float32|float16|...]

(also ``python -m fairseq_deep.export``).  A model of this package whose function is a standard
Transformer's (the rule its family declares, :mod:`fairseq_deep.models.reduction`: the pre-/post-
norm presets, DeepNorm, Admin, DS-Init, the baselines of the other Transformer families, a grown
model of these) becomes fairseq's own ``transformer``, its residual scales folded into the weights
(:func:`~fairseq_deep.models.reduction.fold`):

* ``--format fairseq``: OUT/model.pt, a checkpoint of fairseq's ``transformer`` that plain
  ``fairseq-generate`` (no ``--user-dir``, torch's weights-only loader) decodes with the original
  model's hypotheses and scores, and the dictionaries beside it (the hub interface:
  ``TransformerModel.from_pretrained(OUT, checkpoint_file="model.pt")``);
* ``--format ctranslate2`` (default): that checkpoint converted by CTranslate2's own fairseq
  converter (``ctranslate2.converters.FairseqConverter``) into a CTranslate2 model folder.

Before anything is written, the stock model's log-probabilities are compared with the original's
on a few batches (a difference over :data:`TOLERANCE` stops the export).  OUT is written in a
temporary folder beside it and renamed at the end: a failed export leaves nothing.  Every
mistake (a checkpoint that is not one of ours, data without the dictionaries, an existing OUT, a
family that does not reduce) ends in one line and exit status 2.
"""

import argparse
import copy
import enum
import json
import logging
import os
import shutil
import sys
import tempfile
from typing import Dict, Optional, Tuple

from . import serving
from .checkpoints import family_of, load, model_args
from .errors import (
    ArgumentParser,
    MissingFileError,
    UserError,
    import_optional,
    report_user_errors,
)
from .models.reduction import SERVED_BY, fold, why_not_transformer
from .modules.common.better_transformer import without_better_transformer
from .patches.checkpoint_history import history_of
from .quiet import quiet_warnings, script_logging
from .serving import describe_timing, fairseq_hypothesis, matching_settings  # noqa: F401

logger = logging.getLogger("fairseq_deep.export")

FORMATS = ("ctranslate2", "fairseq")
#: CTranslate2's weight types (``ct2-fairseq-converter --quantization``)
QUANTIZATIONS = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
)
STOCK_CHECKPOINT = "model.pt"
SUMMARY = "fairseq_deep_export.json"
#: the largest difference of log-probabilities between the original and the stock model accepted
TOLERANCE = 1e-3


class ExportError(UserError):
    """A checkpoint, data folder or output that cannot be exported; the message names the fix."""


# ---------------------------------------------------------------------------------------------
# checks before any work
# ---------------------------------------------------------------------------------------------


def check_out(out: str):
    if os.path.lexists(out):
        raise ExportError(f"--out {out} exists: give a new folder (an export never overwrites)")
    parent = os.path.dirname(os.path.abspath(out))
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise ExportError(f"--out {out}: {parent} is not a folder")


def languages(
    task_cfg, data: str, source_lang: Optional[str], target_lang: Optional[str]
) -> Tuple[str, str]:
    """The language pair: as given, else as the checkpoint's task saved it, else fairseq's guess
    from the data's file names; and a check that ``data`` holds both dictionaries."""
    if not os.path.isdir(data):
        raise MissingFileError(f"--data {data}: no such folder (fairseq-preprocess's --destdir)")
    src = source_lang or _get(task_cfg, "source_lang")
    tgt = target_lang or _get(task_cfg, "target_lang")
    if src is None or tgt is None:
        from fairseq.data import data_utils

        src, tgt = data_utils.infer_language_pair(data)  # the package's shim: a clear error
    missing = [
        f"dict.{lang}.txt"
        for lang in (src, tgt)
        if not os.path.isfile(os.path.join(data, f"dict.{lang}.txt"))
    ]
    if missing:
        found = sorted(f for f in os.listdir(data) if f.startswith("dict.") and f.endswith(".txt"))
        raise MissingFileError(
            f"--data {data} has no {' nor '.join(missing)} (the model translates {src} -> {tgt}"
            + (
                f"; found {', '.join(found)}: --source-lang/--target-lang choose others"
                if found
                else ""
            )
            + "): give the folder fairseq-preprocess wrote for the model's training data"
        )
    return src, tgt


def _get(cfg, key):
    if cfg is None:
        return None
    return cfg.get(key, None) if hasattr(cfg, "get") else getattr(cfg, key, None)


def _saved_task(state):
    cfg = state.get("cfg")
    task = _get(cfg, "task")
    return task if task is not None else state.get("args")


# ---------------------------------------------------------------------------------------------
# the models
# ---------------------------------------------------------------------------------------------


def build_task(data: str, src: str, tgt: str):
    from fairseq import tasks

    return tasks.setup_task(
        argparse.Namespace(task="translation", data=data, source_lang=src, target_lang=tgt)
    )


def load_model(args, task, state, path: str):
    """The checkpoint's model, built from its options on the data's dictionaries, in eval mode."""
    import torch
    from fairseq import models

    for side, dictionary in (
        ("encoder", task.source_dictionary),
        ("decoder", task.target_dictionary),
    ):
        rows = state["model"].get(f"{side}.embed_tokens.weight")
        if rows is not None and rows.shape[0] != len(dictionary):
            raise ExportError(
                f"--checkpoint {path}'s {side} embeds {rows.shape[0]} symbols but the --data "
                f"dictionary has {len(dictionary)}: give the data folder the model was trained on"
            )
    torch.manual_seed(1)
    model = models.build_model(copy.deepcopy(args), task)
    state_dict = dict(state["model"])
    model.upgrade_state_dict(state_dict)
    torch.nn.Module.load_state_dict(model, state_dict, strict=True)
    return model.eval()


def transformer_defaults() -> Dict[str, object]:
    """Every option of fairseq's ``transformer`` with its default (TransformerConfig's)."""
    from fairseq.dataclass.utils import gen_parser_from_dataclass
    from fairseq.models.transformer import TransformerConfig

    parser = argparse.ArgumentParser(add_help=False)
    gen_parser_from_dataclass(parser, TransformerConfig(), delete_default=False, with_prefix="")
    return vars(parser.parse_args([]))


def stock_args(args, changes: Dict[str, object]) -> argparse.Namespace:
    """fairseq's ``transformer`` with the model's options (those fairseq's transformer has), the
    changes the fold made, and every other option of fairseq's transformer at its default (fairseq
    0.12.2 sets some of them on a struct config while building the model)."""
    defaults = transformer_defaults()
    stock = argparse.Namespace(
        **{k: copy.deepcopy(getattr(args, k, v)) for k, v in defaults.items()}
    )
    stock.arch = stock._name = "transformer"
    for key, value in changes.items():
        setattr(stock, key, value)
    if not stock.encoder_normalize_before:
        # fairseq 0.12.2 (the official release) sends a post-norm encoder layer loaded from a
        # checkpoint through its fused "BetterTransformer" kernel, which fails on every padded
        # batch with torch >= 2 ("Mask Type should be defined"); under activation checkpointing it
        # keeps to its own code, which computes the same at inference (docs/export.md)
        stock.checkpoint_activations = True
    return argparse.Namespace(**plain(vars(stock)))


def stock_model(args: argparse.Namespace, task, state_dict, path: str):
    """fairseq's ``transformer`` built from ``args`` with the folded parameters."""
    import torch
    from fairseq.models.transformer import TransformerModel

    torch.manual_seed(1)
    model = TransformerModel.build_model(copy.deepcopy(args), task)
    for layer in model.encoder.layers:  # fairseq 0.12.2's fused copies: not parameters of ours
        without_better_transformer(layer)
    wanted = model.state_dict()
    missing = [k for k in wanted if k not in state_dict]
    if missing:
        raise ExportError(
            f"--checkpoint {path}: no value for {', '.join(missing[:3])} of fairseq's transformer"
        )
    model.load_state_dict({k: state_dict[k] for k in wanted}, strict=True)
    return model.eval()


def max_difference(original, stock, task, batches: int = 3, seed: int = 0) -> float:
    """The largest |difference| of the two models' log-probabilities on random padded batches."""
    import torch

    worst = 0.0
    g = torch.Generator().manual_seed(seed)
    source, target = task.source_dictionary, task.target_dictionary
    for b in range(batches):
        bsz, src_len, tgt_len = 3, 5 + 4 * b, 4 + 3 * b
        src = torch.randint(source.nspecial, len(source), (bsz, src_len), generator=g)
        src[:, -1] = source.eos()
        src[-1, :2] = source.pad()  # fairseq pads sources on the left
        lengths = src.ne(source.pad()).sum(1)
        prev = torch.randint(target.nspecial, len(target), (bsz, tgt_len), generator=g)
        prev[:, 0] = target.eos()
        with torch.no_grad():
            ours = original(src, lengths, prev)[0].float().log_softmax(-1)
            theirs = stock(src, lengths, prev)[0].float().log_softmax(-1)
        worst = max(worst, float((ours - theirs).abs().max()))
    return worst


# ---------------------------------------------------------------------------------------------
# what is written
# ---------------------------------------------------------------------------------------------


def plain(value):
    """``value`` made of dicts, lists, strings, numbers, None and tensors only: what torch's
    weights-only loader reads without an allow-list (a fairseq checkpoint holds an
    ``argparse.Namespace``, omegaconf containers and numpy scalars, which plain fairseq cannot
    load on torch >= 2.6)."""
    import numpy as np
    import torch
    from omegaconf import OmegaConf

    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True, enum_to_str=True)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, np.generic):
        return value.item()
    if value is None or type(value) in (bool, int, float, str) or isinstance(value, torch.Tensor):
        return value
    return str(value)


def task_options(task_cfg, data: str, src: str, tgt: str) -> Dict[str, object]:
    """fairseq's ``translation`` task with what the checkpoint's task saved of its options."""
    import dataclasses

    from fairseq.tasks.translation import TranslationConfig

    options = {"_name": "translation"}
    for f in dataclasses.fields(TranslationConfig):
        value = _get(task_cfg, f.name)
        if f.name != "_name" and value is not None:
            options[f.name] = plain(value)
    options.update(data=os.path.abspath(data), source_lang=src, target_lang=tgt)
    return options


def stock_checkpoint(
    state,
    model_args: argparse.Namespace,
    task: Dict[str, object],
    state_dict,
    summary: Dict[str, object],
) -> Dict[str, object]:
    """The state fairseq-train would have saved for fairseq's ``transformer``: the saved
    configuration with the model's and the task's options replaced, the package's own criterion,
    optimizer and scheduler (which plain fairseq does not know) and the plugin directory left
    out, no optimizer state; plain types only (:func:`plain`)."""
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.optim import OPTIMIZER_REGISTRY
    from fairseq.optim.lr_scheduler import LR_SCHEDULER_REGISTRY

    cfg = plain(state.get("cfg") or {})
    cfg["model"] = plain(vars(model_args))
    cfg["task"] = task
    if isinstance(cfg.get("common"), dict):
        cfg["common"]["user_dir"] = None
    for group, registry in (
        ("criterion", CRITERION_REGISTRY),
        ("optimizer", OPTIMIZER_REGISTRY),
        ("lr_scheduler", LR_SCHEDULER_REGISTRY),
    ):
        name = cfg[group].get("_name") if isinstance(cfg.get(group), dict) else None
        if name in registry and registry[name].__module__.split(".")[0] == "fairseq_deep":
            cfg[group] = None
    history = (state.get("optimizer_history") or [{}])[-1]
    return {
        "cfg": cfg,
        "args": None,
        "model": {k: v.contiguous() for k, v in state_dict.items()},
        "criterion": None,
        "last_optimizer_state": None,
        "task_state": {},
        "optimizer_history": [
            {
                "criterion_name": str(history.get("criterion_name", "")),
                "optimizer_name": str(history.get("optimizer_name", "")),
                "lr_scheduler_state": {},
                "num_updates": int(history.get("num_updates", 0) or 0),
            }
        ],
        "extra_state": {"train_iterator": {"epoch": 1}, "fairseq_deep_export": plain(summary)},
    }


def converter_checkpoint(
    model_args: argparse.Namespace, task: Dict[str, object], state_dict
) -> Dict[str, object]:
    """What ``FairseqConverter`` reads: the model's and the task's options as one namespace
    (``checkpoint["args"]``, allow-listed in this process by the package) and the parameters."""
    options = {
        **{k: v for k, v in task.items() if k != "_name"},
        **vars(model_args),
        "task": "translation",
    }
    return {"args": argparse.Namespace(**options), "cfg": None, "model": state_dict}


def test_pieces(data: str, src: str, tgt: str, dictionary, n: int):
    """The first ``n`` sentences of the binarized test split of ``data`` as the pieces stand in
    the data (without the </s> fairseq's binarizer appended); None without a test split."""
    from fairseq.data import data_utils, indexed_dataset

    for pair in (f"{src}-{tgt}", f"{tgt}-{src}"):
        prefix = os.path.join(data, f"test.{pair}.{src}")
        if indexed_dataset.dataset_exists(prefix, impl=None):
            dataset = data_utils.load_indexed_dataset(prefix, dictionary)
            return [
                [dictionary[i] for i in dataset[k][:-1].tolist()]
                for k in range(min(n, len(dataset)))
            ]
    return None


#: the export's timing (``timing`` of :func:`export`): fairseq-generate's decoding defaults, and
#: enough sentences for several batches (so that batches side by side, inter_threads, show)
TIMING_DEFAULTS = {
    "sentences": 128,
    "device": "cpu",
    "threads": None,
    "beam": 5,
    "lenpen": 1.0,
    "max_len_a": 0.0,
    "max_len_b": 200,
    "batch": 32,
}


def check_timing(timing: Dict[str, object]):
    """The timing's settings as the options name them: a count at least 1, a limit at least 0."""
    least = {"sentences": 1, "threads": 1, "beam": 1, "batch": 1, "max_len_a": 0, "max_len_b": 0}
    option = {"batch": "batch-size", "max_len_a": "max-len-a", "max_len_b": "max-len-b"}
    for key, low in least.items():
        value = timing.get(key)
        if value is not None and value < low:
            name = option.get(key, key)
            raise ExportError(f"--timing-{name} {value}: give at least {low}")


def time_compute_types(staged: str, data: str, src: str, tgt: str, task, timing: Dict[str, object]):
    """The ways of serving the export timed (:func:`fairseq_deep.serving.time_serving`: backend,
    compute type, threads) on the first sentences of the data's test split with the decoding
    settings of ``timing`` (:data:`TIMING_DEFAULTS` for those it leaves out), or why not."""
    timing = {**TIMING_DEFAULTS, **{k: v for k, v in timing.items() if v is not None}}
    pieces = test_pieces(data, src, tgt, task.source_dictionary, int(timing["sentences"]))
    if not pieces:
        return {"skipped": f"no test split in {data} (fairseq-preprocess --testpref)"}
    try:
        return serving.time_serving(
            staged,
            pieces,
            device=str(timing["device"]),
            threads=timing["threads"],
            beam=int(timing["beam"]),
            lenpen=float(timing["lenpen"]),
            max_len_a=float(timing["max_len_a"]),
            max_len_b=int(timing["max_len_b"]),
            batch=int(timing["batch"]),
        )
    except RuntimeError as e:  # a backend's process failed: the export stands, untimed
        return {"skipped": str(e)}


def import_ctranslate2():
    return import_optional(
        "ctranslate2",
        "--format ctranslate2",
        "ctranslate2 (or fairseq_deep[export])",
        "use --format fairseq",
    )


def convert(checkpoint: str, data: str, out: str, src: str, tgt: str, quantization: Optional[str]):
    """CTranslate2's own converter on a stock checkpoint; its configuration checks as one line."""
    ctranslate2 = import_ctranslate2()
    from ctranslate2.converters import FairseqConverter

    converter = FairseqConverter(checkpoint, data, source_lang=src, target_lang=tgt)
    try:
        converter.convert(out, quantization=quantization)
    except ValueError as e:  # ctranslate2's ConfigurationChecker: one reason per line
        reasons = "; ".join(
            line.strip("- ").strip() for line in str(e).splitlines() if line.strip()
        )
        raise ExportError(
            f"CTranslate2 {ctranslate2.__version__} cannot convert this model: {reasons}"
        ) from e


def serving_choice(timed: Dict[str, object]) -> Dict[str, object]:
    """What OUT/serving.json holds: the fastest setting (:func:`fairseq_deep.serving.translator`
    loads it) and the conditions it was timed under, for whoever serves elsewhere."""
    conditions = ("cpu", "device", "sentences", "beam", "lenpen", "max_len_a", "max_len_b")
    return {**timed["choice"], "timed": {k: timed[k] for k in conditions}}


# ---------------------------------------------------------------------------------------------
# the export
# ---------------------------------------------------------------------------------------------


def export(
    checkpoint: str,
    data: str,
    out: str,
    fmt: str = "ctranslate2",
    quantization: Optional[str] = None,
    source_lang: Optional[str] = None,
    target_lang: Optional[str] = None,
    timing: Optional[Dict[str, object]] = None,
) -> Dict[str, object]:
    """Export ``checkpoint`` to ``out`` (module docstring); returns the summary written there.
    ``timing`` (``--format ctranslate2``): time the ways of serving it (backend, compute type,
    threads) on the data's test split with the decoding settings the user translates with
    (:data:`TIMING_DEFAULTS`' keys, any of them; :func:`fairseq_deep.serving.time_serving`),
    recorded as the summary's ``compute_types`` and the fastest written to OUT/serving.json;
    None: not."""
    import torch
    from fairseq import checkpoint_utils

    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt}: choose one of {', '.join(FORMATS)}")
    if quantization is not None and fmt != "ctranslate2":
        raise ExportError("--quantization applies to --format ctranslate2 only: drop it")
    if fmt == "ctranslate2":
        import_ctranslate2()  # before any work
    if timing is not None:
        check_timing(timing)
    check_out(out)
    state = load(checkpoint, "--checkpoint")
    args = model_args(state, checkpoint, "--checkpoint")
    arch, family = family_of(
        args,
        checkpoint,
        "fairseq-deep-export exports",
        "fairseq-generate decodes it as it is, and CTranslate2's ct2-fairseq-converter converts it",
        ExportError,
        "--checkpoint",
    )
    src, tgt = languages(_saved_task(state), data, source_lang, target_lang)
    task = build_task(data, src, tgt)
    model = load_model(args, task, state, checkpoint)
    why = why_not_transformer(family, model)
    if why is not None:
        raise ExportError(
            f"--checkpoint {checkpoint} (--arch {arch}) does not reduce to fairseq's "
            f"transformer: {why}; {SERVED_BY}"
        )
    folded, changes, notes = fold(model)
    options = stock_args(args, changes)
    stock = stock_model(options, task, folded, checkpoint)
    difference = max_difference(model, stock, task)
    if not difference <= TOLERANCE:
        raise ExportError(
            f"--checkpoint {checkpoint} (--arch {arch}): fairseq's transformer "
            f"computes other log-probabilities than the model (by up to "
            f"{difference:.3g}): an option it cannot hold; {SERVED_BY}"
        )
    stock_state = {k: v.detach().clone() for k, v in stock.state_dict().items()}
    tasks = task_options(_saved_task(state), data, src, tgt)
    summary = {
        "checkpoint": os.path.abspath(checkpoint),
        "arch": arch,
        "family": family,
        "format": fmt,
        "quantization": quantization,
        "source_lang": src,
        "target_lang": tgt,
        "folded": notes,
        "stock_options_changed": {k: plain(v) for k, v in changes.items()},
        "max_logprob_difference": difference,
        # the checkpoint's history: grown from, continued, averaged (patches/checkpoint_history)
        **{key: plain(entries) for key, entries in history_of(state).items()},
        "ctranslate2_settings": matching_settings() if fmt == "ctranslate2" else None,
    }

    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.", dir=parent)
    try:
        staged = os.path.join(work, "out")
        if fmt == "fairseq":
            os.makedirs(staged)
            saved = stock_checkpoint(state, options, tasks, stock_state, summary)
            checkpoint_utils.torch_persistent_save(saved, os.path.join(staged, STOCK_CHECKPOINT))
            for lang in (src, tgt):
                name = f"dict.{lang}.txt"
                shutil.copyfile(os.path.join(data, name), os.path.join(staged, name))
        else:
            converter_input = os.path.join(work, STOCK_CHECKPOINT)
            torch.save(converter_checkpoint(options, tasks, stock_state), converter_input)
            convert(converter_input, data, staged, src, tgt, quantization)
            if timing is not None:
                timed = time_compute_types(staged, data, src, tgt, task, timing)
                summary["compute_types"] = timed
                if "choice" in timed:
                    with open(os.path.join(staged, serving.CHOICE), "w", encoding="utf-8") as f:
                        json.dump(serving_choice(timed), f, indent=1)
        with open(os.path.join(staged, SUMMARY), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
        os.rename(staged, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return summary


def cli_main(argv=None):
    parser = ArgumentParser(  # argparse's errors in one line, as every console script's
        prog="fairseq-deep-export",
        description="Export a fairseq_deep model whose function is a standard Transformer's "
        "(pre-/post-norm presets, DeepNorm, Admin, DS-Init, the families' baselines) "
        "to CTranslate2 or to fairseq's own transformer, its residual scales folded "
        "into the weights (docs/export.md).",
    )
    parser.add_argument(
        "--checkpoint", required=True, metavar="CK.pt", help="a checkpoint of fairseq-train"
    )
    parser.add_argument(
        "--data",
        required=True,
        metavar="DATA_BIN",
        help="the binarized data folder of the model (its dict.<lang>.txt)",
    )
    parser.add_argument(
        "--out", required=True, metavar="OUT", help="the folder to write (must not exist)"
    )
    parser.add_argument(
        "--format",
        default="ctranslate2",
        choices=FORMATS,
        help="ctranslate2 (default): a CTranslate2 model folder; fairseq: "
        "OUT/model.pt, a checkpoint of fairseq's transformer, and the "
        "dictionaries",
    )
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        help="CTranslate2's weight type (default: the checkpoint's, float32)",
    )
    parser.add_argument("--source-lang", help="source language (default: the checkpoint's)")
    parser.add_argument("--target-lang", help="target language (default: the checkpoint's)")
    timing = parser.add_argument_group(
        "which compute type to serve with (--format ctranslate2): the fastest depends on the CPU"
    )
    timing.add_argument(
        "--no-timing",
        action="store_true",
        help="do not time CTranslate2's compute types on the data's test split",
    )
    timing.add_argument(
        "--timing-sentences",
        type=int,
        default=TIMING_DEFAULTS["sentences"],
        metavar="N",
        help="time them on the first N test sentences (default %(default)s)",
    )
    timing.add_argument(
        "--timing-device", default="cpu", choices=("cpu", "cuda"), help="default: cpu"
    )
    timing.add_argument(
        "--timing-threads",
        type=int,
        metavar="N",
        help="the cores to serve with (default: the cores available, at most 4)",
    )
    decoding = parser.add_argument_group(
        "the decoding settings you will translate with (fairseq-generate's defaults; the "
        "recipes: --timing-max-len-a 1.2 --timing-max-len-b 10)"
    )
    decoding.add_argument("--timing-beam", type=int, default=5, metavar="N", help="default 5")
    decoding.add_argument(
        "--timing-lenpen", type=float, default=1.0, metavar="L", help="default 1.0"
    )
    decoding.add_argument(
        "--timing-max-len-a",
        type=float,
        default=0.0,
        metavar="A",
        help="the length limit A x the batch's longest source + B (default 0)",
    )
    decoding.add_argument(
        "--timing-max-len-b", type=int, default=200, metavar="B", help="default 200"
    )
    decoding.add_argument(
        "--timing-batch-size",
        type=int,
        default=TIMING_DEFAULTS["batch"],
        metavar="N",
        help="sentences per batch (default %(default)s)",
    )
    args = parser.parse_args(argv)
    quiet_warnings()
    script_logging(sys.stderr, level="WARNING")  # its one line, the summary or the refusal, alone

    def run():
        summary = export(
            args.checkpoint,
            args.data,
            args.out,
            args.format,
            args.quantization,
            args.source_lang,
            args.target_lang,
            timing=None
            if args.no_timing or args.format != "ctranslate2"
            else {
                "sentences": args.timing_sentences,
                "device": args.timing_device,
                "threads": args.timing_threads,
                "beam": args.timing_beam,
                "lenpen": args.timing_lenpen,
                "max_len_a": args.timing_max_len_a,
                "max_len_b": args.timing_max_len_b,
                "batch": args.timing_batch_size,
            },
        )
        what = (
            "CTranslate2 model"
            if args.format == "ctranslate2"
            else "fairseq transformer checkpoint"
        )
        print(
            f"{args.out}: {what} of {summary['arch']} ({summary['source_lang']} -> "
            f"{summary['target_lang']}); log-probabilities within "
            f"{summary['max_logprob_difference']:.2g} of the original"
        )
        for note in summary["folded"]:
            print(f"  folded: {note}")
        timed = summary.get("compute_types")
        if timed is not None:
            print(
                "  "
                + (
                    f"timing skipped: {timed['skipped']}"
                    if "skipped" in timed
                    else describe_timing(timed)
                )
            )

    report_user_errors(run, parser.prog)


if __name__ == "__main__":
    cli_main()
