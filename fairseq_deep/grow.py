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
where the family allows it (see :func:`_identity_plan`).

How it works: the grown model is built from the grown options through fairseq's ``build_model``
(so every depth-dependent module has the shape the family gives it), then every parameter and
buffer of it is either copied from its place in the shallow model by a per-family layer-index map
or deliberately initialised, and :func:`grow_state` checks that none was left out.  What depends on
depth:

* layers: copied by the method's map; a copy must have the same role (class, parameter shapes,
  direction of a Deep-Att layer, residual connection of an RNMT+ layer; with multi-layer attention
  the number of lower layers): otherwise the nearest old layer with that role is taken;
* DLCL (Wang et al. 2019) weights W, (U+1) x (U+1) over units (the embedding and layer outputs of a
  Transformer stack; the layer outputs of an RNMT+ stack): rows of kept layers keep their old
  weights, new rows take the model's ``--dlcl-init`` (by default the paper's average 1/(r+1));
  the layer norms of the units follow the unit map;
* transparent attention (Bapna et al. 2018) logits, (N+1) x M: entry u takes the logit of its
  source entry minus log(number of its copies), column j that of decoder layer j's source, so each
  old entry keeps its share of every mixture (exactly, when the copies are equal);
* layer aggregation (Dou et al. 2018): linear-combination matrices W_l of copies are shared out
  like the transparent weights (W / copies); iterative and hierarchical nodes are copied from the
  node that merged the source layers where the shapes agree, otherwise initialised;
* DeepNorm (Wang et al. 2022): alpha and beta are functions of N and M.  By default
  (``--deepnorm-constants new``) the grown model uses the new depth's constants: every layer,
  copied or not, then computes LN(alpha' x + G(x)) with the new alpha', a different function;
  ``keep`` writes the old constants into ``--deepnorm-alpha/--deepnorm-beta`` instead;
* Admin (Liu et al. 2020): omegas travel with their layer (profiled: not profiled again);
* ReZero (Bachlechner et al. 2020): alphas travel with their layer; ``--method identity`` sets the
  new layers' alpha to 0, which makes them the identity.

The optimizer state is dropped (its shapes are the shallow model's).  The shallow run's training
time is reset to 0, so that the next run's ``--stop-time-hours`` is its own (fairseq counts the
time a checkpoint brings); ``--keep-training-time`` keeps it, for comparisons in equal time
(``fairseq-deep-study --group li``: the stages share one budget).
"""

import argparse
import copy
import logging
import math
import os
import re
import sys
import zipfile
from collections import Counter
from typing import Dict, List, Optional, Tuple

from .errors import ArgumentParser, CheckpointError, MissingFileError, UserError, report_user_errors
from .model_options import saved_model_options
from .tasks.freeze import LAYER_KEY as _LAYER_KEY

logger = logging.getLogger("fairseq_deep.grow")

METHODS = ("stack", "interleave", "identity")


class GrowError(UserError):
    """A checkpoint, depth or method that cannot be grown; the message names the fix."""


# ---------------------------------------------------------------------------------------------
# layer maps
# ---------------------------------------------------------------------------------------------


def base_layer_map(method: str, old: int, new: int) -> List[int]:
    """Old layer index (0-based) whose parameters new layer j starts from, before roles are checked."""
    if method == "interleave":
        return [j * old // new for j in range(new)]
    k = max(1, min(new - old, old))
    return [j if j < old else old - k + (j - old) % k for j in range(new)]


def fit_roles(mapping: List[int], old_roles: List, new_roles: List) -> List[Optional[int]]:
    """The map with every source of another role replaced by the nearest old layer of the new
    layer's role (below first), or None where the old model has none."""
    fitted: List[Optional[int]] = []
    for j, src in enumerate(mapping):
        if old_roles[src] == new_roles[j]:
            fitted.append(src)
            continue
        order = sorted(range(len(old_roles)), key=lambda i: (abs(i - src), i > src))
        fitted.append(next((i for i in order if old_roles[i] == new_roles[j]), None))
    return fitted


# ---------------------------------------------------------------------------------------------
# the model: loading, options, building
# ---------------------------------------------------------------------------------------------


def load(path: str):
    """The checkpoint's state (fairseq's loader, with the package's allow-list and its errors)."""
    if not os.path.isfile(path):
        raise MissingFileError(f"--checkpoint {path}: no such checkpoint file")
    with open(path, "rb") as f:
        zip_header = f.read(4) == b"PK\x03\x04"  # a cut zip file: the loader says "truncated"
    if not zipfile.is_zipfile(path) and not zip_header:
        raise GrowError(f"--checkpoint {path} is not a checkpoint (not a file torch.save wrote): give a "
                        "checkpoint written by fairseq-train of a fairseq_deep model")
    from fairseq import checkpoint_utils

    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CheckpointError(f"--checkpoint {path} is not a fairseq checkpoint (it has no 'model' entry)")
    return state


def model_args(state, path: str) -> argparse.Namespace:
    """The saved model options as a namespace (a copy)."""
    saved = saved_model_options(state)
    if saved is None:
        raise GrowError(f"--checkpoint {path} holds no model options (no cfg.model, no args): "
                        "give a checkpoint written by fairseq-train")
    return saved


def family_of(args, path: str, error: type = GrowError, tool: str = "fairseq-deep-grow grows",
              fairseqs_own: Optional[str] = None) -> Tuple[str, str]:
    """(arch, model name) of a fairseq_deep model, or an ``error`` that says what ``tool`` takes
    (and, for a model of fairseq's own, ``fairseqs_own``; grow's advice when None)."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY

    arch = getattr(args, "arch", None) or getattr(args, "_name", None)
    if arch not in ARCH_MODEL_REGISTRY:
        raise error(f"--checkpoint {path} holds a model of --arch {arch}, which nothing loaded "
                    f"registers: {tool} the models of fairseq_deep (fairseq-deep-list-archs)")
    if ARCH_MODEL_REGISTRY[arch].__module__.split(".")[0] != "fairseq_deep":
        if fairseqs_own is None:  # grow's advice: the family of ours nearest to fairseq's model
            nearest = {"transformer": "transformer_postnorm, which is fairseq's transformer",
                       "lstm": "rnmt_plus or deep_att, LSTM families"}.get(ARCH_MODEL_NAME_REGISTRY.get(arch))
            fairseqs_own = ("train the shallow model with a fairseq_deep architecture"
                            + (f" (e.g. --arch {nearest})" if nearest else " (fairseq-deep-list-archs)"))
        raise error(f"--checkpoint {path} holds fairseq's own --arch {arch}, not a model of "
                    f"fairseq_deep: {fairseqs_own}")
    return arch, ARCH_MODEL_NAME_REGISTRY[arch]


def depth_options(family: str, args) -> Tuple[str, str]:
    """The options that hold the encoder and decoder depth of a family."""
    if family == "rnmt_hybrid":
        kind = str(getattr(args, "hybrid_encoder", "transformer"))
        if kind == "rnmt":
            return "rnmt_encoder_layers", "decoder_layers"
        if kind != "transformer":
            raise GrowError(f"--hybrid-encoder {kind}: fairseq-deep-grow does not grow a {kind} encoder (it has "
                            "two encoder stacks); grow the decoder only (--encoder-layers unchanged) or train it from scratch")
    return "encoder_layers", "decoder_layers"


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
            keys = [k for k in state_dict if k.startswith(side + ".") and k.endswith("embed_tokens.weight")]
            if not keys:
                raise GrowError(f"the checkpoint has no {side} token embedding: not a model fairseq-deep-grow knows")
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
# roles, units and what each side of the model looks like
# ---------------------------------------------------------------------------------------------


def _layers(model, side: str) -> Dict[str, List]:
    """{prefix: [layer modules]} of one side (one prefix per column of a Deep-Att encoder)."""
    found: Dict[str, Dict[int, object]] = {}
    for name, module in model.named_modules():
        m = re.fullmatch(rf"({side}\.(?:columns\.\d+\.|stack\.)?layers)\.(\d+)", name)
        if m:
            found.setdefault(m.group(1), {})[int(m.group(2))] = module
    return {p: [mods[i] for i in sorted(mods)] for p, mods in found.items()}


def _role(side_module, index: int, layer) -> Tuple:
    from .models.rnmt_plus.stack import has_residual

    shapes = tuple((n, tuple(t.shape)) for n, t in layer.state_dict().items())
    residual = None
    if hasattr(side_module, "residual_start"):  # RNMT+: a copy keeps its residual connection
        residual = has_residual(index, side_module.residual_start)
    return type(layer).__name__, shapes, getattr(layer, "reverse", None), residual


def _unit_offset(side_module) -> int:
    """How the units of a history are counted: 1 for a Transformer stack (unit 0 is the embedding,
    unit u the output of layer u-1), 0 for a recurrent one (unit u is layer u's output)."""
    return 0 if type(side_module).__name__.startswith("RNMTPlus") else 1


class Side:
    """One stack (encoder or decoder) of the old and the grown model and its layer map."""

    def __init__(self, name, old_model, new_model, method, old_depth, new_depth):
        self.name = name
        self.old_module = getattr(old_model, name)
        self.new_module = getattr(new_model, name)
        self.old_depth, self.new_depth = old_depth, new_depth
        self.method = method
        self.offset = _unit_offset(self.new_module)
        old_layers, new_layers = _layers(old_model, name), _layers(new_model, name)
        self.new_layers = new_layers
        self.maps: Dict[str, List[Optional[int]]] = {}
        for prefix, layers in new_layers.items():
            old = old_layers.get(prefix, [])
            if len(old) == len(layers):  # a stack this side does not grow (e.g. a hybrid's other part)
                self.maps[prefix] = list(range(len(layers)))
                continue
            if len(old) != old_depth or len(layers) != new_depth:
                raise GrowError(f"{prefix}: {len(old)} -> {len(layers)} layers, not the {old_depth} -> "
                                f"{new_depth} of the {name} depth option")
            old_roles = [_role(self.old_module, i, m) for i, m in enumerate(old)]
            new_roles = [_role(self.new_module, j, m) for j, m in enumerate(layers)]
            self.maps[prefix] = fit_roles(base_layer_map(method, len(old), len(layers)), old_roles, new_roles)
        self.grows = new_depth != old_depth
        main = sorted(self.maps)[0] if self.maps else None
        self.layer_map = self.maps[main] if main else list(range(new_depth))

    # units: what the history and transparent attention count
    @property
    def old_units(self) -> int:
        return self.old_depth - 1 + self.offset  # index of the last unit

    @property
    def new_units(self) -> int:
        return self.new_depth - 1 + self.offset

    def unit_source(self, u: int) -> Optional[int]:
        """The old unit whose parameters (norms) new unit u starts from."""
        if u < self.offset:
            return u
        src = self.layer_map[u - self.offset]
        return None if src is None else src + self.offset

    def value_source(self, u: int) -> int:
        """The old unit whose value new unit u carries at the start: its parameters' source, but
        with --method identity a new layer on top carries the old top unit (it is the identity)."""
        if self.method == "identity" and u > self.old_units:
            return self.old_units
        src = self.unit_source(u)
        return self.old_units if src is None else src


# ---------------------------------------------------------------------------------------------
# --method identity: which stacks can start as the identity, and how
# ---------------------------------------------------------------------------------------------


def _history_kind(side_module) -> str:
    from .modules.layer_aggregation import LinearCombinationHistory
    from .modules.layer_history import DynamicLinearCombination, LayerHistory

    history = getattr(side_module, "history", None)
    if isinstance(history, DynamicLinearCombination):
        return "dlcl_softmax" if history.softmax else "dlcl"
    if isinstance(history, LinearCombinationHistory):
        return "linear"
    if history is None or type(history) is LayerHistory:
        return "residual"
    return type(history).__name__


def _can_be_identity(layer) -> Optional[str]:
    """How a new layer starts as the identity map (None: it cannot)."""
    if hasattr(layer, "rezero_alpha"):
        return "rezero"
    if getattr(layer, "normalize_before", False) and not hasattr(layer, "lower_attention") \
            and type(layer).residual_connection.__qualname__.endswith("LayerBase.residual_connection"):
        return "prenorm"
    return None


def _identity_plan(side: "Side") -> Dict[str, str]:
    """``{"how": "readout" | "layers", ...}``: the readout of a DLCL (plain weights) or linear-
    combination stack ignores the new layers (their weights 0, exact whatever the layers); any
    other stack needs new layers that are the identity themselves: ReZero (alpha 0) or pre-norm
    Transformer layers (output projections of every sublayer 0: x + 0 + 0).  Post-norm layers
    (LN(x + 0) is not x), Admin and DeepNorm (post-norm), LSTM layers, multi-layer attention, dense,
    iterative and hierarchical aggregation cannot start as the identity."""
    kind = _history_kind(side.new_module)
    if kind in ("dlcl", "linear") and getattr(side.new_module, "transparent_attention", None) is None:
        return {"how": "readout"}
    layers = [m for prefix in sorted(side.maps) for m in side.new_layers[prefix][side.old_depth:]]
    hows = {_can_be_identity(m) for m in layers}
    if kind == "residual" and len(hows) == 1 and None not in hows:
        return {"how": "layers", "layer": hows.pop()}
    what = {"dlcl_softmax": "DLCL with --dlcl-softmax-weights (a weight of exactly 0 is a logit of -inf)",
            "residual": "its layers are not pre-norm Transformer layers nor ReZero layers (post-norm: "
                        "LN(x + 0) is not x; LSTM layers have no zero branch)"}.get(kind, f"its {kind}")
    if kind == "residual" and any(hasattr(m, "lower_attention") for m in layers):
        what = "multi-layer attention (each layer also attends to the outputs of the layers below it)"
    raise GrowError(f"--method identity: the {side.name} of this model cannot start with new layers that change "
                    f"nothing: {what}. Use --method stack (or interleave); the identity holds for ReZero, "
                    f"pre-norm Transformer layers and DLCL/linear-combination stacks")


# ---------------------------------------------------------------------------------------------
# the state of the grown model
# ---------------------------------------------------------------------------------------------


def _dlcl_rows(side: "Side") -> Dict[int, Tuple[int, Dict[int, int]]]:
    """{new row: (old row, {new column: old column})} of the DLCL rows that keep old weights.

    Row r forms the input of unit r+1 (row U: the readout).  stack: the rows of the old layers;
    identity: those and the readout, which reads the old units only; interleave: the row of the
    first copy of each old layer (and the readout), its columns the last copies below it."""
    U_old, U_new = side.old_units, side.new_units
    rows: Dict[int, Tuple[int, Dict[int, int]]] = {}
    if not side.grows:
        return {r: (r, {c: c for c in range(r + 1)}) for r in range(U_old + 1)}
    if side.method in ("stack", "identity"):
        for r in range(U_old):
            rows[r] = (r, {c: c for c in range(r + 1)})
        if side.method == "identity":
            rows[U_new] = (U_old, {c: c for c in range(U_old + 1)})
        return rows
    seen = set()
    for r in range(U_new + 1):
        readout = r == U_new
        if not readout:
            v = side.unit_source(r + 1)
            if v is None or v in seen:
                continue
            seen.add(v)
            old_row = v - 1
        else:
            old_row = U_old
        last: Dict[int, int] = {}
        for c in range(r + 1):
            last[side.value_source(c)] = c
        rows[r] = (old_row, {c_new: c_old for c_old, c_new in last.items() if c_old <= old_row})
    return rows


def _copies(side: "Side", units: range) -> Counter:
    return Counter(side.value_source(u) for u in units)


def grow_state(old_model, new_model, sides: Dict[str, "Side"], method: str) -> Tuple[Dict, Dict[str, str]]:
    """The grown model's state dict and, for every key, where it came from."""
    old = old_model.state_dict()
    new = {k: v.clone() for k, v in new_model.state_dict().items()}
    origin: Dict[str, str] = {}

    def copy_from(key, old_key):
        if old_key not in old or old[old_key].shape != new[key].shape:
            return False
        new[key] = old[old_key].clone()
        origin[key] = f"copied from {old_key}"
        return True

    for key in list(new):
        m = _LAYER_KEY.match(key)
        if m:  # a layer's parameter: the layer map
            side, mid, j, rest = m.group(1), m.group(2), int(m.group(3)), m.group(4)
            prefix = f"{side}.{mid}layers"
            src = sides[side].maps[prefix][j] if side in sides else j
            if src is None or not copy_from(key, f"{prefix}.{src}.{rest}"):
                origin[key] = "initialised: no old layer of this layer's role"
            continue
        h = re.match(r"^(encoder|decoder)\.history\.(weight$|norms\.(\d+)\.|weights\.(\d+)\.|nodes\.(\d+)\.)(.*)$", key)
        side = sides.get(key.split(".")[0])
        if h and side is not None:
            _grow_history(key, h, side, old, new, origin, copy_from)
            continue
        if key.endswith("transparent_attention.weight") and side is not None:
            _grow_transparent(key, side, sides.get("decoder"), old, new, origin)
            continue
        if not copy_from(key, key):
            raise RuntimeError(f"fairseq-deep-grow: {key} of the grown model has no counterpart "
                               f"({tuple(new[key].shape)} vs {tuple(old[key].shape) if key in old else 'none'}): "
                               "a depth-dependent parameter without a rule")
    for side in sides.values():
        if method == "identity" and side.grows:
            _make_identity(side, new, origin)
    missing = [k for k in new if k not in origin]
    if missing:
        raise RuntimeError(f"fairseq-deep-grow left {missing[:5]} without a source")
    return new, origin


def _grow_history(key, h, side: "Side", old, new, origin, copy_from):
    import torch

    what = h.group(2)
    if what == "weight":  # DLCL weights, over units
        hist = side.new_module.history
        w = new[key].clone()  # the model's own --dlcl-init for rows without a source
        old_w = old[key]
        for r, (old_r, cols) in _dlcl_rows(side).items():
            if side.method != "stack" or r >= side.old_units:  # rows that may read new units
                if not hist.softmax:
                    w[r, : r + 1] = 0.0  # a kept row reads exactly what the old row read
            for c_new, c_old in cols.items():
                w[r, c_new] = old_w[old_r, c_old]
        new[key] = w
        origin[key] = f"rows {sorted(_dlcl_rows(side))} from the old weights, the others the model's --dlcl-init"
        return
    if h.group(3) is not None:  # DLCL layer norms, one per unit
        u = int(h.group(3))
        src = side.unit_source(u)
        if side.method == "identity" and u == side.new_units:
            src = side.old_units  # the readout's norm (post-norm: the old top's)
        elif side.method == "identity" and u <= side.old_units:
            src = u
        if src is None or not copy_from(key, f"{side.name}.history.norms.{src}.{h.group(6)}"):
            origin[key] = "initialised: a norm of a unit without source"
        return
    if h.group(4) is not None:  # linear combination W_l (layer l, 0-based)
        l = int(h.group(4))
        if side.method == "identity":
            if l < side.old_depth:
                copy_from(key, key)
            else:
                new[key] = torch.zeros_like(new[key])
                origin[key] = "zeros: --method identity (the readout ignores the new layers)"
            return
        src = side.layer_map[l]
        share = _copies(side, range(side.offset, side.new_units + 1))[src + side.offset]
        new[key] = old[f"{side.name}.history.weights.{src}.{h.group(6)}"].clone() / share
        origin[key] = f"W of old layer {src} / {share} copies"
        return
    i = int(h.group(5))  # aggregation nodes
    from .modules.layer_aggregation import IterativeAggregationHistory

    if isinstance(side.new_module.history, IterativeAggregationHistory):
        src_layer = side.layer_map[i + 1]
        src = None if src_layer is None else src_layer - 1
    else:  # hierarchical: the node that merged the source of the node's first layer
        first = side.layer_map[2 * i]
        src = None if first is None else first // 2
    if src is None or src < 0 or not copy_from(key, f"{side.name}.history.nodes.{src}.{h.group(6)}"):
        origin[key] = "initialised: a new aggregation node without a node of its shape"


def _grow_transparent(key, side: "Side", decoder: Optional["Side"], old, new, origin):
    """Entry u: the logit of its source minus log(copies); column j: decoder layer j's source."""
    old_w = old[key]
    w = new[key].clone()
    units = range(w.size(0))
    counts = _copies(side, units)
    columns = list(range(w.size(1)))
    if decoder is not None and w.size(1) == decoder.new_depth and old_w.size(1) == decoder.old_depth:
        columns = [decoder.value_source(j + 1) - 1 if decoder.method == "identity" and j >= decoder.old_depth
                   else (decoder.layer_map[j] if decoder.layer_map[j] is not None else decoder.old_depth - 1)
                   for j in columns]
    for u in units:
        v = side.value_source(u)
        for j, c in enumerate(columns):
            w[u, j] = old_w[v, c] - math.log(counts[v])
    new[key] = w
    origin[key] = "transparent weights: source logits - log(copies)"


def _make_identity(side: "Side", new, origin):
    """--method identity: the new layers of a stack whose readout cannot ignore them start as the
    identity (ReZero alpha 0; pre-norm: the output projections of every sublayer 0)."""
    import torch

    plan = side.identity_plan
    if plan["how"] != "layers":
        return
    for prefix in side.maps:
        for j in range(side.old_depth, side.new_depth):
            base = f"{prefix}.{j}."
            names = (["rezero_alpha"] if plan["layer"] == "rezero" else
                     [f"{p}.{w}" for p in ("self_attn.out_proj", "encoder_attn.out_proj", "fc2") for w in ("weight", "bias")])
            for name in names:
                if base + name in new:
                    new[base + name] = torch.zeros_like(new[base + name])
                    origin[base + name] = "zeros: --method identity"


# ---------------------------------------------------------------------------------------------
# the whole operation
# ---------------------------------------------------------------------------------------------


def grow(checkpoint: str, out: str, encoder_layers: Optional[int] = None, decoder_layers: Optional[int] = None,
         method: str = "stack", deepnorm_constants: str = "new", seed: int = 1,
         keep_training_time: bool = False) -> Dict:
    """Grow ``checkpoint`` into ``out``; returns a summary (arch, depths, counts of copied and
    initialised entries, the shallow run's training time and whether it was kept)."""
    import torch.nn as nn
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    if method not in METHODS:
        raise GrowError(f"--method {method}: choose one of {', '.join(METHODS)}")
    state = load(checkpoint)
    args = model_args(state, checkpoint)
    arch, family = family_of(args, checkpoint)
    enc_opt, dec_opt = depth_options(family, args)
    old_depths = {"encoder": int(getattr(args, enc_opt)), "decoder": int(getattr(args, dec_opt))}
    wanted = {"encoder": encoder_layers, "decoder": decoder_layers}
    new_depths = {s: old_depths[s] if wanted[s] is None else int(wanted[s]) for s in old_depths}
    for s, opt in (("encoder", enc_opt), ("decoder", dec_opt)):
        if new_depths[s] < old_depths[s]:
            raise GrowError(f"--{s}-layers {new_depths[s]} is smaller than the checkpoint's {old_depths[s]} "
                            f"{s} layers (--{opt.replace('_', '-')} {old_depths[s]}): fairseq-deep-grow only adds "
                            "layers")

    task = _Task(state["model"], args)
    old_model = build(args, task, seed)
    sd = dict(state["model"])
    old_model.upgrade_state_dict(sd)
    nn.Module.load_state_dict(old_model, sd, strict=True)

    new_args = copy.deepcopy(args)
    setattr(new_args, enc_opt, new_depths["encoder"])
    setattr(new_args, dec_opt, new_depths["decoder"])
    notes = []
    if getattr(args, "deepnorm", False):
        from .modules.residual_schemes import deepnorm_constants as constants

        if deepnorm_constants == "keep":
            for opt, i in (("deepnorm_alpha", 0), ("deepnorm_beta", 1)):
                if getattr(args, opt, None) is None:
                    pair = [constants(s, old_depths["encoder"], old_depths["decoder"])[i] for s in ("encoder", "decoder")]
                    setattr(new_args, opt, f"{pair[0]!r},{pair[1]!r}")
        elif method == "identity" and new_depths != old_depths and getattr(args, "deepnorm_alpha", None) is None:
            raise GrowError("--method identity with --deepnorm: DeepNorm's alpha of every layer depends on the depth, "
                            "so the grown model computes another function; add --deepnorm-constants keep")
        else:
            notes.append("DeepNorm: alpha/beta of the new depth (every layer's residual scale changes)")
    new_arch = grown_arch(arch, family, new_args)
    new_args.arch = new_arch
    if hasattr(new_args, "_name"):
        new_args._name = new_arch

    new_model = build(new_args, task, seed)
    sides = {s: Side(s, old_model, new_model, method, old_depths[s], new_depths[s]) for s in ("encoder", "decoder")}
    for side in sides.values():
        side.identity_plan = _identity_plan(side) if method == "identity" and side.grows else None
    new_sd, origin = grow_state(old_model, new_model, sides, method)
    new_model.load_state_dict(new_sd, strict=True)  # the grown state fits the grown model exactly

    out_state = dict(state)
    out_state["model"] = new_model.state_dict()
    cfg = state.get("cfg")
    if cfg is not None:
        cfg = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True) if OmegaConf.is_config(cfg) else dict(cfg)
        cfg["model"] = new_args
        out_state["cfg"] = cfg
    if state.get("args") is not None:
        out_state["args"] = new_args
    out_state["last_optimizer_state"] = None  # the shallow model's shapes: --reset-optimizer
    extra = dict(state.get("extra_state") or {})
    for stale in ("ema", "ema_fp32_params"):
        extra.pop(stale, None)
    trained_s = float(extra.get("previous_training_time") or 0.0)
    if not keep_training_time:
        extra["previous_training_time"] = 0.0  # the next run's --stop-time-hours is its own
    summary = {
        "from": os.path.abspath(checkpoint), "method": method, "arch": arch, "grown_arch": new_arch,
        "encoder_layers": [old_depths["encoder"], new_depths["encoder"]],
        "decoder_layers": [old_depths["decoder"], new_depths["decoder"]],
        "copied": sum(1 for v in origin.values() if v.startswith("copied")),
        "set": sum(1 for v in origin.values() if not v.startswith("copied")),
        "notes": notes, "training_time": trained_s, "training_time_kept": keep_training_time,
    }
    extra["grown"] = list(extra.get("grown", [])) + [summary]
    out_state["extra_state"] = extra
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    checkpoint_utils.torch_persistent_save(out_state, out)
    summary.update(origin=origin, depth_options=(enc_opt, dec_opt), model_options=new_args, cfg=cfg,
                   data=(cfg.get("task") or {}).get("data") if isinstance(cfg, dict) else getattr(args, "data", None))
    return summary


def cli_main(argv=None):
    parser = ArgumentParser(
        prog="fairseq-deep-grow",
        description="Grow a trained fairseq_deep model to more layers (Li et al. 2020, shallow-to-deep "
                    "training; Wu et al. 2019, depth growing). Continue with fairseq-deep-train DATA --model-from "
                    "OUT --restore-file OUT --reset-optimizer --reset-lr-scheduler --reset-dataloader.",
    )
    parser.add_argument("--checkpoint", required=True, metavar="IN.pt", help="the shallow model's checkpoint")
    parser.add_argument("--out", required=True, metavar="OUT.pt", help="where to write the grown checkpoint")
    parser.add_argument("--encoder-layers", type=int, help="encoder depth of the grown model (default: unchanged)")
    parser.add_argument("--decoder-layers", type=int, help="decoder depth of the grown model (default: unchanged)")
    parser.add_argument("--method", default="stack", choices=METHODS,
                        help="stack: copies of the top layers on top (Li et al. 2020, default); interleave: "
                             "each layer repeated in place; identity: new layers on top that start as the "
                             "identity (ReZero, pre-norm layers, DLCL/linear-combination readouts)")
    parser.add_argument("--deepnorm-constants", default="new", choices=("new", "keep"),
                        help="DeepNorm models: alpha/beta of the new depth (default) or of the checkpoint's")
    parser.add_argument("--keep-training-time", action="store_true",
                        help="keep the shallow run's training time in OUT, so that the next run's --stop-time-hours "
                             "counts it (comparisons in equal time); by default OUT starts at 0")
    parser.add_argument("--seed", type=int, default=1, help="seed of the parameters that are initialised")
    args = parser.parse_args(argv)
    from .cli import _fairseq_logging, quiet_warnings

    quiet_warnings()
    _fairseq_logging(sys.stderr)

    def run():
        import fairseq_deep  # noqa: F401  (registers the models, allow-lists the checkpoint types)
        from .grow_report import report

        if args.encoder_layers is None and args.decoder_layers is None:
            parser.error("give --encoder-layers and/or --decoder-layers")
        summary = grow(args.checkpoint, args.out, args.encoder_layers, args.decoder_layers, args.method,
                       args.deepnorm_constants, args.seed, args.keep_training_time)
        print(report(summary, args.out))

    report_user_errors(run, parser.prog)


if __name__ == "__main__":
    cli_main()
