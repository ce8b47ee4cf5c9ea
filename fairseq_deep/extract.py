"""Extract a GPKD student from a teacher: ``fairseq-deep-extract`` (Li et al. 2021, Sec. 3).

    fairseq-deep-extract TEACHER.pt --out STUDENT.pt [--layer-of-group first|last|K]
        [--encoder-groups N] [--decoder-groups M]

(also ``python -m fairseq_deep.extract``).  The teacher's stacks are in groups of consecutive
layers (the groups it was trained with, ``--gpkd-encoder-groups``/``--gpkd-decoder-groups``, or
the ones given here); the student is a checkpoint of the same family with one layer per group
(the first, the last or the K-th, 0-based, of each group), the teacher's embeddings, final layer
norms and output projection copied, and a stack without groups copied whole.  The student computes
exactly what the teacher computes with the chosen layers only (``tests/test_gpkd.py``):

* a residual stack (pre-norm Transformer): the chosen layers, in order;
* DLCL (Wang et al. 2019): the layers read, and the readout forms, the teacher's rows restricted to
  the chosen layers' entries: student row g is the teacher's row of the g-th chosen layer (the
  readout the teacher's readout), over the columns of the embedding and of the chosen layers
  below it; the layer norms follow their entry (pre-norm) or row (post-norm).  With softmax rows
  the logits are restricted, so each student row is the softmax over the entries it keeps (the
  teacher's own rows are never renormalised by a restriction: there is no other teacher "without
  the other layers");
* Skipping Sub-Layer: the chosen layers' inference scales 1 - p (at the teacher's depth) are
  folded into the output projection and fc2 of each sub-layer, ``(1 - p)(W x + b)``, and the
  student has no skipping (its own schedule would be another function).

The student is saved with group permutation and skipping off, its depths the numbers of groups,
under the teacher's ``--arch`` when that preset takes the student's depths, else its depth-free
preset (``transformer_prenorm_30l`` -> ``transformer_prenorm``), so that ``fairseq-generate``
decodes it, ``fairseq-deep-train --model-from STUDENT.pt --restore-file STUDENT.pt
--reset-optimizer ...`` fine-tunes it (the paper fine-tunes the student on the teacher's
translations: ``fairseq-deep-distill``), and ``fairseq-deep-export`` serves it when its family
reduces to fairseq's Transformer (a pre-norm student does; a DLCL one does not).

Refused in one line, writing nothing: a family where GPKD is not defined (only
``transformer_dlcl``'s models are: the pre-norm Transformer and DLCL), a history other than the
residual one and DLCL (the stream-level schemes), groups that do not divide a stack, a teacher
without groups and none given.  Models and options are read as ``fairseq-deep-grow`` reads them
(the package's checkpoint loader, the family's depth options); this module stands a floor below
grow (docs/design.md, "Floors"), so it builds its models on its own few lines.
"""

import copy
import os
import sys
from typing import Dict, List, Optional, Tuple

from .checkpoints import family_of, load, model_args, of_another_model
from .errors import ArgumentParser, UserError, report_user_errors
from .quiet import quiet_warnings, script_logging

WHICH = ("first", "last")


def fairseqs_own(family: str) -> str:
    """What to do with a model of fairseq's own."""
    return (
        f"train the teacher with --arch transformer_prenorm or transformer_dlcl and "
        f"--gpkd-encoder-groups (fairseq's {family} has no group permutation)"
    )


def chosen_layers(depth: int, groups: int, which: str, side: str) -> List[int]:
    """The teacher's layer kept for each group (0-based, bottom first); all layers when ``groups``
    is 0 (a stack copied whole)."""
    if groups == 0:
        return list(range(depth))
    if groups < 0 or depth % groups:
        raise UserError(
            f"the {side}'s {depth} layers do not divide into {groups} groups of equal size: "
            f"give --{side}-groups a divisor of {depth}"
        )
    size = depth // groups
    if which in WHICH:
        k = 0 if which == "first" else size - 1
    else:
        k = int(which)
        if not 0 <= k < size:
            raise UserError(
                f"--layer-of-group {which}: the {side}'s groups have {size} layers (0 to {size - 1})"
            )
    return [g * size + k for g in range(groups)]


class _Task:
    """What a model's build_model reads of its task: the dictionaries, by their sizes."""

    def __init__(self, state_dict, args):
        from fairseq.data import Dictionary

        def dictionary(size):
            d = Dictionary()
            while len(d) < size:
                d.add_symbol(f"w{len(d)}")
            return d

        src = state_dict["encoder.embed_tokens.weight"].shape[0]
        tgt = state_dict["decoder.embed_tokens.weight"].shape[0]
        self.source_dictionary = dictionary(src)
        shared = bool(args.share_all_embeddings) and src == tgt
        self.target_dictionary = self.source_dictionary if shared else dictionary(tgt)


def _build(args, task):
    import torch
    from fairseq import models

    torch.manual_seed(1)  # every tensor is then overwritten
    return models.build_model(args, task).eval()


def student_arch(arch: str, family: str, args) -> str:
    """The teacher's ``arch`` when its preset takes the student's depths, else its depth-free
    preset, else the family."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY

    from .models.presets import depth_free

    for name in (arch, depth_free(arch), family):
        if ARCH_MODEL_NAME_REGISTRY.get(name) != family:
            continue
        try:
            ARCH_CONFIG_REGISTRY[name](copy.deepcopy(args))
        except (ValueError, UserError):
            continue
        return name
    raise UserError(f"no architecture of {family} takes the student's depths (--arch {arch})")


def _history_maps(history, chosen: List[int], depth: int) -> Optional[Tuple[List[int], List[int]]]:
    """(rows, columns): the teacher's row and column of each of the student's DLCL rows and
    columns; None for the residual history (no tensors)."""
    from torch import nn

    from .modules.histories.layer_history import DynamicLinearCombination, LayerHistory

    if type(history) is LayerHistory:
        return None
    if type(history) is not DynamicLinearCombination:
        raise UserError(
            f"GPKD extraction keeps the residual history and DLCL; this model's history is "
            f"{type(history).__name__} (a stream-level scheme), which declares no restriction"
        )
    if not history.normalize_before and chosen and chosen[0] != 0:
        if isinstance(history.norms[0], nn.Identity):  # Eq. 9: row 0 without LN
            raise UserError(
                f"post-norm DLCL forms the input of its first layer without a layer norm (Wang et "
                f"al. Eq. 9), but the student's first layer would be the teacher's layer "
                f"{chosen[0] + 1}, whose row has one: use --layer-of-group first"
            )
    return [*chosen, depth], [0, *(j + 1 for j in chosen)]


def student_state(teacher, student, chosen: Dict[str, List[int]]) -> Dict:
    """The student's state dict: each student layer the teacher's chosen layer (its skipped
    sub-layers' inference scales folded into their output projections), DLCL restricted
    (module docstring), every other tensor the teacher's own."""
    from .modules.schemes.gpkd import inference_scales

    old = teacher.state_dict()
    new = {}
    for key in student.state_dict():
        source = key
        for side, layers in chosen.items():
            prefix = f"{side}.layers."
            if key.startswith(prefix):
                index, rest = key[len(prefix) :].split(".", 1)
                source = f"{prefix}{layers[int(index)]}.{rest}"
        new[key] = old[source].clone()
    for side, layers in chosen.items():
        history = getattr(teacher, side).history
        maps = _history_maps(history, layers, len(getattr(teacher, side).layers))
        if maps is not None:
            rows, cols = maps
            key = f"{side}.history."
            new[key + "weight"] = old[key + "weight"][rows][:, cols].clone()
            by_unit = cols if history.normalize_before else rows  # norms of entries or of rows
            for name in list(new):
                if name.startswith(key + "norms."):
                    index, rest = name[len(key + "norms.") :].split(".", 1)
                    new[name] = old[f"{key}norms.{by_unit[int(index)]}.{rest}"].clone()
        for g, j in enumerate(layers):
            for linear, scale in inference_scales(getattr(teacher, side).layers[j]):
                for p in ("weight", "bias"):
                    name = f"{side}.layers.{g}.{linear}.{p}"
                    if name in new:
                        new[name] = (new[name].double() * scale).to(new[name].dtype)
    for key, target in student.state_dict().items():
        if new[key].shape != target.shape:
            raise RuntimeError(
                f"fairseq-deep-extract: {key} is {tuple(new[key].shape)}, not {tuple(target.shape)}"
            )
    return new


def extract(
    teacher_path: str,
    out: str,
    layer_of_group: str = "first",
    encoder_groups: Optional[int] = None,
    decoder_groups: Optional[int] = None,
) -> Dict:
    """Write the student of ``teacher_path`` to ``out``; returns a summary (arch, depths, the
    teacher layers kept)."""
    import torch.nn as nn
    from fairseq import checkpoint_utils
    from fairseq.models import MODEL_REGISTRY

    from .modules.schemes.gpkd import GPKDConfig

    if layer_of_group not in WHICH and not layer_of_group.isdigit():
        raise UserError(
            f"--layer-of-group {layer_of_group}: give first, last or an index (0, 1, ...)"
        )
    state = load(teacher_path, "TEACHER")
    args = model_args(state, teacher_path, "TEACHER")
    arch, family = family_of(
        args, teacher_path, "fairseq-deep-extract extracts from", fairseqs_own, UserError, "TEACHER"
    )
    if not getattr(MODEL_REGISTRY[family], "gpkd_defined", False):
        raise UserError(
            f"GPKD (Li et al. 2021) is defined for the pre-norm Transformer and DLCL "
            f"(transformer_dlcl, transformer_prenorm, ...), not for {family} (--arch {arch})"
        )
    opts = GPKDConfig.from_namespace(args)
    given = {"encoder": encoder_groups, "decoder": decoder_groups}
    trained = {"encoder": opts.gpkd_encoder_groups, "decoder": opts.gpkd_decoder_groups}
    groups = {s: trained[s] if given[s] is None else int(given[s]) for s in given}
    if not any(groups.values()):
        raise UserError(
            f"{teacher_path} was trained without group permutation (--gpkd-encoder-groups 0, "
            "--gpkd-decoder-groups 0): give --encoder-groups and/or --decoder-groups"
        )
    depths = {s: int(getattr(args, f"{s}_layers")) for s in groups}
    chosen = {s: chosen_layers(depths[s], groups[s], layer_of_group, s) for s in groups}

    task = _Task(state["model"], args)
    teacher = _build(args, task)
    sd = dict(state["model"])
    teacher.upgrade_state_dict(sd)
    nn.Module.load_state_dict(teacher, sd, strict=True)
    for side in groups:  # a stream-level history is refused before anything is built
        _history_maps(getattr(teacher, side).history, chosen[side], depths[side])

    new_args = copy.deepcopy(args)
    for side in groups:
        setattr(new_args, f"{side}_layers", len(chosen[side]))
        setattr(new_args, f"gpkd_{side}_groups", 0)
    new_args.skip_sublayer_rate = 0.0
    new_arch = student_arch(arch, family, new_args)
    new_args.arch = new_arch
    if hasattr(new_args, "_name"):
        new_args._name = new_arch
    student = _build(new_args, task)
    student.load_state_dict(student_state(teacher, student, chosen), strict=True)

    out_state = of_another_model(state, student.state_dict(), new_args)
    extra = out_state["extra_state"]
    summary = {
        "from": os.path.abspath(teacher_path),
        "arch": arch,
        "student_arch": new_arch,
        "layer_of_group": layer_of_group,
        "encoder_layers": [depths["encoder"], len(chosen["encoder"])],
        "decoder_layers": [depths["decoder"], len(chosen["decoder"])],
        "kept": {s: chosen[s] for s in chosen},
    }
    extra["extracted"] = summary
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    checkpoint_utils.torch_persistent_save(out_state, out)
    return summary


def cli_main(argv=None):
    parser = ArgumentParser(
        prog="fairseq-deep-extract",
        description="Extract a GPKD student (Li et al. 2021): one layer of each group of a teacher "
        "trained with --gpkd-encoder-groups/--gpkd-decoder-groups, as a checkpoint of the same "
        "family that fairseq-generate decodes (docs/distill.md).",
    )
    parser.add_argument("teacher", metavar="TEACHER.pt", help="the teacher's checkpoint")
    parser.add_argument("--out", required=True, metavar="STUDENT.pt", help="the student to write")
    parser.add_argument(
        "--layer-of-group",
        default="first",
        metavar="first|last|K",
        help="the layer kept of each group: its first (default), last, or K-th (0-based)",
    )
    parser.add_argument(
        "--encoder-groups",
        type=int,
        metavar="N",
        help="the encoder's groups (default: the teacher's --gpkd-encoder-groups; 0: all layers)",
    )
    parser.add_argument(
        "--decoder-groups",
        type=int,
        metavar="M",
        help="the decoder's groups (default: the teacher's --gpkd-decoder-groups; 0: all layers)",
    )
    args = parser.parse_args(argv)
    quiet_warnings()
    script_logging(sys.stderr)

    def run():
        summary = extract(
            args.teacher, args.out, args.layer_of_group, args.encoder_groups, args.decoder_groups
        )
        kept = "; ".join(
            f"{s} layers {', '.join(str(j + 1) for j in summary['kept'][s])} of {summary[s + '_layers'][0]}"
            for s in ("encoder", "decoder")
        )
        print(
            f"wrote {args.out}: --arch {summary['student_arch']}, "
            f"{summary['encoder_layers'][1]}+{summary['decoder_layers'][1]} layers ({kept})"
        )

    report_user_errors(run, parser.prog)


if __name__ == "__main__":
    cli_main()
