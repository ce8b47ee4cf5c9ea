"""Grow a trained model deeper: ``fairseq-deep-grow`` (shallow-to-deep training).

    fairseq-deep-grow --checkpoint IN.pt --out OUT.pt --encoder-layers N [--decoder-layers M]
        [--method stack|interleave|identity] [--deepnorm-constants new|keep] [--seed S]

(also ``python -m fairseq_deep.grow``).  Reads a checkpoint of any family of fairseq_deep and writes
one of the same family at depth N (and M), with the grown options in its saved configuration, so
that ``fairseq-generate`` decodes it without extra flags and ``fairseq-deep-train --model-from
OUT.pt --restore-file OUT.pt --reset-optimizer --reset-lr-scheduler --reset-dataloader`` continues
training it (the script prints that command, and the same with every model option of OUT.pt
written out).  Two published methods:

* Li et al. (EMNLP 2020), *Shallow-to-Deep Training for NMT*: train a shallow encoder, stack copies
  of its top layers on it, continue training (with a learning-rate restart), repeat: ``--method
  stack`` (new layer L + t copies old layer L - k + (t mod k), k = min(N - L, L));
* Wu et al. (ACL 2019), *Depth Growing for NMT*: new layers on top of a trained shallow model,
  trained with the bottom frozen first (``--freeze-grown-from`` of ``--task translation_deep``).

``--method interleave`` repeats each layer in place (new layer j copies old layer floor(j L / N));
``--method identity`` adds layers on top so that the grown model computes what the shallow one did,
where the parts allow it (see :func:`identity_plan`).

How it works: the grown model is built from the grown options through fairseq's ``build_model``
(so every depth-dependent module has the shape the family gives it), then every parameter and
buffer of it is either copied from its place in the shallow model or deliberately initialised, and
:func:`grow_state` checks that none was left out.  What each part needs is declared beside its
class (:mod:`fairseq_deep.modules.common.growth`; docs/grow.md, "Adding a growth rule") and applied here:
the family names its depth options, each stack where its layers are, each layer what a copy must
share with its source, each history or readout how its tensors grow:

* layers: copied by the method's map; a copy must have the same role (class, parameter shapes,
  and what the layer and its stack declare: the direction of a Deep-Att layer, the residual
  connection of an RNMT+ layer, the number of lower layers of multi-layer attention): otherwise
  the nearest old layer with that role is taken (modules/common/growth.py);
* DLCL (Wang et al. 2019) weights W, (U+1) x (U+1) over units (the embedding and layer outputs of a
  Transformer stack; the layer outputs of an RNMT+ stack): rows of kept layers keep their old
  weights, new rows take the model's ``--dlcl-init`` (by default the paper's average 1/(r+1));
  the layer norms of the units follow the unit map (modules/histories/layer_history.py);
* transparent attention (Bapna et al. 2018) logits, (N+1) x M: entry u takes the logit of its
  source entry minus log(number of its copies), column j that of decoder layer j's source, so each
  old entry keeps its share of every mixture (exactly, when the copies are equal)
  (modules/histories/transparent_attention.py);
* layer aggregation (Dou et al. 2018): linear-combination matrices W_l of copies are shared out
  like the transparent weights (W / copies); iterative and hierarchical nodes are copied from the
  node that merged the source layers where the shapes agree, otherwise initialised
  (modules/histories/layer_aggregation.py);
* DeepNorm (Wang et al. 2022): alpha and beta are functions of N and M.  By default
  (``--deepnorm-constants new``) the grown model uses the new depth's constants: every layer,
  copied or not, then computes LN(alpha' x + G(x)) with the new alpha', a different function;
  ``keep`` writes the old constants into ``--deepnorm-alpha/--deepnorm-beta`` instead
  (modules/schemes/residual_schemes.py);
* Admin (Liu et al. 2020): omegas (the profile, a buffer, and the learned part) travel with their
  layer (profiled: not profiled again);
* ReZero (Bachlechner et al. 2020): alphas travel with their layer; ``--method identity`` sets the
  new layers' alpha to 0, which makes them the identity.

The optimizer state is dropped (its shapes are the shallow model's).  The shallow run's training
time is reset to 0, so that the next run's ``--stop-time-hours`` is its own (fairseq counts the
time a checkpoint brings); ``--keep-training-time`` keeps it, for comparisons in equal time
(``fairseq-deep-study --group li``: the stages share one budget).
"""

import copy
import logging
import os
import sys
from typing import Dict, List, Optional, Tuple

from .checkpoints import family_of, load, model_args, of_another_model
from .errors import ArgumentParser, UserError, report_user_errors
from .grow_report import report
from .modules.common.growth import (
    LAYERS,
    READOUT,
    GrowError,
    GrownState,
    GrowRequest,
    StackGrowth,
    layer_rule,
    stack_layers,
)
from .quiet import quiet_warnings, script_logging

logger = logging.getLogger("fairseq_deep.grow")

METHODS = ("stack", "interleave", "identity")


# ---------------------------------------------------------------------------------------------
# the model: loading, options, building
# ---------------------------------------------------------------------------------------------


def fairseqs_own(family: str) -> str:
    """What to do with a model of fairseq's own (``family``, fairseq's model name): train the
    shallow model with the presets of ours nearest to it (``stands_for`` of the families'
    declarations)."""
    from .models import families

    nearest = families.nearest_to(family)
    return "train the shallow model with a fairseq_deep architecture" + (
        f" (e.g. --arch {' or '.join(nearest)}, nearest to fairseq's {family})"
        if nearest
        else " (fairseq-deep-list-archs)"
    )


def depth_options(family: str, args) -> Tuple[str, str]:
    """The options that hold the encoder and decoder depth of a family, as its declaration states
    them (``grows``, ``depth_options``: :meth:`fairseq_deep.models.families.Family.depth_names`); a
    family that is not declared, or not to grow, is refused."""
    from fairseq.models import MODEL_REGISTRY

    from .models import families

    declared = families.get(family)
    if declared is None or not declared.grows:
        raise GrowError(
            f"the family {family} ({MODEL_REGISTRY[family].__name__}) declares no growth rule: "
            "fairseq-deep-grow grows the families that declare one (docs/grow.md, adding a growth rule)"
        )
    return declared.depth_names(args)


def grown_arch(arch: str, family: str, args) -> str:
    """The architecture the grown model is saved under: ``arch`` when its preset accepts the grown
    depths, else the nearest depth-free preset of the family (``transformer_dlcl_30l`` ->
    ``transformer_dlcl``, ``rnmt_plus_512_ta_12l`` -> ``rnmt_plus_512``), else the family."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY

    parts = arch.split("_")
    candidates = ["_".join(parts[:i]) for i in range(len(parts), 0, -1)] + [family]
    for name in candidates:
        if ARCH_MODEL_NAME_REGISTRY.get(name) != family:
            continue
        try:
            ARCH_CONFIG_REGISTRY[name](copy.deepcopy(args))
        except (ValueError, UserError):
            continue
        return name
    raise GrowError(f"no architecture of {family} takes the grown depths of --arch {arch}")


def _dictionary(size: int):
    from fairseq.data import Dictionary

    d = Dictionary()
    while len(d) < size:
        d.add_symbol(f"w{len(d)}")
    return d


class _Task:
    """What a model's build_model reads of its task: the dictionaries (sizes from the checkpoint)."""

    def __init__(self, state_dict, args):
        def rows(side):
            keys = [
                k
                for k in state_dict
                if k.startswith(side + ".") and k.endswith("embed_tokens.weight")
            ]
            if not keys:
                raise GrowError(
                    f"the checkpoint has no {side} token embedding: not a model fairseq-deep-grow knows"
                )
            return state_dict[keys[0]].shape[0]

        src, tgt = rows("encoder"), rows("decoder")
        self.source_dictionary = _dictionary(src)
        shared = getattr(args, "share_all_embeddings", False) and src == tgt
        self.target_dictionary = self.source_dictionary if shared else _dictionary(tgt)


def build(args, task, seed: int = 1):
    import torch
    from fairseq import models

    torch.manual_seed(seed)
    return models.build_model(args, task).eval()


# ---------------------------------------------------------------------------------------------
# --method identity: what the parts of a stack declare
# ---------------------------------------------------------------------------------------------


def identity_plan(stack: StackGrowth) -> Dict[str, List[str]]:
    """{key prefix of a new layer: its parameters set to 0} that make the grown ``stack`` compute
    what the shallow one did, from the declarations of its parts and layers: empty when a part's
    readout gives the new layers weight 0 (DLCL with plain weights, linear combination: exact
    whatever the layers are); otherwise every new layer must be the identity itself (ReZero: alpha
    0; pre-norm Transformer layers: the output projections of every sublayer 0, x + 0 + 0).  A
    part or layer that cannot hold says why, and the stack is refused in one line."""
    modes = [rule.identity(part) for _, part, rule in stack.parts]
    why = next((m for m in modes if m not in (READOUT, LAYERS)), None)
    if why is None and READOUT in modes:
        if LAYERS not in modes:
            return {}
        why = "a readout that gives the new layers weight 0 beside a part that reads them"
    zeros: Dict[str, List[str]] = {}
    for prefix in sorted(stack.maps):
        for j in range(stack.old_depth, stack.new_depth):
            if why is not None:
                break
            layer = stack.new_layers[prefix][j]
            names = layer_rule(layer).identity(layer)
            if isinstance(names, str):
                why = names
            else:
                zeros[f"{prefix}.{j}."] = list(names)
    if why is not None:
        raise GrowError(
            f"--method identity: the {stack.name} of this model cannot start with new layers that change "
            f"nothing: {why}. Use --method stack (or interleave); the identity holds for ReZero, "
            f"pre-norm Transformer layers and DLCL/linear-combination stacks"
        )
    return zeros


# ---------------------------------------------------------------------------------------------
# the state of the grown model
# ---------------------------------------------------------------------------------------------


def grow_state(
    old_model,
    new_model,
    stacks: Dict[str, StackGrowth],
    identity: Optional[Dict[str, Dict[str, List[str]]]] = None,
) -> Tuple[Dict, Dict[str, str]]:
    """The grown model's state dict and, for every key, where it came from: each layer's tensors
    from its source by the layer map, each part's by its declared rule, the rest as it is;
    ``identity``: the stacks' :func:`identity_plan` (``--method identity``)."""
    import torch

    grown = GrownState(
        old_model.state_dict(), {k: v.clone() for k, v in new_model.state_dict().items()}, stacks
    )
    for stack in stacks.values():
        for prefix, mapping in stack.maps.items():  # the layers: the layer map
            for key, j, rest in grown.indexed(prefix + "."):
                src = mapping[j]
                if src is None or not grown.copy(key, f"{prefix}.{src}.{rest}"):
                    grown.origin[key] = "initialised: no old layer of this layer's role"
        for prefix, part, rule in stack.parts:  # histories, transparent attention: their rules
            rule.grow(part, prefix, stack, grown)
    for key in grown.new:
        if key not in grown.origin and not grown.copy(key, key):
            shapes = (
                tuple(grown.new[key].shape),
                tuple(grown.old[key].shape) if key in grown.old else "none",
            )
            raise RuntimeError(
                f"fairseq-deep-grow: {key} of the grown model has no counterpart "
                f"({shapes[0]} vs {shapes[1]}): a depth-dependent parameter without a rule"
            )
    for zeros in (identity or {}).values():
        for base, names in zeros.items():
            for key in (base + name for name in names):
                if key in grown.new:
                    grown.set(key, torch.zeros_like(grown.new[key]), "zeros: --method identity")
    missing = [k for k in grown.new if k not in grown.origin]
    if missing:
        raise RuntimeError(f"fairseq-deep-grow left {missing[:5]} without a source")
    return grown.new, grown.origin


def depth_option_notes(args, new_args, old_model, request: GrowRequest) -> List[str]:
    """The options of the grown model that depend on the depth, as the layers of ``old_model``
    declare them (DeepNorm's constants), set in ``new_args``; returns the notes for the user."""
    rules = []
    for side in ("encoder", "decoder"):
        for layers in stack_layers(side, getattr(old_model, side)).values():
            for layer in layers:
                options = layer_rule(layer).options
                if options is not None and options not in rules:
                    rules.append(options)
    return [note for options in rules for note in options(args, new_args, request)]


# ---------------------------------------------------------------------------------------------
# the whole operation
# ---------------------------------------------------------------------------------------------


def grow(
    checkpoint: str,
    out: str,
    encoder_layers: Optional[int] = None,
    decoder_layers: Optional[int] = None,
    method: str = "stack",
    deepnorm_constants: str = "new",
    seed: int = 1,
    keep_training_time: bool = False,
) -> Dict:
    """Grow ``checkpoint`` into ``out``; returns a summary (arch, depths, counts of copied and
    initialised entries, the shallow run's training time and whether it was kept)."""
    import torch.nn as nn
    from fairseq import checkpoint_utils

    if method not in METHODS:
        raise GrowError(f"--method {method}: choose one of {', '.join(METHODS)}")
    state = load(checkpoint, "--checkpoint")
    args = model_args(state, checkpoint, "--checkpoint")
    arch, family = family_of(
        args, checkpoint, "fairseq-deep-grow grows", fairseqs_own, GrowError, "--checkpoint"
    )
    enc_opt, dec_opt = depth_options(family, args)
    old_depths = {"encoder": int(getattr(args, enc_opt)), "decoder": int(getattr(args, dec_opt))}
    wanted = {"encoder": encoder_layers, "decoder": decoder_layers}
    new_depths = {s: old_depths[s] if wanted[s] is None else int(wanted[s]) for s in old_depths}
    for s, opt in (("encoder", enc_opt), ("decoder", dec_opt)):
        if new_depths[s] < old_depths[s]:
            raise GrowError(
                f"--{s}-layers {new_depths[s]} is smaller than the checkpoint's {old_depths[s]} "
                f"{s} layers (--{opt.replace('_', '-')} {old_depths[s]}): fairseq-deep-grow only adds "
                "layers"
            )

    task = _Task(state["model"], args)
    old_model = build(args, task, seed)
    sd = dict(state["model"])
    old_model.upgrade_state_dict(sd)
    nn.Module.load_state_dict(old_model, sd, strict=True)

    new_args = copy.deepcopy(args)
    setattr(new_args, enc_opt, new_depths["encoder"])
    setattr(new_args, dec_opt, new_depths["decoder"])
    request = GrowRequest(method, old_depths, new_depths, deepnorm_constants)
    notes = depth_option_notes(args, new_args, old_model, request)
    new_arch = grown_arch(arch, family, new_args)
    new_args.arch = new_arch
    if hasattr(new_args, "_name"):
        new_args._name = new_arch

    new_model = build(new_args, task, seed)
    stacks = {
        s: StackGrowth(
            s, getattr(old_model, s), getattr(new_model, s), method, old_depths[s], new_depths[s]
        )
        for s in ("encoder", "decoder")
    }
    identity = {
        s: identity_plan(stack)
        for s, stack in stacks.items()
        if method == "identity" and stack.grows
    }
    new_sd, origin = grow_state(old_model, new_model, stacks, identity)
    new_model.load_state_dict(new_sd, strict=True)  # the grown state fits the grown model exactly

    trained_s = float((state.get("extra_state") or {}).get("previous_training_time") or 0.0)
    out_state = of_another_model(state, new_model.state_dict(), new_args)
    extra, cfg = out_state["extra_state"], out_state.get("cfg")
    if keep_training_time:
        extra["previous_training_time"] = trained_s
    summary = {
        "from": os.path.abspath(checkpoint),
        "method": method,
        "arch": arch,
        "grown_arch": new_arch,
        "encoder_layers": [old_depths["encoder"], new_depths["encoder"]],
        "decoder_layers": [old_depths["decoder"], new_depths["decoder"]],
        "copied": sum(1 for v in origin.values() if v.startswith("copied")),
        "set": sum(1 for v in origin.values() if not v.startswith("copied")),
        "notes": notes,
        "training_time": trained_s,
        "training_time_kept": keep_training_time,
    }
    extra["grown"] = list(extra.get("grown", [])) + [summary]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    checkpoint_utils.torch_persistent_save(out_state, out)
    summary.update(
        origin=origin,
        depth_options=(enc_opt, dec_opt),
        model_options=new_args,
        cfg=cfg,
        data=(cfg.get("task") or {}).get("data")
        if isinstance(cfg, dict)
        else getattr(args, "data", None),
    )
    return summary


def cli_main(argv=None):
    parser = ArgumentParser(
        prog="fairseq-deep-grow",
        description="Grow a trained fairseq_deep model to more layers (Li et al. 2020, shallow-to-deep "
        "training; Wu et al. 2019, depth growing). Continue with fairseq-deep-train DATA --model-from "
        "OUT --restore-file OUT --reset-optimizer --reset-lr-scheduler --reset-dataloader.",
    )
    parser.add_argument(
        "--checkpoint", required=True, metavar="IN.pt", help="the shallow model's checkpoint"
    )
    parser.add_argument(
        "--out", required=True, metavar="OUT.pt", help="where to write the grown checkpoint"
    )
    parser.add_argument(
        "--encoder-layers", type=int, help="encoder depth of the grown model (default: unchanged)"
    )
    parser.add_argument(
        "--decoder-layers", type=int, help="decoder depth of the grown model (default: unchanged)"
    )
    parser.add_argument(
        "--method",
        default="stack",
        choices=METHODS,
        help="stack: copies of the top layers on top (Li et al. 2020, default); interleave: "
        "each layer repeated in place; identity: new layers on top that start as the "
        "identity (ReZero, pre-norm layers, DLCL/linear-combination readouts)",
    )
    parser.add_argument(
        "--deepnorm-constants",
        default="new",
        choices=("new", "keep"),
        help="DeepNorm models: alpha/beta of the new depth (default) or of the checkpoint's",
    )
    parser.add_argument(
        "--keep-training-time",
        action="store_true",
        help="keep the shallow run's training time in OUT, so that the next run's --stop-time-hours "
        "counts it (comparisons in equal time); by default OUT starts at 0",
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of the parameters that are initialised"
    )
    args = parser.parse_args(argv)
    quiet_warnings()
    script_logging(sys.stderr)

    def run():
        if args.encoder_layers is None and args.decoder_layers is None:
            parser.error("give --encoder-layers and/or --decoder-layers")
        summary = grow(
            args.checkpoint,
            args.out,
            args.encoder_layers,
            args.decoder_layers,
            args.method,
            args.deepnorm_constants,
            args.seed,
            args.keep_training_time,
        )
        print(report(summary, args.out))

    report_user_errors(run, parser.prog)


if __name__ == "__main__":
    cli_main()
