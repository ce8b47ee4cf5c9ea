"""A model's options: which are its architecture, the checkpoint's against this run's, and the
command line that rebuilds a checkpoint's model.

Every option a model family adds to fairseq's parser (its ``add_args``: fairseq's Transformer
options and our dataclasses) is an **architecture option** unless it is declared as one that may
change when training goes on: beside the option itself, with ``"architecture": False`` in the
metadata of its dataclass field (dropouts, initialisations, implementations of the same numbers),
and, for fairseq's own options, in :data:`FAIRSEQ_MAY_CHANGE` here.  An option added without a
declaration is compared: a resumed run with another value stops in one line, which is loud,
where the opposite default would be silent.

* :func:`check_same_architecture`: restoring a checkpoint (``--restore-file``, a resumed
  ``--save-dir``, ``--finetune-from-model``) compares every architecture option of this run's
  model with the checkpoint's (:mod:`~fairseq_deep.patches.checkpoint_errors` calls it for the
  models of fairseq_deep), and names each option that differs with both values.  Tensor shapes do not tell a head count,
  pre-/post-norm, an activation or a DLCL setting apart.
* :func:`model_command`: the options of a checkpoint's model as a command line (``--arch`` and
  every model option, literally), for ``fairseq-deep-grow``'s next command and
  ``fairseq-deep-train --model-from CK.pt``.
"""

import argparse
import copy
import dataclasses
import os
import shlex
from typing import Dict, List, Optional, Sequence, Tuple

from .checkpoints import as_namespace, peek, saved_model_options
from .errors import CheckpointError

#: the metadata key of a dataclass field that is not an architecture option (``{"architecture": False}``)
ARCHITECTURE = "architecture"

#: fairseq's own model options that may change when training goes on (fairseq declares its
#: options, so they are declared here): regularisation, activation checkpointing and wrapping,
#: the length bounds (learned positions change a tensor's shape, which is compared anyway), the
#: files of pre-trained embeddings (read only when a model is initialised)
FAIRSEQ_MAY_CHANGE = frozenset(
    {
        "dropout",
        "attention_dropout",
        "activation_dropout",
        "relu_dropout",
        "adaptive_softmax_dropout",
        "encoder_layerdrop",
        "decoder_layerdrop",
        "quant_noise_pq",
        "quant_noise_pq_block_size",
        "quant_noise_scalar",
        "checkpoint_activations",
        "offload_activations",
        "min_params_to_wrap",
        "max_source_positions",
        "max_target_positions",
        "encoder_embed_path",
        "decoder_embed_path",
        "export",
        "base_shuffle",
    }
)

#: options that name a file read when the model is built: not repeated by :func:`model_command`
#: (a restored checkpoint replaces what they load, and the file may be gone)
READS_A_FILE = frozenset(
    {"encoder_embed_path", "decoder_embed_path", "init_from_pretrained", "hybrid_pretrained"}
)


def _ours(cls) -> bool:
    return cls.__module__.split(".")[0] == "fairseq_deep"


def our_fields() -> Dict[str, List[dataclasses.Field]]:
    """``{option: [its fields]}`` of every dataclass of fairseq_deep (an option composed into
    several families, such as ``dlcl_stacks``, has a field in each)."""
    from fairseq.dataclass import FairseqDataclass

    found: Dict[str, List[dataclasses.Field]] = {}
    pending, seen = [FairseqDataclass], set()
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                pending.append(sub)
                if _ours(sub):
                    for f in dataclasses.fields(sub):
                        if f.name in sub.__dict__.get("__annotations__", {}):
                            found.setdefault(f.name, []).append(f)
    return found


def is_architecture(
    option: str, fields: Optional[Dict[str, List[dataclasses.Field]]] = None
) -> bool:
    """Whether ``option`` (a namespace name) is an architecture option (see the module's docstring)."""
    fields = our_fields() if fields is None else fields
    if option in fields:
        return all(f.metadata.get(ARCHITECTURE, True) for f in fields[option])
    return option not in FAIRSEQ_MAY_CHANGE


def options_of(model_cls) -> Dict[str, argparse.Action]:
    """``{option: its parser action}`` of everything ``model_cls.add_args`` adds, in order; a
    renamed flag (models/flags.py) by its new spelling."""
    parser = argparse.ArgumentParser(add_help=False)
    model_cls.add_args(parser)
    actions: Dict[str, argparse.Action] = {}
    for action in parser._actions:
        if not action.option_strings:
            continue
        deprecated = (action.help or "").startswith("deprecated name of")
        if action.dest not in actions or not deprecated:
            actions[action.dest] = action
    return actions


def flag(action: argparse.Action) -> str:
    return max(action.option_strings, key=len)


def arch_of(ns) -> Optional[str]:
    return getattr(ns, "arch", None) or getattr(ns, "_name", None)


def model_class(ns):
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    name = arch_of(ns)
    return ARCH_MODEL_REGISTRY.get(name) or MODEL_REGISTRY.get(name)


def family(ns) -> Optional[str]:
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    name = arch_of(ns)
    return ARCH_MODEL_NAME_REGISTRY.get(name, name)


def resolved(ns: argparse.Namespace) -> argparse.Namespace:
    """A copy of ``ns`` with its ``--arch``'s preset applied (the defaults of options that a
    checkpoint of older code lacks, as the model's ``build_model`` fills them) and what fairseq's
    Transformer ``build_model`` derives (:func:`derive_as_built`), so that the options of a
    command line compare with those a checkpoint saved after its model was built."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    ns = copy.deepcopy(ns)
    preset = ARCH_CONFIG_REGISTRY.get(arch_of(ns))
    if preset is not None:
        try:
            preset(ns)
        except Exception:  # noqa: BLE001 - what the preset refuses was accepted when it was saved
            pass
    derive_as_built(ns)
    return ns


def derive_as_built(ns: argparse.Namespace):
    """What fairseq's Transformer ``build_model`` (``TransformerModel`` and
    ``TransformerModelBase``, every fairseq 0.12) sets from other options in the options it is
    given, which a checkpoint then saves: ``--share-decoder-input-output-embed`` under
    ``--share-all-embeddings`` (or ``--merge-src-tgt-embed``), the layer counts of
    ``--encoder-layers-to-keep``/``--decoder-layers-to-keep``; in place, for the models built
    by it (fairseq's and ours: the Transformer families)."""
    from fairseq.models.transformer import TransformerModelBase

    cls = model_class(ns)
    if cls is None or not issubclass(cls, TransformerModelBase):
        return
    if getattr(ns, "share_all_embeddings", False) or getattr(ns, "merge_src_tgt_embed", False):
        ns.share_decoder_input_output_embed = True
    for side in ("encoder", "decoder"):
        keep = getattr(ns, f"{side}_layers_to_keep", None)
        if keep:
            setattr(ns, f"{side}_layers", len(str(keep).split(",")))


def _same(a, b) -> bool:
    if a == b:
        return True
    if (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return float(a) == float(b)
    return a is not None and b is not None and str(a) == str(b)


def shown(value, action: Optional[argparse.Action] = None) -> str:
    if action is not None and action.nargs == 0:  # a flag
        return "on" if bool(value) != isinstance(action, argparse._StoreFalseAction) else "off"
    return "unset" if value is None else str(value)


_UNKNOWN = object()


def _value(ns, option: str, action: argparse.Action, fields) -> object:
    """``ns``'s value of ``option``; one it lacks (its flag was not given and no preset fills it,
    as for the ``--deepnorm*`` options) is its dataclass default, as its reader
    (``Config.from_namespace``) takes it, or off for a flag."""
    if hasattr(ns, option):
        return getattr(ns, option)
    if option in fields:
        f = fields[option][0]
        return f.default_factory() if f.default is dataclasses.MISSING else f.default
    return (not action.const) if action.nargs == 0 else _UNKNOWN


def differences(saved, current, every: bool = False) -> List[Tuple[str, str, str]]:
    """``[(flag, the checkpoint's value, this run's), ...]`` over the architecture options of this
    run's model (``every``: over all its model options); a different family is one entry, ``--arch``."""
    saved, current = resolved(as_namespace(saved)), resolved(as_namespace(current))
    if family(saved) != family(current):
        return [
            (
                "--arch",
                f"{arch_of(saved)} (model {family(saved)})",
                f"{arch_of(current)} (model {family(current)})",
            )
        ]
    cls = model_class(current)
    if cls is None:
        return []
    fields = our_fields()
    found = []
    for option, action in options_of(cls).items():
        if not (every or is_architecture(option, fields)):
            continue
        a, b = (_value(ns, option, action, fields) for ns in (saved, current))
        if a is _UNKNOWN or b is _UNKNOWN:
            continue  # neither set nor with a default that we know: nothing to compare
        if action.nargs == 0:
            a, b = bool(a), bool(b)
        if not _same(a, b):
            found.append((flag(action), shown(a, action), shown(b, action)))
    return found


def describe(found: Sequence[Tuple[str, str, str]]) -> str:
    return ", ".join(f"{name} (checkpoint {a}, this run {b})" for name, a, b in found)


def check_same_architecture(path: str, saved, current):
    """A :class:`CheckpointError` when the model of this run (``current``: its options) differs
    from the checkpoint's (``saved``) in an architecture option, naming each with both values.
    Only the models of fairseq_deep are checked (fairseq's own keep fairseq's behaviour)."""
    current = as_namespace(current)
    cls = model_class(current) if current is not None else None
    if saved is None or cls is None or not _ours(cls):
        return
    if getattr(current, "init_from_pretrained", False) and not getattr(
        as_namespace(saved), "init_from_pretrained", False
    ):
        return  # --init-from-pretrained: the matching part of a baseline of another architecture, on purpose
    found = differences(saved, current)
    if found:
        raise CheckpointError(
            f"{path} holds a model whose architecture differs from this run's: {describe(found)}. "
            f"Training on would silently change the model. Give the checkpoint's values (fairseq-deep-train "
            f"--model-from {path} takes every model option from it), or start a new model in another "
            f"--save-dir (the checkpoint was not modified); options that may change when training goes on "
            f"(dropout, label smoothing, learning rate, ...) are not compared"
        )


def restored_checkpoint(args) -> Optional[Tuple[str, str]]:
    """(the checkpoint, the option that names it) that fairseq-train with ``args`` restores, by
    fairseq's rule (``checkpoint_utils.load_checkpoint``): ``--restore-file`` when given, else
    ``SAVE_DIR/checkpoint_last.pt`` when it exists, else on a first launch ``--continue-once`` or
    ``--finetune-from-model``; None when training starts afresh (a ``--restore-file`` that does
    not exist too: fairseq then starts afresh and says so)."""
    restore = getattr(args, "restore_file", None) or "checkpoint_last.pt"
    if restore != "checkpoint_last.pt":
        return (restore, "--restore-file") if os.path.isfile(restore) else None
    last = os.path.join(getattr(args, "save_dir", None) or "checkpoints", "checkpoint_last.pt")
    if os.path.isfile(last):
        return last, "--save-dir"
    for option in ("continue_once", "finetune_from_model"):
        path = getattr(args, option, None)
        if path:
            return path, "--" + option.replace("_", "-")  # missing: peek says so
    return None


def check_restore(args):
    """The architecture options of fairseq-train's ``args`` against the checkpoint it would restore
    (:func:`restored_checkpoint`), before fairseq prints its configuration, builds the model or
    creates ``--save-dir``: a difference (or a checkpoint that cannot be read) is the only thing
    said.  The trainer checks again when it loads the file (patches/checkpoint_errors)."""
    found = restored_checkpoint(args)
    if found is None:
        return
    path, option = found
    state = peek(path, option if option != "--save-dir" else None)
    if state is not None:
        check_same_architecture(path, saved_model_options(state), args)


def model_command(ns) -> List[str]:
    """``--arch ARCH`` and every model option of ``ns`` (a checkpoint's model options) as
    command-line arguments: each option with a value, each flag that is on; not the files read
    when a model is built (:data:`READS_A_FILE`), nor an option that the parser would read as text
    where the model holds a number (fairseq's ``--decoder-output-dim``, which its preset derives)."""
    ns = as_namespace(ns)
    cls = model_class(ns)
    if cls is None:
        raise CheckpointError(f"--arch {arch_of(ns)}: no such architecture is registered")
    argv = ["--arch", arch_of(ns)]
    for option, action in options_of(cls).items():
        value = getattr(ns, option, None)
        if value is None or option in READS_A_FILE:
            continue
        if (
            action.nargs == 0
        ):  # store_true (or store_false): the flag when its value is not the default
            if bool(value) == bool(action.const):
                argv.append(flag(action))
            continue
        if action.type is None and not isinstance(value, str):
            # fairseq's --decoder-output-dim (--decoder-embed-dim unless set): typed as text, its
            # preset sets it
            continue
        text = str(
            value.value
            if hasattr(value, "value") and not isinstance(value, (int, float, str))
            else value
        )
        argv += (
            [f"{flag(action)}={text}"]
            if text.startswith("-") or action.nargs
            else [flag(action), text]
        )
    return argv


def shell(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)
