"""What the parts of a model declare for ``fairseq-deep-grow`` (docs/grow.md), and the map of one
grown stack that their rules read.

Growing builds the shallow and the grown model and fills every tensor of the grown one from the
shallow one (:mod:`fairseq_deep.grow`).  What that takes depends on the parts, and each part says
it beside its class, in one declaration; a class's rule is looked up along its MRO, each aspect
from the first class that declares it (a residual scheme's mixin before the layer class it is
mixed into):

* a model family: its declaration (``grows``, ``depth_options`` of
  :class:`fairseq_deep.models.families.Family`), which ``fairseq-deep-grow`` reads, says which
  options hold its encoder and decoder depth; a family that does not grow is refused in one line;
* an encoder or decoder, :func:`declare_stack`: where its layers are (``layers``: key prefix ->
  layers, one entry per column of Deep-Att's encoder), how its history counts units
  (``unit_offset``) and what else a copied layer must share with its source (``layer_role``:
  RNMT+'s residual connection);
* a part of a stack whose tensors depend on the depth (a layer history, transparent attention),
  :func:`declare_part`: ``grow`` fills its tensors in the grown model, ``identity`` says what
  ``--method identity`` takes for it: :data:`READOUT` (its readout gives the new layers weight 0),
  :data:`LAYERS` (the new layers must be the identity themselves) or why it cannot hold;
* a layer class or residual scheme, :func:`declare_layer`: ``role`` (what else a copy must share
  with its source: Deep-Att's direction, multi-layer attention's window), ``identity`` (the
  parameters set to 0 to make a new layer the identity, or why it cannot be one) and ``options``
  (options of the grown model that depend on the depth: DeepNorm's constants).

Everything else of a stack (embeddings, projections, final layer norms, attention) is copied as it
is; a tensor whose shape changes with the depth and that no rule fills stops the tool.
"""

import argparse
from collections import Counter
from dataclasses import dataclass, fields
from typing import Callable, Dict, Hashable, Iterator, List, Optional, Sequence, Tuple, Union

from torch import Tensor, nn

from ...errors import UserError

#: ``identity`` of a part: its readout gives the new layers weight 0 (exact, whatever they are)
READOUT = "readout"
#: ``identity`` of a part: the grown stack keeps its outputs when the new layers are the identity
LAYERS = "layers"


class GrowError(UserError):
    """A checkpoint, depth or method that cannot be grown; the message names the fix."""


def _no_role(*_) -> Hashable:
    return None


def _nothing(*_) -> None:
    return None


def _no_identity(layer: nn.Module) -> str:
    return f"its layers ({type(layer).__name__}) declare no identity"


def _residual_identity(part: nn.Module) -> str:
    return LAYERS


@dataclass(frozen=True)
class StackRule:
    #: stack -> {key prefix under the stack ("layers", "columns.0.layers"): its layers, bottom first}
    layers: Callable[[nn.Module], Dict[str, Sequence[nn.Module]]] = None
    #: how the stack's history and readouts count units: 1 when unit 0 is the embedding and unit u
    #: the output of layer u-1 (Transformer), 0 when unit u is layer u's output (RNMT+)
    unit_offset: int = 1
    #: (stack, layer index) -> what else layer ``index`` of this stack must share with its source
    layer_role: Callable[[nn.Module, int], Hashable] = _no_role


@dataclass(frozen=True)
class PartRule:
    #: (part of the grown model, its key prefix "encoder.history.", the StackGrowth, the
    #: GrownState) -> None: sets the part's tensors (those it leaves are copied as they are)
    grow: Callable[[nn.Module, str, "StackGrowth", "GrownState"], None] = _nothing
    #: part -> READOUT, LAYERS or why --method identity cannot keep the stack's outputs
    identity: Callable[[nn.Module], str] = _residual_identity


@dataclass(frozen=True)
class LayerRule:
    #: layer -> what else a copy must share with its source (besides its class and shapes)
    role: Callable[[nn.Module], Hashable] = _no_role
    #: layer -> names of its parameters that, set to 0, make it the identity map, or why it cannot be
    identity: Callable[[nn.Module], Union[List[str], str]] = _no_identity
    #: (the shallow model's options, the grown model's (changed in place), GrowRequest) -> notes
    options: Optional[
        Callable[[argparse.Namespace, argparse.Namespace, "GrowRequest"], List[str]]
    ] = None


class _Rules:
    """Declarations of one kind, by class; a rule is looked up along the MRO, aspect by aspect."""

    def __init__(self, rule: type):
        self.rule, self.declared = rule, {}
        self.aspects = {f.name for f in fields(rule)}

    def declare(self, cls: type, aspects: Dict) -> type:
        unknown = set(aspects) - self.aspects
        if unknown:
            raise TypeError(f"{self.rule.__name__} has no aspect {sorted(unknown)}")
        self.declared[cls] = {k: v for k, v in aspects.items() if v is not None}
        return cls

    def of(self, obj) -> Optional[object]:
        """The rule of ``obj`` (a class or an instance), or None when no class of its MRO declares one."""
        found, declared = {}, False
        for cls in (obj if isinstance(obj, type) else type(obj)).__mro__:
            if cls in self.declared:
                declared = True
                for name, value in self.declared[cls].items():
                    found.setdefault(name, value)
        return self.rule(**found) if declared else None


STACKS, PARTS, LAYER_RULES = (
    _Rules(StackRule),
    _Rules(PartRule),
    _Rules(LayerRule),
)


def declare_stack(stack: type, layers, unit_offset: Optional[int] = None, layer_role=None) -> type:
    """Declare where the layers of an encoder or decoder class are, and how its units count."""
    return STACKS.declare(
        stack, dict(layers=layers, unit_offset=unit_offset, layer_role=layer_role)
    )


def declare_part(part: type, grow=None, identity=None) -> type:
    """Declare how the tensors of a part whose shapes depend on the depth grow (``grow``), and
    what ``--method identity`` takes for it (``identity``)."""
    return PARTS.declare(part, dict(grow=grow, identity=identity))


def declare_layer(layer: type, role=None, identity=None, options=None) -> type:
    """Declare what a layer class (or a residual scheme's mixin) needs when it is copied, made the
    identity, or when the depth changes the model's options."""
    return LAYER_RULES.declare(layer, dict(role=role, identity=identity, options=options))


def layer_rule(layer: nn.Module) -> LayerRule:
    return LAYER_RULES.of(layer) or LayerRule()


def stack_layers(name: str, stack: nn.Module) -> Dict[str, List[nn.Module]]:
    """{key prefix ("encoder.layers"): layers} of the ``name`` stack, as it declares them."""
    rule = STACKS.of(stack)
    if rule is None or rule.layers is None:
        raise GrowError(
            f"the {name} of this model ({type(stack).__name__}) declares no growth rule: "
            "fairseq-deep-grow grows the stacks that declare where their layers are (docs/grow.md)"
        )
    return {f"{name}.{prefix}": list(layers) for prefix, layers in rule.layers(stack).items()}


@dataclass(frozen=True)
class GrowRequest:
    """What was asked: ``method``, the depths ({"encoder": N, "decoder": M}) before and after,
    ``constants`` (--deepnorm-constants: a scheme's depth-dependent constants of the ``new`` depth
    or ``keep`` the shallow model's)."""

    method: str
    old_depths: Dict[str, int]
    new_depths: Dict[str, int]
    constants: str = "new"


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


def layer_role(stack: nn.Module, index: int, layer: nn.Module) -> Tuple:
    """What a copy of ``layer`` (layer ``index`` of ``stack``) must share with its source: its
    class, its tensors' shapes, and what the layer and the stack declare."""
    shapes = tuple((n, tuple(t.shape)) for n, t in layer.state_dict().items())
    return (
        type(layer),
        shapes,
        layer_rule(layer).role(layer),
        STACKS.of(stack).layer_role(stack, index),
    )


class StackGrowth:
    """One stack (``name``: encoder or decoder) of the shallow and the grown model, as the rules
    read it: the method, the depths, the layer maps (new layer j of the layers under ``prefix``
    starts from old layer ``maps[prefix][j]``; None: no old layer of its role; ``layer_map`` is the
    first stack's), the units of its history and readouts, and its parts with a rule."""

    def __init__(
        self,
        name: str,
        old_module: nn.Module,
        new_module: nn.Module,
        method: str,
        old_depth: int,
        new_depth: int,
    ):
        self.name, self.method = name, method
        self.old_module, self.new_module = old_module, new_module
        self.old_depth, self.new_depth = old_depth, new_depth
        old_layers, new_layers = stack_layers(name, old_module), stack_layers(name, new_module)
        self.offset = STACKS.of(new_module).unit_offset
        self.new_layers = new_layers
        self.maps: Dict[str, List[Optional[int]]] = {}
        for prefix, layers in new_layers.items():
            old = old_layers.get(prefix, [])
            if len(old) == len(
                layers
            ):  # a stack this side does not grow (e.g. a hybrid's other part)
                self.maps[prefix] = list(range(len(layers)))
                continue
            if len(old) != old_depth or len(layers) != new_depth:
                raise GrowError(
                    f"{prefix}: {len(old)} -> {len(layers)} layers, not the {old_depth} -> "
                    f"{new_depth} of the {name} depth option"
                )
            old_roles = [layer_role(old_module, i, m) for i, m in enumerate(old)]
            new_roles = [layer_role(new_module, j, m) for j, m in enumerate(layers)]
            self.maps[prefix] = fit_roles(
                base_layer_map(method, len(old), len(layers)), old_roles, new_roles
            )
        self.grows = new_depth != old_depth
        main = sorted(self.maps)[0] if self.maps else None
        self.layer_map = self.maps[main] if main else list(range(new_depth))
        self.parts = self._parts()

    def _parts(self) -> List[Tuple[str, nn.Module, PartRule]]:
        """(key prefix, module, rule) of every outermost part of the grown stack that declares a
        rule (its layers are not parts: the layer maps fill them)."""
        taken = [prefix[len(self.name) + 1 :] for prefix in self.maps]
        parts = []
        for sub, module in self.new_module.named_modules():
            if not sub or any(sub == t or sub.startswith(t + ".") for t in taken):
                continue
            rule = PARTS.of(module)
            if rule is not None:
                parts.append((f"{self.name}.{sub}.", module, rule))
                taken.append(sub)
        return parts

    # units: what the histories and transparent attention count
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

    def copies(self, units: Sequence[int]) -> Counter:
        """{old unit: how many of ``units`` carry its value}."""
        return Counter(self.value_source(u) for u in units)


class GrownState:
    """The grown model's state dict while the rules fill it: ``old`` (the shallow model's),
    ``new`` (the grown model's, as built: a rule that sets nothing leaves the built value),
    ``origin`` (key -> where its value came from) and ``stacks`` (name -> StackGrowth)."""

    def __init__(
        self, old: Dict[str, Tensor], new: Dict[str, Tensor], stacks: Dict[str, StackGrowth]
    ):
        self.old, self.new, self.stacks = old, new, stacks
        self.origin: Dict[str, str] = {}

    def copy(self, key: str, old_key: str) -> bool:
        """new[key] = old[old_key] where it exists with the same shape; whether it did."""
        if old_key not in self.old or self.old[old_key].shape != self.new[key].shape:
            return False
        self.new[key] = self.old[old_key].clone()
        self.origin[key] = f"copied from {old_key}"
        return True

    def set(self, key: str, value: Tensor, origin: str):
        self.new[key] = value
        self.origin[key] = origin

    def indexed(self, prefix: str) -> Iterator[Tuple[str, int, str]]:
        """(key, i, rest) of every key ``prefix{i}.{rest}`` of the grown model (``layers.``, ``norms.``)."""
        for key in list(self.new):
            if key.startswith(prefix):
                head, _, rest = key[len(prefix) :].partition(".")
                if head.isdigit():
                    yield key, int(head), rest
