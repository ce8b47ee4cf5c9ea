"""The papers' comparisons as one command: train, translate and score a set of systems.

    fairseq-deep-study --data DIR --out DIR [--spm MODEL | --remove-bpe KIND]
        [--group NAME]... [--system NAME=ARCH [FLAGS...]]...
        [--max-update N] [--minutes M] [--seeds K] [--jobs J] [--cpu]
        [--width W] [--lr LR] [--warmup N] [--dropout P] [--max-tokens N]
        [--train-args "..."] [--gen-args "..."] [--ref FILE] [--depths 6,20]

(also ``python -m fairseq_deep.study``).  For every system and seed it runs the real
``python -m fairseq_cli.train`` (``--user-dir`` this package) and ``python -m fairseq_cli.generate``
as subprocesses, ``--jobs`` of them at a time, scores every test sentence with sacreBLEU and chrF on
detokenized text, and writes ``OUT/results.json``, ``OUT/results.md`` and PNG plots under
``OUT/plots/``.  See docs/study.md for the full interface.

A ``--system`` value is split with :func:`shlex.split` (shell quoting rules): the first word is
``NAME=ARCH``, every later word goes to fairseq-train as it is, after the study's own flags (so it
wins: fairseq keeps the last value of a repeated option).  ``--train-args`` and ``--gen-args`` are
split the same way.

Resuming: every (system, seed) runs in ``OUT/runs/GROUP/NAME/seedS``.  A run whose ``result.json``
exists is not run again; an interrupted one restarts fairseq-train in the same ``--save-dir``, which
resumes from ``checkpoint_last.pt`` (fairseq's own resume; ``--stop-time-hours`` counts the
training time saved in the checkpoint, so the budget holds across restarts).
"""

import concurrent.futures
import glob
import json
import logging
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import ArgumentParser, UserError, report_user_errors

logger = logging.getLogger("fairseq_deep.study")

PLUGIN_DIR = os.path.dirname(os.path.abspath(__file__))
CUSTOM = "custom"  # the group of the --system systems


@dataclass
class System:
    """One row of a study: fairseq-train ``--arch arch`` plus ``flags``."""

    name: str
    arch: str
    flags: List[str] = field(default_factory=list)
    group: str = CUSTOM
    technique: Optional[str] = None  # a line of the BLEU-against-depth plot
    depth: Optional[int] = None  # encoder layers, where the group varies them
    #: encoder depths of the stages before this one (fairseq-deep-grow --method stack between
    #: stages, Li et al. 2020); empty: trained from scratch
    stages: List[int] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.group}/{self.name}"


# --------------------------------------------------------------------------------------------
# systems: --system values and the built-in groups
# --------------------------------------------------------------------------------------------

_NAME = re.compile(r"^[A-Za-z0-9][\w.+-]*$")


def infer_depth(arch: str, flags: Sequence[str]) -> Optional[int]:
    """The encoder depth a system states: ``--encoder-layers N`` (the last one) or an arch named
    ``..._Nl``; None when neither says."""
    depth = None
    m = re.search(r"_(\d+)l$", arch)
    if m:
        depth = int(m.group(1))
    for i, word in enumerate(flags):
        if word == "--encoder-layers" and i + 1 < len(flags):
            depth = int(flags[i + 1])
        elif word.startswith("--encoder-layers="):
            depth = int(word.split("=", 1)[1])
    return depth


def parse_system(value: str, group: str = CUSTOM) -> System:
    """``"NAME=ARCH [FLAGS...]"`` (split with shlex) as a System."""
    words = shlex.split(value)
    if not words or "=" not in words[0]:
        raise UserError(f"--system {value!r}: expected NAME=ARCH [FLAGS...], e.g. "
                         "--system \"dlcl=transformer_dlcl --encoder-layers 6\"")
    name, arch = words[0].split("=", 1)
    if not _NAME.match(name) or not arch:
        raise UserError(f"--system {value!r}: NAME must be letters, digits, '_', '.', '+', '-' "
                         "and ARCH must not be empty")
    flags = words[1:]
    if "--arch" in flags or "-a" in flags:
        raise UserError(f"--system {value!r}: give the architecture as NAME=ARCH, not --arch")
    depth = infer_depth(arch, flags)
    # "dlcl_20" and "dlcl_6" are one technique (a line of the BLEU-against-depth plot) at two depths
    m = re.match(r"^(.+?)[_-]?(\d+)l?$", name)
    technique = m.group(1) if m and depth is not None and int(m.group(2)) == depth else name
    return System(name, arch, flags, group, technique=technique, depth=depth)


def _depth_system(name: str, family: str, depth: int, group: str, technique: str) -> System:
    """``family`` for 6 encoder layers (the depth-free preset), ``family_{N}l`` where that preset
    exists, else ``family --encoder-layers N``."""
    import fairseq_deep  # noqa: F401  (registers the architectures)
    from fairseq.models import ARCH_MODEL_REGISTRY

    named = f"{family}_{depth}l"
    if depth != 6 and named in ARCH_MODEL_REGISTRY:
        return System(name, named, [], group, technique, depth)
    return System(name, family, [] if depth == 6 else ["--encoder-layers", str(depth)], group, technique, depth)


def _preset_depths(arch: str) -> Tuple[int, int]:
    """(encoder, decoder) layers that ``--arch arch`` gives when no flag sets them."""
    import argparse as _argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = _argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](args)
    return int(args.encoder_layers), int(args.decoder_layers)


def _deep_both_system(name: str, family: str, depth: int, group: str, technique: str) -> System:
    """N encoder and N decoder layers: ``family_{N}l`` where that preset has N + N layers (a
    preset of another shape, e.g. ``transformer_admin_60l``'s 60 + 12, is not used), the
    depth-free ``family`` where it has them, else ``family --encoder-layers N --decoder-layers N``."""
    import fairseq_deep  # noqa: F401  (registers the architectures)
    from fairseq.models import ARCH_MODEL_REGISTRY

    named = f"{family}_{depth}l"
    if named in ARCH_MODEL_REGISTRY and _preset_depths(named) == (depth, depth):
        return System(name, named, [], group, technique, depth)
    flags = [] if _preset_depths(family) == (depth, depth) else [
        "--encoder-layers", str(depth), "--decoder-layers", str(depth)]
    return System(name, family, flags, group, technique, depth)


DIVERSITY = ["--criterion", "label_smoothed_cross_entropy_with_diversity", "--label-smoothing", "0.1"]


def _wang(depths):
    depths = depths or [6, 12, 16, 20, 25, 30]
    systems = []
    for technique, family in (("post-norm", "transformer_postnorm"), ("pre-norm", "transformer_prenorm"),
                              ("DLCL", "transformer_dlcl"), ("post-norm DLCL", "transformer_dlcl_postnorm")):
        short = family.replace("transformer_", "")
        systems += [_depth_system(f"{short}_{n}", family, n, "wang", technique) for n in depths]
    return "postnorm_6", systems


def _bapna(depths):
    depths = depths or [6, 12, 16]
    systems = []
    for technique, family, short in (("baseline", "transformer_ta_baseline", "baseline"),
                                     ("no residuals", "transformer_ta_nores", "nores"),
                                     ("transparent attention", "transformer_ta", "ta")):
        systems += [_depth_system(f"{short}_{n}", family, n, "bapna", technique) for n in depths]
    return "baseline_6", systems


def _chen(depths):
    rows = [("transformer", "transformer_prenorm"), ("rnmt_plus", "rnmt_plus"),
            ("hybrid_transformer_rnmt", "hybrid_transformer_rnmt"),
            ("hybrid_rnmt_transformer", "hybrid_rnmt_transformer"),
            ("hybrid_cascaded", "hybrid_cascaded"), ("hybrid_multicolumn", "hybrid_multicolumn")]
    return "transformer", [System(name, arch, [], "chen", name) for name, arch in rows]


def _zhou(depths):
    rows = [("noff_2x2", "deep_att_noff_2x2", [], "no F-F", 2), ("ff_2x2", "deep_att_ff_2x2", [], "F-F", 2),
            ("noff_5x3", "deep_att_ff", ["--ff-mode", "none", "--encoder-layers", "5", "--decoder-layers", "3"],
             "no F-F", 5),
            ("ff_5x3", "deep_att_ff_5x3", [], "F-F", 5)]
    return "noff_2x2", [System(n, a, f, "zhou", t, d) for n, a, f, t, d in rows]


def _dou(depths):
    rows = [("baseline", "transformer_agg_baseline", []), ("dense", "transformer_dense", []),
            ("linear", "transformer_linear_agg", []), ("iterative", "transformer_iterative_agg", []),
            ("hierarchical", "transformer_hier_agg", []), ("mla2", "transformer_mla2", []),
            ("mla3", "transformer_mla3", []), ("hierarchical+div", "transformer_hier_agg", DIVERSITY)]
    return "baseline", [System(n, a, f, "dou", n) for n, a, f in rows]


#: the depth group: (technique, --arch family, system name prefix)
DEPTH_FAMILIES = (("post-norm", "transformer_postnorm", "postnorm"), ("pre-norm", "transformer_prenorm", "prenorm"),
                  ("DLCL", "transformer_dlcl", "dlcl"), ("DeepNorm", "transformer_deepnorm", "deepnorm"),
                  ("Admin", "transformer_admin", "admin"), ("DS-Init", "transformer_dsinit", "dsinit"),
                  ("ReZero", "transformer_rezero", "rezero"))


def _depth(depths):
    """Every way of training a deep post-norm (or pre-norm) Transformer of the package at equal
    depth: N encoder and N decoder layers, since DeepNet, Admin, DS-Init and ReZero deepen both
    sides (Wang et al. 2019 deepen the encoder only: that is the wang group)."""
    depths = depths or [6, 18]
    systems = []
    for technique, family, short in DEPTH_FAMILIES:
        systems += [_deep_both_system(f"{short}_{n}", family, n, "depth", technique) for n in depths]
    return "postnorm_6", systems


def _li(depths):
    """Li et al. (2020), shallow-to-deep training: pre-norm DLCL (their model) of the shallowest
    depth, the deepest trained from scratch, and the deepest grown from the shallowest through every
    depth between (--method stack, a learning-rate restart at each stage; the stages share the
    budget equally, so the grown model has the same training time or updates as the others)."""
    depths = sorted(set(depths or [6, 12]))
    if len(depths) < 2:
        raise UserError("--group li needs two depths at least (--depths SHALLOW,DEEP[,...])")
    shallow, deep = depths[0], depths[-1]
    systems = [_depth_system(f"dlcl_{shallow}", "transformer_dlcl", shallow, "li", "shallow"),
               System(f"dlcl_{deep}", "transformer_dlcl", ["--encoder-layers", str(deep)], "li", "from scratch", deep),
               System(f"dlcl_{'_'.join(map(str, depths))}", "transformer_dlcl", ["--encoder-layers", str(deep)],
                      "li", "grown (stack)", deep, stages=depths[:-1])]
    return f"dlcl_{deep}", systems


#: name: (what, the function that lists (baseline, systems) for a list of depths or None)
GROUPS = {
    "wang": ("Wang et al. 2019: post-norm / pre-norm / DLCL / post-norm DLCL against encoder depth", _wang),
    "bapna": ("Bapna et al. 2018: post-norm baseline, no residuals, transparent attention against depth", _bapna),
    "chen": ("Chen et al. 2018: Transformer (pre-norm), RNMT+ and the four hybrids", _chen),
    "zhou": ("Zhou et al. 2016: Deep-Att with and without fast-forward connections at two depths", _zhou),
    "dou": ("Dou et al. 2018: baseline, dense, linear, iterative, hierarchical, MLA-2/3, +diversity", _dou),
    "depth": ("N + N layers: post-norm, pre-norm, DLCL (Wang et al. 2019), DeepNorm (Wang et al. 2022), "
              "Admin (Liu et al. 2020), DS-Init (Zhang et al. 2019), ReZero (Bachlechner et al. 2020)", _depth),
    "li": ("Li et al. 2020: a deep pre-norm DLCL grown from a shallow one (fairseq-deep-grow, stages sharing "
           "the budget) against the same depth from scratch and the shallow model", _li),
}


def expand_group(spec: str, depths: Optional[Sequence[int]] = None) -> Tuple[str, List[System]]:
    """``NAME`` or ``NAME:SYS,SYS`` (a subset; the baseline is always kept) as (baseline, systems).
    ``depths`` picks the encoder depths of wang and bapna, and the depth N (N encoder and N decoder
    layers) of depth (zhou's are the paper's 2 and 5: pick its systems by name)."""
    name, _, subset = spec.partition(":")
    if name not in GROUPS:
        raise UserError(f"--group {name}: unknown group; choose from {', '.join(GROUPS)}")
    baseline, systems = GROUPS[name][1](list(depths) if depths else None)
    if baseline not in {s.name for s in systems}:  # a --depths filter dropped it: keep it anyway
        base = GROUPS[name][1](None)[1]
        systems = [s for s in base if s.name == baseline] + systems
    if subset:
        wanted = [w for w in subset.split(",") if w]
        unknown = set(wanted) - {s.name for s in systems}
        if unknown:
            raise UserError(f"--group {spec}: no system {', '.join(sorted(unknown))} in {name}; it has "
                             f"{', '.join(s.name for s in systems)}")
        systems = [s for s in systems if s.name == baseline or s.name in wanted]
    return baseline, systems


# --------------------------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------------------------

def model_kind(arch: str) -> str:
    """The model family of an --arch: transformer, rnmt_plus, rnmt_hybrid, deep_att or other."""
    import fairseq_deep  # noqa: F401  (registers the architectures)
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    if arch not in ARCH_MODEL_NAME_REGISTRY:
        raise UserError(f"--arch {arch}: not a fairseq architecture (fairseq-deep-list-archs lists "
                         "this package's)")
    model = ARCH_MODEL_NAME_REGISTRY[arch]
    if model in ("rnmt_plus", "rnmt_hybrid", "deep_att"):
        return model
    return "transformer" if model.startswith("transformer") else "other"


def width_flags(arch: str, width: Optional[int]) -> List[str]:
    """Model sizes for ``--width W``, consistent within each family: Transformers embed W, FFN 4W,
    max(2, W // 64) heads (Base at 512, Big at 1024); RNMT+ embeddings and LSTM cells W (per
    direction in the encoder); the hybrids both; Deep-Att embeddings W/2 and cells W (the paper's
    256/512)."""
    if not width:
        return []
    kind = model_kind(arch)
    heads = str(max(2, width // 64))
    w, w4 = str(width), str(4 * width)
    transformer = ["--encoder-embed-dim", w, "--decoder-embed-dim", w, "--encoder-ffn-embed-dim", w4,
                   "--decoder-ffn-embed-dim", w4, "--encoder-attention-heads", heads,
                   "--decoder-attention-heads", heads]
    rnn = ["--encoder-hidden-size", w, "--decoder-hidden-size", w]
    if kind == "transformer":
        return transformer
    if kind == "rnmt_plus":
        return ["--encoder-embed-dim", w, "--decoder-embed-dim", w] + rnn
    if kind == "rnmt_hybrid":
        return transformer + rnn
    if kind == "deep_att":
        return ["--encoder-embed-dim", str(max(1, width // 2)), "--decoder-embed-dim", str(max(1, width // 2))] + rnn
    logger.warning("--width: no sizes known for --arch %s; it keeps its own", arch)
    return []


def _has(flags: Sequence[str], option: str) -> bool:
    return any(f == option or f.startswith(option + "=") for f in flags)


def interval(args) -> int:
    """Updates between validations (and saved checkpoints)."""
    if args.valid_interval:
        return args.valid_interval
    return max(1, args.max_update // 10) if args.max_update else 500


#: n of Chen et al.'s Eq. 1: RNMT+ was trained on 32 GPUs (Sec. 4), n = 32 replicas
RNMT_REPLICAS = 32
#: Chen et al.'s RNMT+ peak learning rate over their Transformer-Base peak (issue 25): Eq. 1 peaks at
#: n * 1e-4 = 3.2e-3, Eq. 2 (r_0 = 2, p = 8000, d = 512, App. A.1) at 2 / sqrt(512 * 8000) = 9.9e-4.
#: The study's --lr is the Transformers' peak, so RNMT+ peaks at 3.2 x --lr (Eq. 1's base 1e-4 at the
#: default --lr 1e-3); before issue 25 it peaked at --lr, a third of what its paper gives it.
RNMT_LR_RATIO = 3.2


def recipe(args, arch: str) -> Tuple[str, List[str], List[str]]:
    """(name, optimiser flags, LR-schedule flags) of a system: ``--recipe shared`` gives every
    system the study's Adam (0.9, 0.98) with inverse_sqrt warm-up over ``--warmup`` to ``--lr``;
    ``--recipe paper`` (the default, issue 25) gives RNMT+ and Deep-Att their paper's instead:

    * ``rnmt_plus``: Chen et al. Sec. 4.1, Adam (0.9, 0.999, eps 1e-6) and Eq. 1 with n = 32
      replicas, peak ``RNMT_LR_RATIO`` x ``--lr`` (3.2 x: the paper's RNMT+ peak over its
      Transformer-Base peak; base = that / 32, i.e. Eq. 1's 1e-4 at --lr 1e-3) reached linearly over
      ``--warmup`` updates (n p; p = warmup/32), then constant (the decay starts after 600k/n updates).

    Deep-Att keeps the shared recipe (issue 25): Zhou et al.'s ``--optimizer deep_att`` (Adam with
    fixed l_f = 4e-5, l_r = 5e-4, L2 r = 2; Sec. 4.3) was tuned for 10 days of training and hardly
    moves a model in a study's budget (docs/deep_att.md, "Learning curves (issue 25)"); a system
    gets it by naming it (``--system "x=deep_att_ff_2x2 --optimizer deep_att --deep-att-lr-recurrent
    5e-4 --lr 4e-5 --lr-scheduler fixed"``).

    The Transformers (Vaswani et al.'s recipe, which Wang, Bapna and Dou et al. use) and the
    hybrids (Chen et al. train them with the Transformer schedule, Eq. 2) keep the shared recipe."""
    shared = ("shared", ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-8",
                         "--lr", str(args.lr)],
              ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(args.warmup), "--warmup-init-lr", "1e-07"])
    if getattr(args, "recipe", "shared") != "paper":
        return shared
    kind = model_kind(arch)
    if kind == "rnmt_plus":
        n = RNMT_REPLICAS
        peak = RNMT_LR_RATIO * args.lr
        return ("rnmt_plus", ["--optimizer", "adam", "--adam-betas", "(0.9, 0.999)", "--adam-eps", "1e-6",
                              "--lr", f"{peak:.6g}"],
                ["--lr-scheduler", "rnmt_plus", "--rnmt-replicas", str(n), "--rnmt-base-lr", f"{peak / n:.6g}",
                 "--warmup-updates", str(max(1, round(args.warmup / n)))])
    return shared


def recipe_text(args, arch: str, flags: Sequence[str] = ()) -> str:
    """The results table's words for the optimiser and schedule a system trained with."""
    if _has(flags, "--optimizer") or _has(flags, "--lr-scheduler"):
        return "own flags"
    name = recipe(args, arch)[0]
    if name == "rnmt_plus":
        return f"Adam (0.9, 0.999, 1e-6), Eq. 1 (n = {RNMT_REPLICAS}) to lr {RNMT_LR_RATIO * args.lr:.6g}"
    return f"Adam (0.9, 0.98), inverse_sqrt, lr {args.lr}, warm-up {args.warmup}"


def train_command(args, system: System, seed: int, save_dir: str) -> List[str]:
    own = system.flags + args.train_args_list
    cmd = [sys.executable, "-m", "fairseq_cli.train", args.data, "--user-dir", PLUGIN_DIR,
           "--arch", system.arch, *width_flags(system.arch, args.width)]
    if args.dropout is not None:
        cmd += ["--dropout", str(args.dropout)]
    _, optimizer, schedule = recipe(args, system.arch)
    if not _has(own, "--optimizer"):
        cmd += optimizer
    else:
        cmd += ["--lr", str(args.lr)]
    if not _has(own, "--lr-scheduler"):
        cmd += schedule
    if not _has(own, "--criterion"):
        cmd += ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(args.label_smoothing)]
    every = interval(args)
    cmd += ["--max-tokens", str(args.max_tokens), "--seed", str(seed),
            "--save-dir", save_dir, "--no-epoch-checkpoints", "--save-interval-updates", str(every),
            "--keep-interval-updates", "1", "--validate-interval-updates", str(every),
            "--log-format", "json", "--log-interval", str(args.log_interval), "--skip-invalid-size-inputs-valid-test"]
    if args.max_update:
        cmd += ["--max-update", str(args.max_update)]
    if args.minutes:
        cmd += ["--stop-time-hours", f"{args.minutes / 60:.6g}"]
    if args.cpu:
        cmd += ["--cpu", "--num-workers", "0"]
    return cmd + args.train_args_list + system.flags


def _restore_grown(save_dir: str, grown: str) -> List[str]:
    """Restore a grown checkpoint with the optimizer, schedule and data reset (Li et al.'s
    learning-rate restart); nothing when ``save_dir`` has a checkpoint_last.pt (fairseq resumes it)."""
    if os.path.exists(os.path.join(save_dir, "checkpoint_last.pt")):
        return []
    return ["--restore-file", grown, "--reset-optimizer", "--reset-lr-scheduler", "--reset-dataloader"]


def stage_commands(args, system: System, seed: int, run_dir: str) -> Tuple[List[Tuple[str, List[str], str]], List[str]]:
    """A grown system (``system.stages``): ([(name, command, the file that says it is done)], the
    last stage's train command).  Each earlier stage trains in ``run_dir/stage_D`` (from the
    previous stage's grown checkpoint), its last checkpoint is grown (fairseq-deep-grow --method
    stack), and the last stage (the system's own train command, in ``run_dir``) restores it.  Stage
    i of n stops at (i+1)/n of --minutes (fairseq's --stop-time-hours counts the training time that
    the checkpoints carry across growing: fairseq-deep-grow --keep-training-time) and trains
    --max-update / n updates (each counts from 0)."""
    n = len(system.stages) + 1
    depths = system.stages + [system.depth]

    def budget(i):
        flags = []
        if args.max_update:
            flags += ["--max-update", str(max(1, args.max_update // n))]
        if args.minutes:
            flags += ["--stop-time-hours", f"{args.minutes * (i + 1) / n / 60:.6g}"]
        return flags

    steps = []
    for i, depth in enumerate(system.stages):
        stage_dir = os.path.join(run_dir, f"stage_{depth}")
        cmd = train_command(args, system, seed, stage_dir) + ["--encoder-layers", str(depth)] + budget(i)
        if i > 0:
            cmd += _restore_grown(stage_dir, os.path.join(run_dir, f"grown_{depth}.pt"))
        steps.append((f"stage_{depth}", cmd, os.path.join(run_dir, f"stage_{depth}.done")))
        grown = os.path.join(run_dir, f"grown_{depths[i + 1]}.pt")
        steps.append((f"grow_{depths[i + 1]}", [sys.executable, "-m", "fairseq_deep.grow", "--checkpoint",
                      os.path.join(stage_dir, "checkpoint_last.pt"), "--out", grown, "--encoder-layers",
                      str(depths[i + 1]), "--method", "stack", "--keep-training-time"], grown))
    final = train_command(args, system, seed, run_dir) + budget(n - 1)
    return steps, final + _restore_grown(run_dir, os.path.join(run_dir, f"grown_{system.depth}.pt"))


def generate_command(args, checkpoint: str) -> List[str]:
    cmd = [sys.executable, "-m", "fairseq_cli.generate", args.data, "--user-dir", PLUGIN_DIR,
           "--path", checkpoint, "--gen-subset", "test", "--beam", str(args.beam),
           "--batch-size", str(args.gen_batch_size), "--skip-invalid-size-inputs-valid-test"]
    if args.spm:
        cmd += ["--post-process", "sentencepiece"]
    elif args.remove_bpe:
        cmd += ["--post-process", args.remove_bpe]
    if args.cpu:
        cmd += ["--cpu", "--num-workers", "0"]
    return cmd + args.gen_args_list


# --------------------------------------------------------------------------------------------
# scoring
# --------------------------------------------------------------------------------------------

_HYP = re.compile(r"^([HDT])-(\d+)\t(.*)$")


def parse_generate(text: str, n_test: int) -> Tuple[List[str], List[str]]:
    """(hypotheses, references) in input order from fairseq-generate's output: the ``D-`` lines
    (detokenized; ``H-`` where there are none) and the ``T-`` lines, put in order by their ids.
    Raises ValueError unless every one of the ``n_test`` sentences has exactly one hypothesis."""
    found: Dict[str, Dict[int, str]] = {"H": {}, "D": {}, "T": {}}
    for line in text.splitlines():
        m = _HYP.match(line)
        if not m:
            continue
        kind, idx, rest = m.group(1), int(m.group(2)), m.group(3)
        if kind in "HD":  # "score<TAB>text"
            rest = rest.split("\t", 1)[1] if "\t" in rest else ""
        if kind in "HD" and idx in found[kind]:
            continue  # --nbest > 1: the first (best) hypothesis only
        found[kind][idx] = rest
    hyps = found["D"] or found["H"]
    missing = sorted(set(range(n_test)) - set(hyps))
    extra = sorted(set(hyps) - set(range(n_test)))
    if missing or extra:
        raise ValueError(f"fairseq-generate gave {len(hyps)} hypotheses for a test set of {n_test} "
                         f"sentences (missing ids {missing[:10]}{'...' if len(missing) > 10 else ''}"
                         f"{', unexpected ids ' + str(extra[:10]) if extra else ''}); a sentence longer "
                         "than --max-source-positions is skipped: raise it with --gen-args")
    refs = [found["T"].get(i) for i in range(n_test)]
    return [hyps[i] for i in range(n_test)], ([] if None in refs else refs)


def score(hyps: Sequence[str], refs: Sequence[str]) -> Dict[str, float]:
    import sacrebleu

    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
    return {"bleu": sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score,
            "chrf": sacrebleu.corpus_chrf(list(hyps), [list(refs)]).score}


def paired_bootstrap(baseline: Sequence[str], systems: Dict[str, Sequence[str]], refs: Sequence[str],
                     n_samples: int = 1000) -> Dict[str, Dict[str, float]]:
    """sacreBLEU's paired bootstrap resampling (``sacrebleu --paired-bs``) of each system against
    the baseline: {name: {"bleu_p": p, "chrf_p": p}}."""
    if not systems:
        return {}
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    named = [("__baseline__", list(baseline))] + [(k, list(v)) for k, v in systems.items()]
    _, scores = PairedTest(named, {"BLEU": BLEU(), "chrF": CHRF()}, [list(refs)], test_type="bs",
                           n_samples=n_samples)()
    metric_keys = [k for k in scores if k != "System"]
    out = {}
    for i, name in enumerate(scores["System"]):
        if i == 0:
            continue
        out[name] = {}
        for key in metric_keys:
            tag = "bleu_p" if key.upper().startswith("BLEU") else "chrf_p"
            out[name][tag] = scores[key][i].p_value
    return out


def count_test_sentences(data: str) -> int:
    """Sentences in the binarized test set (fairseq-preprocess ``--testpref``)."""
    idx = sorted(glob.glob(os.path.join(data, "test.*-*.*.idx")))
    if not idx:
        raise UserError(f"--data {data}: no binarized test set (test.SRC-TGT.SRC.idx); "
                        "run fairseq-preprocess (or fairseq-deep-prepare) with --testpref")
    from fairseq.data import indexed_dataset

    return len(indexed_dataset.MMapIndexedDataset(idx[0][:-len(".idx")]))


def read_refs(path: str) -> List[str]:
    from .prepare import read_lines

    return read_lines(path)


# --------------------------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------------------------

@dataclass
class RunState:
    system: System
    seed: int
    run_dir: str
    status: str = "queued"  # queued, training, decoding, done, failed
    started: Optional[float] = None
    start_update: Optional[int] = None
    error: Optional[str] = None
    result: Optional[dict] = None

    @property
    def label(self) -> str:
        return f"{self.system.key} seed {self.seed}"


_UPDATE = re.compile(r'"num_updates": "?(\d+)')


def last_update(log_path: str) -> Optional[int]:
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = _UPDATE.findall(tail)
    return int(found[-1]) if found else None


def learning_curve(series: dict) -> Tuple[List[List[float]], Optional[float]]:
    """([[update, seconds, valid loss], ...], updates per second) from a parsed fairseq-train log
    (:func:`~fairseq_deep.diagnostics.plot_training.parse_log_lines`).  Seconds are fairseq's
    ``wall`` clock of the training (the time ``--minutes`` budgets: validation included), read off
    the ``train_inner`` records and interpolated linearly to each validation's update (beyond the
    last record, at the last rate); updates/s is the last record's update over its wall time.
    None where the log has no timed record."""
    walls = sorted((u, w) for u, w in series.get("wall", []) if w > 0)
    ups = walls[-1][0] / walls[-1][1] if walls else None

    def seconds(update: float) -> Optional[float]:
        if not walls:
            return None
        below = [(u, w) for u, w in walls if u <= update]
        above = [(u, w) for u, w in walls if u >= update]
        if below and above:
            (u0, w0), (u1, w1) = below[-1], above[0]
            return w0 if u1 == u0 else w0 + (w1 - w0) * (update - u0) / (u1 - u0)
        if above:  # before the first record: from update 0 at time 0
            u1, w1 = above[0]
            return w1 * update / u1
        u0, w0 = below[-1]
        return w0 + (update - u0) / ups

    curve = [[u, None if seconds(u) is None else round(seconds(u), 1), v] for u, v in series.get("valid_loss", [])]
    return curve, (round(ups, 4) if ups else None)


def _last_error(text: str) -> str:
    lines = [ln for ln in text.splitlines() if re.search(r"(Error|Exception)\b", ln)]
    return (lines[-1] if lines else (text.strip().splitlines() or [""])[-1])[:300]


class Study:
    def __init__(self, args, groups: Dict[str, Tuple[str, List[System]]]):
        self.args = args
        self.groups = groups
        self.n_test = count_test_sentences(args.data)
        self.refs: Optional[List[str]] = read_refs(args.ref) if args.ref else None
        if self.refs is not None and len(self.refs) != self.n_test:
            raise UserError(f"--ref {args.ref} has {len(self.refs)} lines, the test set {self.n_test} sentences")
        self.runs = [RunState(s, seed, os.path.join(args.out, "runs", s.group, s.name, f"seed{seed}"))
                     for _, systems in groups.values() for s in systems for seed in range(1, args.seeds + 1)]
        self.lock = threading.Lock()
        self.stopping = threading.Event()  # set on Ctrl-C / SIGTERM: queued runs do not start
        self.procs = set()  # the running fairseq subprocesses
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
        if "OMP_NUM_THREADS" not in os.environ:
            self.env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.jobs))

    # -- one run ---------------------------------------------------------------------------
    def _subprocess(self, cmd: List[str], log_path: str, mode: str = "a") -> int:
        with open(log_path, mode, encoding="utf-8") as log:
            log.write("# " + " ".join(shlex.quote(c) for c in cmd) + "\n")
            log.flush()
            with self.lock:
                if self.stopping.is_set():
                    return -1
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
                self.procs.add(proc)
            try:
                return proc.wait()
            finally:
                with self.lock:
                    self.procs.discard(proc)

    def stop(self):
        """Start nothing more and end the running fairseq processes (fairseq resumes them from
        checkpoint_last.pt next time)."""
        with self.lock:
            self.stopping.set()
            for proc in self.procs:
                proc.terminate()

    def run_one(self, run: RunState):
        result_path = os.path.join(run.run_dir, "result.json")
        cmd = train_command(self.args, run.system, run.seed, run.run_dir)
        steps = []
        if run.system.stages:  # grown from shallower stages (the li group): stage, grow, ..., this one
            steps, cmd = stage_commands(self.args, run.system, run.seed, run.run_dir)
        cmd_path = os.path.join(run.run_dir, "train_command.json")
        if os.path.exists(cmd_path):
            with open(cmd_path) as f:
                if json.load(f) != cmd[1:]:
                    logger.warning("%s: the fairseq-train command differs from the one saved in %s; a finished "
                                   "run keeps its scores, an unfinished one resumes from its checkpoint_last.pt "
                                   "with the new command (delete the folder to start again)", run.label, cmd_path)
        if os.path.exists(result_path):
            with open(result_path) as f:
                run.result = json.load(f)
            run.status = "done"
            return
        os.makedirs(run.run_dir, exist_ok=True)
        log_path = os.path.join(run.run_dir, "train.log")
        done_marker = os.path.join(run.run_dir, "train.done")
        if not os.path.exists(done_marker):
            with open(cmd_path, "w") as f:
                json.dump(cmd[1:], f, indent=0)
            run.status, run.started = "training", time.time()
            run.start_update = last_update(log_path) or 0
            self.log_progress(only=run)
            t0 = time.time()
            for name, step, done in steps:
                if os.path.exists(done):
                    continue
                step_log = os.path.join(run.run_dir, name + ".log")
                rc = self._subprocess(step, step_log)
                if rc != 0 and self.stopping.is_set():
                    run.error, run.status = "interrupted (resumes from its last stage)", "failed"
                    return
                if rc != 0:
                    with open(step_log, encoding="utf-8", errors="replace") as f:
                        run.error = f"{name}: " + _last_error(f.read()[-20000:])
                    run.status = "failed"
                    return
                if not name.startswith("grow_"):
                    with open(done, "w") as f:
                        f.write(f"{time.time() - t0:.1f}\n")
            rc = self._subprocess(cmd, log_path)
            if rc != 0 and self.stopping.is_set():
                run.error, run.status = "interrupted (resumes from checkpoint_last.pt)", "failed"
                return
            if rc != 0:
                with open(log_path, encoding="utf-8", errors="replace") as f:
                    run.error = "fairseq-train: " + _last_error(f.read()[-20000:])
                run.status = "failed"
                return
            with open(done_marker, "w") as f:
                f.write(f"{time.time() - t0:.1f}\n")
        if self.stopping.is_set():
            return
        run.status = "decoding"
        self.log_progress(only=run)
        checkpoint = os.path.join(run.run_dir, f"checkpoint_{self.args.checkpoint}.pt")
        if not os.path.exists(checkpoint):
            checkpoint = os.path.join(run.run_dir, "checkpoint_last.pt")
        gen_path = os.path.join(run.run_dir, "generate.out")
        rc = self._subprocess(generate_command(self.args, checkpoint), gen_path, mode="w")
        with open(gen_path, encoding="utf-8", errors="replace") as f:
            gen_text = f.read()
        if rc != 0:
            run.error, run.status = "fairseq-generate: " + _last_error(gen_text[-20000:]), "failed"
            return
        try:
            hyps, t_refs = parse_generate(gen_text, self.n_test)
        except ValueError as e:
            run.error, run.status = str(e), "failed"
            return
        refs = self.refs if self.refs is not None else t_refs
        if not refs:
            run.error, run.status = "fairseq-generate printed no references (T- lines): give --ref", "failed"
            return
        with open(os.path.join(run.run_dir, "hyp.txt"), "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hyps)
        with open(os.path.join(run.run_dir, "ref.txt"), "w", encoding="utf-8") as f:
            f.writelines(r + "\n" for r in refs)
        from .diagnostics.plot_training import read_run

        series = read_run(log_path)
        valid = [v for _, v in series.get("valid_loss", [])]
        with open(done_marker) as f:
            train_s = float(f.read().strip() or "nan")
        result = {**score(hyps, refs), "sentences": len(hyps), "test_size": self.n_test,
                  # the last validation comes after the last train_inner record (a --minutes stop)
                  "updates": max([last_update(log_path) or 0] + [int(x) for x, _ in series.get("valid_loss", [])]),
                  "best_valid_loss": min(valid) if valid else None,
                  "last_valid_loss": valid[-1] if valid else None, "train_seconds": round(train_s, 1),
                  "checkpoint": os.path.basename(checkpoint)}
        result["curve"], result["updates_per_second"] = learning_curve(series)
        for d in run.system.stages:  # the updates of the earlier stages too (each stage counts from 0)
            stage_log = os.path.join(run.run_dir, f"stage_{d}.log")
            result["updates"] += max([last_update(stage_log) or 0]
                                     + [int(x) for x, _ in read_run(stage_log).get("valid_loss", [])])
        with open(result_path, "w") as f:
            json.dump(result, f, indent=1)
        run.result, run.status = result, "done"

    def _guarded(self, run: RunState):
        if self.stopping.is_set():
            return
        try:
            self.run_one(run)
        except Exception as e:  # one failed system must not stop the others
            logger.exception("%s failed", run.label)
            run.error, run.status = f"{type(e).__name__}: {e}", "failed"
        self.log_progress(only=run)

    # -- progress ----------------------------------------------------------------------------
    def progress_line(self, run: RunState) -> str:
        if run.status in ("done", "failed", "queued"):
            extra = ""
            if run.status == "done" and run.result:
                extra = f", BLEU {run.result['bleu']:.2f}, chrF {run.result['chrf']:.2f}"
            elif run.status == "failed":
                extra = f": {run.error}"
            return f"{run.label}: {run.status}{extra}"
        update = last_update(os.path.join(run.run_dir, "train.log"))
        line = f"{run.label}: {run.status}"
        if run.status != "training":
            return line
        line += f", update {update if update is not None else '-'}"
        if self.args.max_update:
            line += f"/{self.args.max_update}"
        eta = []
        elapsed = time.time() - (run.started or time.time())
        if self.args.minutes:
            eta.append(max(0.0, self.args.minutes * 60 - elapsed))
        done = (update or 0) - (run.start_update or 0)
        if self.args.max_update and update is not None and done > 0:
            eta.append((self.args.max_update - update) * elapsed / done)
        if eta:
            line += f", ETA {min(eta) / 60:.1f} min"
        return line

    def log_progress(self, only: Optional[RunState] = None):
        with self.lock:
            runs = [only] if only else self.runs
            counts = {s: sum(r.status == s for r in self.runs) for s in ("done", "failed", "training",
                                                                           "decoding", "queued")}
            if not only:
                logger.info("progress: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v))
            for r in runs:
                logger.info(self.progress_line(r))

    def run(self):
        stop = threading.Event()

        def monitor():
            while not stop.wait(self.args.progress_every):
                self.log_progress()

        thread = threading.Thread(target=monitor, daemon=True)
        thread.start()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.args.jobs)
        try:
            for future in [pool.submit(self._guarded, r) for r in self.runs]:
                future.result()
        except KeyboardInterrupt:
            self.stop()
            logger.warning("interrupted: run the same command again to resume")
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            stop.set()
        self.log_progress()

    # -- results -----------------------------------------------------------------------------
    def read_hyps(self, run: RunState) -> Optional[List[str]]:
        path = os.path.join(run.run_dir, "hyp.txt")
        if run.status != "done" or not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]

    def read_run_refs(self, run: RunState) -> Optional[List[str]]:
        path = os.path.join(run.run_dir, "ref.txt")
        if self.refs is not None:
            return self.refs
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]

    def results(self) -> dict:
        a = self.args
        out = {"settings": {"data": os.path.abspath(a.data), "spm": a.spm, "remove_bpe": a.remove_bpe,
                            "ref": a.ref, "width": a.width, "max_update": a.max_update, "minutes": a.minutes,
                            "seeds": a.seeds, "lr": a.lr, "warmup": a.warmup, "dropout": a.dropout,
                            "max_tokens": a.max_tokens, "beam": a.beam, "checkpoint": a.checkpoint,
                            "train_args": a.train_args_list, "gen_args": a.gen_args_list,
                            "test_size": self.n_test, "cpu": a.cpu, "recipe": a.recipe},
               "groups": {}}
        for gname, (baseline, systems) in self.groups.items():
            runs = {s.name: [r for r in self.runs if r.system is s] for s in systems}
            rows = {}
            for s in systems:
                seeds = {str(r.seed): (r.result if r.status == "done" else {"error": r.error, "status": r.status})
                         for r in runs[s.name]}
                ok = [r.result for r in runs[s.name] if r.status == "done" and r.result]
                row = {**{k: v for k, v in asdict(s).items() if k != "group"}, "seeds": seeds,
                       "seeds_done": len(ok), "recipe": recipe_text(a, s.arch, s.flags + a.train_args_list)}
                for metric in ("bleu", "chrf"):
                    values = [r[metric] for r in ok]
                    row[f"{metric}_mean"] = statistics.fmean(values) if values else None
                    row[f"{metric}_std"] = statistics.stdev(values) if len(values) > 1 else (0.0 if values else None)
                rows[s.name] = row
            # paired bootstrap, one test per seed that the baseline and the system both finished
            for seed in range(1, a.seeds + 1):
                base_run = next((r for r in runs[baseline] if r.seed == seed), None)
                base_hyps = self.read_hyps(base_run) if base_run else None
                if base_hyps is None:
                    continue
                others = {}
                for s in systems:
                    if s.name == baseline:
                        continue
                    run = next(r for r in runs[s.name] if r.seed == seed)
                    hyps = self.read_hyps(run)
                    if hyps is not None:
                        others[s.name] = hyps
                refs = self.read_run_refs(base_run)
                for name, p in paired_bootstrap(base_hyps, others, refs, a.bootstrap_samples).items():
                    rows[name].setdefault("paired_bs", {})[str(seed)] = p
            out["groups"][gname] = {"baseline": baseline, "systems": rows}
        return out


# --------------------------------------------------------------------------------------------
# report: markdown and plots
# --------------------------------------------------------------------------------------------

def _fmt(mean, std, seeds):
    if mean is None:
        return "-"
    return f"{mean:.2f}" + (f" ± {std:.2f}" if seeds > 1 else "")


def markdown(results: dict) -> str:
    s = results["settings"]
    budget = " and ".join(x for x in (f"{s['max_update']} updates" if s["max_update"] else "",
                                      f"{s['minutes']} minutes" if s["minutes"] else "") if x)
    lines = ["# fairseq-deep-study results", "",
             f"Data `{s['data']}` ({s['test_size']} test sentences), width {s['width'] or 'of the presets'}, "
             f"budget {budget or 'none'} per system, {s['seeds']} seed(s), lr {s['lr']}, warm-up {s['warmup']}, "
             f"recipe {s.get('recipe', 'shared')} (each system's optimiser and schedule: the recipe column), "
             f"max-tokens {s['max_tokens']}, beam {s['beam']}, checkpoint_{s['checkpoint']}; "
             "sacreBLEU and chrF on detokenized text (mean ± std over seeds); p: sacreBLEU's paired "
             "bootstrap resampling against the group's baseline (one value per seed); updates/s: "
             "updates per second of fairseq's training wall clock (validation included).", ""]
    for gname, group in results["groups"].items():
        title = GROUPS[gname][0] if gname in GROUPS else "systems given with --system"
        lines += [f"## {gname}: {title}", "", f"Baseline: `{group['baseline']}`.", "",
                  "| system | --arch | flags | enc. layers | BLEU | chrF | p (BLEU) | updates | updates/s | "
                  "best valid loss | recipe | note |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, row in group["systems"].items():
            done = [r for r in row["seeds"].values() if r and "bleu" in r]
            p = row.get("paired_bs", {})
            p_text = "baseline" if name == group["baseline"] else (
                " / ".join(f"{v['bleu_p']:.4f}" for v in p.values()) if p else "-")
            updates = "/".join(str(r.get("updates")) for r in done) or "-"
            valid = "/".join(f"{r['best_valid_loss']:.3f}" for r in done if r.get("best_valid_loss") is not None) or "-"
            rate = "/".join(f"{r['updates_per_second']:.3g}" for r in done if r.get("updates_per_second")) or "-"
            notes = "; ".join(f"seed {k}: {r.get('status')} {r.get('error') or ''}".strip()
                              for k, r in row["seeds"].items() if not r or "bleu" not in r)
            flags = " ".join(row["flags"]).replace("|", "\\|")
            depth = row["depth"] if row["depth"] is not None else "-"
            lines.append(f"| {name} | `{row['arch']}` | {flags} | {depth} | "
                         f"{_fmt(row['bleu_mean'], row['bleu_std'], row['seeds_done'])} | "
                         f"{_fmt(row['chrf_mean'], row['chrf_std'], row['seeds_done'])} | {p_text} | {updates} | "
                         f"{rate} | {valid} | {row.get('recipe') or '-'} | {notes.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


def _save(plt, fig, path: str, written: List[str]):
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)


def plot(study: Study, results: dict, out_dir: str) -> List[str]:
    """PNG plots per group: BLEU against encoder depth per technique (where the group varies
    depth), valid loss over updates and over seconds of training, and r_t over updates (runs with
    --log-grad-norm-ratio)."""
    from .diagnostics.plot_training import _pyplot, read_run, series_styles

    plt = _pyplot()
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for gname, group in results["groups"].items():
        rows = group["systems"]
        by_technique: Dict[str, List[Tuple[int, float, float]]] = {}
        for row in rows.values():
            if row["depth"] is not None and row["bleu_mean"] is not None:
                by_technique.setdefault(row["technique"] or row["name"], []).append(
                    (row["depth"], row["bleu_mean"], row["bleu_std"] or 0.0))
        if len({d for v in by_technique.values() for d, _, _ in v}) > 1:
            fig, ax = plt.subplots(figsize=(6, 4))
            for (technique, points), style in zip(by_technique.items(), series_styles(len(by_technique))):
                points.sort()
                ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points],
                            label=technique, marker="o", capsize=3, **style)
            ax.set_xticks(sorted({d for v in by_technique.values() for d, _, _ in v}))
            ax.set_xlabel("encoder layers")
            ax.set_ylabel("BLEU (test)")
            ax.set_title(f"{gname}: BLEU against encoder depth", fontsize=9)
            ax.legend(fontsize=8)
            _save(plt, fig, os.path.join(out_dir, f"bleu_depth_{gname}.png"), written)
        series = {}
        for run in study.runs:
            if run.system.group == gname and run.seed == min(r.seed for r in study.runs if r.system is run.system):
                log = os.path.join(run.run_dir, "train.log")
                if os.path.exists(log):
                    series[run.system.name] = read_run(log)
        for metric, ylabel, name in (("valid_loss", "valid loss", "valid_loss"),
                                     ("gnorm_ratio", "r_t = |dL/dh_1| / |dL/dh_N|", "grad_norm_ratio")):
            have = {k: v[metric] for k, v in series.items() if v.get(metric)}
            if not have:
                continue
            fig, ax = plt.subplots(figsize=(6, 4))
            for (label, values), style in zip(have.items(), series_styles(len(have))):
                ax.plot([x for x, _ in values], [y for _, y in values], label=label,
                        marker="o" if metric == "valid_loss" else None, markersize=3, **style)
            ax.set_xlabel("update")
            ax.set_ylabel(ylabel)
            if metric == "gnorm_ratio":
                ax.set_yscale("log")
            ax.set_title(f"{gname}: {ylabel} (seed {min(r.seed for r in study.runs)})", fontsize=9)
            ax.legend(fontsize=7, ncol=2 if len(have) > 8 else 1)
            _save(plt, fig, os.path.join(out_dir, f"{name}_{gname}.png"), written)
        # the same learning curves against training time: cost and learning apart
        timed = {}
        for label, s in series.items():
            curve = learning_curve(s)[0]
            if curve and all(t is not None for _, t, _ in curve):
                timed[label] = curve
        if timed:
            fig, ax = plt.subplots(figsize=(6, 4))
            for (label, curve), style in zip(timed.items(), series_styles(len(timed))):
                ax.plot([t for _, t, _ in curve], [v for _, _, v in curve], label=label, marker="o",
                        markersize=3, **style)
            ax.set_xlabel("seconds of training (fairseq's wall clock, validation included)")
            ax.set_ylabel("valid loss")
            ax.set_title(f"{gname}: valid loss against time (seed {min(r.seed for r in study.runs)})", fontsize=9)
            ax.legend(fontsize=7, ncol=2 if len(timed) > 8 else 1)
            _save(plt, fig, os.path.join(out_dir, f"valid_loss_seconds_{gname}.png"), written)
    return written


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------

def get_parser():
    p = ArgumentParser(
        prog="fairseq-deep-study",
        description="Train, translate and score the papers' systems (or your own) with fairseq, and "
                    "write results.json, results.md and plots.  See docs/study.md.")
    p.add_argument("--data", required=True, help="binarized data folder (fairseq-preprocess / "
                   "fairseq-deep-prepare's data-bin) with train, valid and test")
    p.add_argument("--out", required=True, help="output folder (runs/, results.json, results.md, plots/)")
    detok = p.add_mutually_exclusive_group()
    detok.add_argument("--spm", metavar="MODEL", help="the sentencepiece model of the data: scores text "
                       "after --post-process sentencepiece")
    detok.add_argument("--remove-bpe", metavar="KIND", help="fairseq-generate --post-process KIND "
                       "(subword_nmt, sentencepiece, ...); default: the text as binarized")
    p.add_argument("--group", action="append", default=[], metavar="NAME[:SYS,...]",
                   help=f"a built-in group ({', '.join(GROUPS)}), or some of its systems; repeatable")
    p.add_argument("--system", action="append", default=[], metavar="'NAME=ARCH [FLAGS...]'",
                   help="a system of your own (split with shlex; FLAGS go to fairseq-train as they are); "
                        "repeatable")
    p.add_argument("--baseline", help="the baseline of the --system systems (default: the first)")
    p.add_argument("--depths", help="comma-separated encoder depths for wang and bapna, and depths N "
                   "(N encoder + N decoder layers) for depth (e.g. 6,20)")
    p.add_argument("--max-update", type=int, default=0, help="updates per system (fairseq --max-update)")
    p.add_argument("--minutes", type=float, default=0, help="training minutes per system "
                   "(fairseq --stop-time-hours)")
    p.add_argument("--seeds", type=int, default=1, help="seeds 1..K per system")
    p.add_argument("--jobs", type=int, default=1, help="systems trained at a time")
    p.add_argument("--cpu", action="store_true", help="fairseq-train/generate --cpu")
    p.add_argument("--width", type=int, help="model width for every system (Transformers: embed W, FFN 4W, "
                   "max(2, W/64) heads; RNMT+: cells W; Deep-Att: embed W/2, cells W); default: the presets'")
    p.add_argument("--recipe", choices=["paper", "shared"], default="paper",
                   help="optimiser and LR schedule: 'paper' (default) gives RNMT+ Chen et al.'s Adam and Eq. 1 "
                        "(peak 3.2 x --lr, the paper's RNMT+/Transformer ratio, over --warmup updates), every other "
                        "system (Deep-Att included: its paper's fixed 4e-5 does not train in a study's budget) the "
                        "shared recipe; 'shared': Adam (0.9, 0.98), inverse_sqrt warm-up to --lr for every system")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=1000, help="inverse_sqrt warm-up updates")
    p.add_argument("--dropout", type=float, help="default: each preset's own")
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--valid-interval", type=int, help="updates between validations and saved checkpoints "
                   "(default: max-update/10, or 500)")
    p.add_argument("--log-interval", type=int, default=50)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--gen-batch-size", type=int, default=128)
    p.add_argument("--checkpoint", choices=["best", "last"], default="best", help="which checkpoint to decode")
    p.add_argument("--ref", help="raw reference text of the test set (plain or .gz), one line per sentence; "
                   "default: fairseq-generate's T- lines, post-processed like the hypotheses")
    p.add_argument("--train-args", default="", help="more fairseq-train flags for every system "
                   "(one string, split with shlex), e.g. \"--fp16 --clip-norm 1\"")
    p.add_argument("--gen-args", default="", help="more fairseq-generate flags (one string)")
    p.add_argument("--bootstrap-samples", type=int, default=1000)
    p.add_argument("--progress-every", type=float, default=60, help="seconds between progress lines")
    p.add_argument("--dry-run", action="store_true", help="print the fairseq-train commands and stop")
    return p


def select_groups(args) -> Dict[str, Tuple[str, List[System]]]:
    depths = [int(d) for d in args.depths.split(",")] if args.depths else None
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
            raise UserError(f"--baseline {baseline}: not one of the --system names {', '.join(names)}")
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
            model_kind(s.arch)  # unknown --arch: stop before anything runs
    return groups


def main(argv=None) -> int:
    args = get_parser().parse_args(argv)
    if not args.max_update and not args.minutes:
        raise UserError("give a budget: --max-update N and/or --minutes M")
    if args.jobs < 1 or args.seeds < 1:
        raise UserError("--jobs and --seeds must be at least 1")
    args.train_args_list = shlex.split(args.train_args)
    args.gen_args_list = shlex.split(args.gen_args)
    if args.max_update:
        args.log_interval = max(1, min(args.log_interval, args.max_update))
    groups = select_groups(args)
    if args.dry_run:
        for _, systems in groups.values():
            for s in systems:
                print(s.key, " ".join(shlex.quote(c) for c in train_command(
                    args, s, 1, os.path.join(args.out, "runs", s.group, s.name, "seed1"))[1:]))
        return 0
    os.makedirs(args.out, exist_ok=True)
    study = Study(args, groups)
    logger.info("%d systems x %d seeds = %d runs, %d at a time, under %s", len(study.runs) // args.seeds,
                args.seeds, len(study.runs), args.jobs, args.out)
    study.run()
    results = study.results()
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(markdown(results))
    results_plots = plot(study, results, os.path.join(args.out, "plots"))
    logger.info("wrote %s, %s and %d plots", os.path.join(args.out, "results.json"),
                os.path.join(args.out, "results.md"), len(results_plots))
    print(markdown(results))
    failed = [r.label for r in study.runs if r.status != "done"]
    if failed:
        logger.warning("%d run(s) failed: %s (logs under %s/runs)", len(failed), ", ".join(failed), args.out)
    return 1 if failed else 0


def cli_main():
    from .cli import quiet_warnings

    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stderr, force=True)
    quiet_warnings()

    def terminated(signum, frame):  # SIGTERM as Ctrl-C: the running fairseq processes end too
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminated)
    try:
        code = report_user_errors(main, "fairseq-deep-study")
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    cli_main()
