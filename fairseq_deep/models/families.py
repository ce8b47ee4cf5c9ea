"""The model families of the package, each declared once, beside its model (docs/extending.md, "A
new model family").

A family is a registered model class (fairseq's ``register_model``) and its presets (the
``--arch`` names whose model it is: :meth:`Family.presets`).  One :func:`declare` call, at the end
of the model's file, names all that the tools and the tests must know about it:

* ``sizes``, its size rule: the options of ``--width W`` (:meth:`Spec.width`);
* ``grows`` and ``depth_options``, its growth: whether ``fairseq-deep-grow`` grows it and which
  options hold its two depths (:meth:`Family.depth_names`, which grow reads; its stacks, parts and
  layers declare their own rules beside their classes: :mod:`fairseq_deep.modules.common.growth`);
* ``reduction``, its export rule: whether a model of it is fairseq's own ``transformer``
  (:func:`~fairseq_deep.models.reduction.residual_stacks`), or why none is
  (:func:`~fairseq_deep.models.reduction.never`);
* ``layer_weights``, the kinds of learned layer-weight matrices its models hold
  (:class:`~fairseq_deep.modules.common.layer_weight_kinds.LayerWeightKind`, declared beside their
  modules), which ``fairseq-deep-layer-weights`` reads;
* ``recipe``, the optimiser and schedule of its paper that the study gives it (RNMT+'s), as
  settings (option names -> values) that :func:`fairseq_deep.runs.recipes.paper` writes: a model
  file declares settings, it writes no command line (``Tiny.training`` too);
* ``study`` and ``sweeps``, the built-in study groups it is in and its lines of the groups that
  sweep depth (``depth``, ``modern``: :func:`sweep`);
* ``tiny_sizes`` and ``tiny``, its tiny configurations (:class:`Tiny`): the rows that every test
  matrix and the precision benchmark derive from this registry, so that a family is covered by
  every matrix the moment it is declared; each carries the precision benchmark's paper-scale
  planning figures apart (:class:`PaperScale`), which no test reads;
* ``stands_for``, the models of fairseq's own that one of its presets is the nearest to (what
  ``fairseq-deep-grow`` advises for a checkpoint of fairseq's ``transformer`` or ``lstm``).

An ``--arch`` is resolved once (:func:`spec`): a :class:`Spec` carries its family, its preset and
its depths, and answers the family's size rule, kind and recipe for it; the tools take a
``Spec`` where they took an ``--arch`` string (``runs.Run``, the study's systems).

Presets registered in a file of their own (the residual schemes' ``transformer_deepnorm``, ...: a
setting of every Transformer family, registered on ``transformer_dlcl``) add their tiny
configurations and study lines beside them (:func:`declare_presets`).

The registry holds data that the floors above read (``runs``, the study, the diagnostics, the
tests and benchmarks); it imports nothing above the models.
"""

import argparse
import logging
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY
from torch import nn

from ..errors import UserError
from ..modules.common.layer_weight_kinds import LayerWeightKind
from .presets import depth_free, named_depth

#: --width's warning for an --arch of no known sizes (said where runs said it)
logger = logging.getLogger("fairseq_deep.runs")

#: a line of a depth sweep of the study: (technique: its line in the plot, --arch, system prefix)
SweepLine = Tuple[str, str, str]
#: a family's lines of the study's sweep groups: {group: its lines}, stored as ((group, lines), ...)
Sweeps = Mapping[str, Sequence[SweepLine]]


def _sweeps(sweeps) -> Tuple[Tuple[str, Tuple[SweepLine, ...]], ...]:
    """A declaration's sweeps ({group: lines} or ((group, lines), ...)) in the stored form."""
    pairs = sweeps.items() if isinstance(sweeps, Mapping) else sweeps
    return tuple((group, tuple(tuple(line) for line in lines)) for group, lines in pairs)


#: settings of a run: fairseq's option names -> values (``{"optimizer": "adam", "lr": "1e-3"}``),
#: which :func:`fairseq_deep.runs.flags` writes as options (True: a bare flag)
Settings = Mapping[str, object]


@dataclass(frozen=True)
class PaperScale:
    """The paper-scale run of a tiny configuration, a figure of the precision benchmark's planning
    only (``benchmarks/precision_matrix.py --scale paper`` trains ``arch``; ``estimate_gb`` plans
    its GPU memory from ``memory``); no test reads it."""

    #: the --arch at the paper's sizes (a preset of the same family)
    arch: str
    #: (parameters in millions, width x layers of its Transformer layers, hidden size x layers x
    #: directions of its recurrent ones), counted on ``arch`` with an 8k joint vocabulary
    memory: Tuple[float, int, int]


@dataclass(frozen=True)
class Tiny:
    """A tiny configuration of a family: a row of the test matrices and of
    ``benchmarks/precision_matrix.py`` (``--scale tiny``: ``arch`` at the family's ``tiny_sizes``;
    ``--scale paper``: ``paper``)."""

    #: the row's name in every matrix (its pytest id, its column of the precision table)
    name: str
    #: the depth-free --arch of the tiny model
    arch: str
    #: the benchmark's paper-scale run of it (planning figures, :class:`PaperScale`)
    paper: PaperScale
    #: model options of both scales
    model: Tuple[str, ...] = ()
    #: training settings (a criterion, an optimizer, a task) of both scales: fairseq's option
    #: names -> values (:data:`Settings`; runs writes them)
    training: Settings = field(default_factory=dict)
    #: the sample matrices it is a row of (``"bf16"``: bf16 through the real CLI), see :func:`matrix`
    samples: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Recipe:
    """A paper's optimiser and learning-rate schedule, as the study gives it (``--recipe paper``),
    declared as data beside the model: ``settings`` at the study's --lr and --warmup, which
    :func:`fairseq_deep.runs.recipes.paper` writes as the run's optimiser and schedule (the one
    place that writes command lines)."""

    #: the recipe's name in results.json (``rnmt_plus``)
    name: str
    #: (the study's --lr, the Transformers' peak; its --warmup) -> (the optimiser's settings, the
    #: schedule's)
    settings: Callable[[float, int], Tuple[Settings, Settings]]
    #: the study's --lr -> the results table's words for it
    text: Callable[[float], str]


@dataclass(frozen=True)
class Family:
    """One model family (module docstring)."""

    #: the model's name in fairseq's registry (``register_model``)
    name: str
    model: type
    #: --width W -> the model options of that width, consistent within the family
    sizes: Callable[[int], List[str]]
    #: the model -> None when it is fairseq's transformer up to a fold of its parameters, else why
    #: not (one line); ``reduction.never(why)`` for a family none of whose models is
    reduction: Callable[[nn.Module], Optional[str]]
    #: the sizes of its tiny models (dimensions 8-32, 2-3 layers)
    tiny_sizes: Tuple[str, ...]
    #: its tiny configurations, the first one its representative
    tiny: Tuple[Tiny, ...]
    #: what runs.model_kind answers for its --arch values (default: its name)
    kind: Optional[str] = None
    #: its models build Transformer layers (fully sharded wrapping, --checkpoint-activations)
    transformer_layers: bool = False
    #: fairseq-deep-grow grows it ...
    grows: bool = True
    #: ... and the options of its encoder and decoder depth are: args -> (option, option); None:
    #: encoder_layers and decoder_layers (:meth:`depth_names`; a family may refuse a setting there)
    depth_options: Optional[Callable[[argparse.Namespace], Tuple[str, str]]] = None
    layer_weights: Tuple[LayerWeightKind, ...] = ()
    recipe: Optional[Recipe] = None
    #: the built-in study groups (fairseq_deep/study/groups.py) that train presets of it (the
    #: groups of ``sweeps`` are added)
    study: Tuple[str, ...] = ()
    #: its lines of the study's groups that sweep depth: {group: lines}, e.g. ``{"depth": ...}``
    #: (N encoder + N decoder layers), ``{"modern": ...}`` (the schemes after 2022)
    sweeps: Sweeps = ()
    #: {a model of fairseq's own: the --arch of this family nearest to it}, e.g. ``{"transformer":
    #: "transformer_postnorm"}`` (fairseq-deep-grow's advice for a checkpoint of fairseq's model),
    #: stored as ((model, arch), ...)
    stands_for: Mapping[str, str] = ()

    def __post_init__(self):
        if self.kind is None:
            object.__setattr__(self, "kind", self.name)
        sweeps = _sweeps(self.sweeps)
        object.__setattr__(self, "sweeps", sweeps)
        extra = tuple(g for g, _ in sweeps if g not in self.study)
        object.__setattr__(self, "study", tuple(self.study) + tuple(dict.fromkeys(extra)))
        stands_for = self.stands_for
        pairs = stands_for.items() if isinstance(stands_for, Mapping) else stands_for
        object.__setattr__(self, "stands_for", tuple(tuple(pair) for pair in pairs))

    def presets(self) -> List[str]:
        """Its --arch values, in the order they were registered."""
        return [arch for arch, model in ARCH_MODEL_NAME_REGISTRY.items() if model == self.name]

    def depth_names(self, args: argparse.Namespace) -> Tuple[str, str]:
        """The options (``args``' names) that hold its encoder and decoder depth in a model of
        options ``args``: ``depth_options`` of its declaration, else ``encoder_layers`` and
        ``decoder_layers``."""
        if self.depth_options is None:
            return "encoder_layers", "decoder_layers"
        return self.depth_options(args)


@dataclass(frozen=True)
class Spec:
    """An ``--arch`` resolved once (:func:`spec`): its preset (``arch``), fairseq's model of it
    (``model``), its family (None for a model of fairseq's own or another plugin's) and its depths;
    what the tools ask of a family for it (its sizes, kind and recipe) are methods here."""

    #: the preset, as given
    arch: str
    #: fairseq's model name of it (``register_model``)
    model: str
    family: Optional[Family]

    @property
    def kind(self) -> str:
        """transformer, rnmt_plus, rnmt_hybrid, deep_att (what its family declares), or other:
        fairseq's own Transformers are ``transformer`` (sized as ours), its other models ``other``."""
        if self.family is not None:
            return self.family.kind
        return "transformer" if self.model.startswith("transformer") else "other"

    def width(self, width: Optional[int]) -> List[str]:
        """Model sizes for ``--width W`` by its family's size rule (``sizes`` of its declaration;
        fairseq's own Transformers by :func:`transformer_sizes`); nothing for no width, or for a
        model of no known sizes (a warning: it keeps its own)."""
        if not width:
            return []
        if self.family is not None:
            return self.family.sizes(width)
        if self.kind == "transformer":
            return transformer_sizes(width)
        logger.warning("--width: no sizes known for --arch %s; it keeps its own", self.arch)
        return []

    @property
    def recipe(self) -> Optional["Recipe"]:
        """The paper recipe its family declares (``recipe``), or None."""
        return None if self.family is None else self.family.recipe

    @property
    def depth_free(self) -> str:
        """The preset without the depth its name states (``transformer_dlcl_30l`` ->
        ``transformer_dlcl``; :func:`fairseq_deep.models.presets.depth_free`)."""
        return depth_free(self.arch)

    @property
    def named_depth(self) -> Optional[int]:
        """The encoder depth its name states (``..._30l``: 30), or None."""
        return named_depth(self.arch)

    @cached_property
    def depths(self) -> Tuple[int, int]:
        """(encoder, decoder) layers the preset gives when no flag sets them
        (``--encoder-layers``, ``--decoder-layers``)."""
        args = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[self.arch](args)
        return int(args.encoder_layers), int(args.decoder_layers)


_FAMILIES: Dict[str, Family] = {}


def declare(family: Family) -> Family:
    """Register ``family``."""
    if not family.tiny:
        raise TypeError(f"the family {family.name} declares no tiny configuration")
    if family.name in _FAMILIES:
        raise ValueError(f"the family {family.name} is already declared")
    _FAMILIES[family.name] = family
    return family


def declare_presets(family: str, tiny: Sequence[Tiny] = (), sweeps: Sweeps = ()) -> Family:
    """The tiny configurations and study sweep lines ({group: lines}) of presets of ``family``
    that are registered in a file of their own (the residual and stream schemes'), declared beside
    them; a group's lines follow those declared before."""
    old = _FAMILIES[family]
    _FAMILIES[family] = replace(
        old, tiny=old.tiny + tuple(tiny), sweeps=old.sweeps + _sweeps(sweeps)
    )
    return _FAMILIES[family]


def registered() -> List[Family]:
    """Every declared family, in the order of declaration."""
    return list(_FAMILIES.values())


def get(name: str) -> Optional[Family]:
    """The family of a model name, or None when none is declared."""
    return _FAMILIES.get(name)


def spec(arch: str) -> Spec:
    """``--arch arch`` resolved: its family, preset and depths (:class:`Spec`); an --arch that
    fairseq does not know is a UserError."""
    if arch not in ARCH_MODEL_NAME_REGISTRY:
        raise UserError(
            f"--arch {arch}: not a fairseq architecture (fairseq-deep-list-archs lists "
            "this package's)"
        )
    model = ARCH_MODEL_NAME_REGISTRY[arch]
    return Spec(arch, model, _FAMILIES.get(model))


def of_arch(arch: str) -> Optional[Family]:
    """The family of an --arch; None for a model of fairseq's own (or another plugin's)."""
    return spec(arch).family


def nearest_to(fairseq_model: str) -> List[str]:
    """The --arch values of the families that stand for ``fairseq_model`` (a model of fairseq's
    own: ``stands_for`` of their declarations), in the order of declaration."""
    return [arch for f in registered() for model, arch in f.stands_for if model == fairseq_model]


# ---------------------------------------------------------------------------------------------
# what the tools read
# ---------------------------------------------------------------------------------------------


def layer_weight_kinds() -> Dict[str, LayerWeightKind]:
    """Every kind of layer-weight matrix a family holds, by name (in the order of the names)."""
    found: Dict[str, LayerWeightKind] = {}
    for family in registered():
        for kind in family.layer_weights:
            if found.setdefault(kind.name, kind) is not kind:
                raise ValueError(f"two layer-weight kinds are named {kind.name!r}")
    return dict(sorted(found.items()))


def sweep(group: str) -> Tuple[SweepLine, ...]:
    """The lines of the study's sweep group ``group`` (``depth``, ``modern``), family by family
    in the order of declaration."""
    return tuple(
        line
        for family in registered()
        for name, lines in family.sweeps
        if name == group
        for line in lines
    )


# ---------------------------------------------------------------------------------------------
# size rules
# ---------------------------------------------------------------------------------------------


def transformer_sizes(width: int) -> List[str]:
    """Transformer layers of width W: embeddings W, FFN 4W, max(2, W // 64) heads (Base at 512,
    Big at 1024)."""
    w, w4, heads = str(width), str(4 * width), str(max(2, width // 64))
    return [
        "--encoder-embed-dim",
        w,
        "--decoder-embed-dim",
        w,
        "--encoder-ffn-embed-dim",
        w4,
        "--decoder-ffn-embed-dim",
        w4,
        "--encoder-attention-heads",
        heads,
        "--decoder-attention-heads",
        heads,
    ]


def embedding_sizes(dim: int) -> List[str]:
    return ["--encoder-embed-dim", str(dim), "--decoder-embed-dim", str(dim)]


def hidden_sizes(dim: int) -> List[str]:
    """Recurrent cells of ``dim`` units (per direction in a bidirectional encoder)."""
    return ["--encoder-hidden-size", str(dim), "--decoder-hidden-size", str(dim)]


#: the tiny sizes of the Transformer families
TINY_TRANSFORMER = (
    "--encoder-embed-dim",
    "16",
    "--decoder-embed-dim",
    "16",
    "--encoder-ffn-embed-dim",
    "32",
    "--decoder-ffn-embed-dim",
    "32",
    "--encoder-attention-heads",
    "2",
    "--decoder-attention-heads",
    "2",
    "--encoder-layers",
    "3",
    "--decoder-layers",
    "2",
)


# ---------------------------------------------------------------------------------------------
# the test matrices
# ---------------------------------------------------------------------------------------------


def tiny_configs() -> List[Tuple[Family, Tiny]]:
    """Every tiny configuration of every family: the precision matrix (benchmarks/precision_matrix.py
    and tests/test_precision*.py), both fairseq stacks and batch invariance (tests/test_stacks.py),
    fully sharded wrapping (tests/test_fully_sharded.py: those of families with Transformer
    layers) and the export check (tests/test_families.py)."""
    return [(family, tiny) for family in registered() for tiny in family.tiny]


def matrix(sample: str) -> List[Tuple[Family, Tiny]]:
    """The rows of a sample matrix (one too slow to run every configuration, e.g. ``"bf16"``):
    the configurations that name it in their ``samples``, and the first configuration of every
    family none of whose configurations does."""
    rows = []
    for family in registered():
        tagged = [t for t in family.tiny if sample in t.samples]
        rows += [(family, t) for t in tagged or family.tiny[:1]]
    return rows


def cover(
    rows: Iterable,
    arch: Callable[[object], str],
    default: Callable[[Family, Tiny], object],
    applies: Callable[[Family], bool] = lambda family: True,
) -> List:
    """A matrix whose rows are a test's own (``rows``; ``arch(row)`` its --arch), and a row
    ``default(family, its first tiny configuration)`` for every family that ``applies`` and that
    no row covers: a family declared tomorrow is a row of the test today."""
    rows = list(rows)
    covered = {getattr(of_arch(arch(row)), "name", None) for row in rows}
    return rows + [
        default(family, family.tiny[0])
        for family in registered()
        if applies(family) and family.name not in covered
    ]
