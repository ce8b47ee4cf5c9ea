"""The built-in groups, as data: each a short declaration of one of three kinds of spec,

* :class:`DepthSweep`: families at a list of depths (``--depths`` picks them), one line each in the
  BLEU-against-depth plot (wang, bapna, depth, modern);
* :class:`Rows`: fixed systems at the paper's own sizes (chen, zhou, dou);
* :class:`Grown`: a family's shallow model, its deep one from scratch and the deep one grown from
  the shallow through the depths between (li);

and :func:`expand_group`, which lists a ``--group NAME[:SYS,...]`` value's (baseline, systems).
A new group is one entry of :data:`GROUPS`."""

import re
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

from ..errors import UserError
from ..models import families
from ..runs import recipes
from .systems import System, deep_both_system, depth_system, shaped_system

#: a family of a sweep: (technique: its line in the plot, --arch family, system name prefix)
Family = Tuple[str, str, str]

#: a depth of ``--depths``: N (the group's kind: N encoder layers, or N + N), or a shape (E, D)
Depth = Union[int, Tuple[int, int]]


def parse_depths(text: str) -> List[Depth]:
    """``--depths 6,18`` or ``18+18,48+6`` (a shape: encoder + decoder layers), mixed freely."""
    depths: List[Depth] = []
    for word in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\+\s*(\d+)\s*)?", word)
        if not m or int(m.group(1)) < 1 or (m.group(2) and int(m.group(2)) < 1):
            raise UserError(
                f"--depths {text}: expected comma-separated depths N or shapes E+D "
                "(encoder + decoder layers), e.g. 6,18 or 18+18,48+6"
            )
        depths.append(int(m.group(1)) if m.group(2) is None else (int(m.group(1)), int(m.group(2))))
    return depths


def depth_label(depth: Depth) -> str:
    """The suffix of a system's name: ``N``, or ``E+D`` for a shape."""
    return str(depth) if isinstance(depth, int) else f"{depth[0]}+{depth[1]}"


@dataclass(frozen=True)
class DepthSweep:
    """Every family at every depth: systems ``PREFIX_N``.  ``both``: N encoder and N decoder
    layers (:func:`~.systems.deep_both_system`), else N encoder layers
    (:func:`~.systems.depth_system`); a shape E+D (``--depths 48+6``) is E encoder and D decoder
    layers in any sweep (:func:`~.systems.shaped_system`), the system ``PREFIX_E+D``.
    ``baseline`` may name the first depth as ``{depth}`` (``prenorm_{depth}``: pre-norm at the
    first depth that runs)."""

    families: Tuple[Family, ...]
    depths: Tuple[Depth, ...]  # the default of --depths
    baseline: str
    both: bool = False

    def systems(self, group: str, depths: Optional[List[Depth]]) -> Tuple[str, List[System]]:
        depths = depths or list(self.depths)

        def build(prefix, family, depth, technique):
            name = f"{prefix}_{depth_label(depth)}"
            if not isinstance(depth, int):
                return shaped_system(name, family, *depth, group, technique)
            make = deep_both_system if self.both else depth_system
            return make(name, family, depth, group, technique)

        return self.baseline.format(depth=depth_label(depths[0])), [
            build(prefix, family, depth, technique)
            for technique, family, prefix in self.families
            for depth in depths
        ]


@dataclass(frozen=True)
class Rows:
    """Fixed systems: (name, --arch, flags, technique (None: the name), encoder depth or None);
    --depths does not change them (pick them by name)."""

    rows: Tuple[Tuple[str, str, Tuple[str, ...], Optional[str], Optional[int]], ...]
    baseline: str

    def systems(self, group: str, depths: Optional[List[Depth]]) -> Tuple[str, List[System]]:
        return self.baseline, [
            System(name, arch, list(flags), group, name if technique is None else technique, depth)
            for name, arch, flags, technique, depth in self.rows
        ]


@dataclass(frozen=True)
class Grown:
    """Shallow-to-deep training: ``family`` at the shallowest depth, the deepest trained from
    scratch, and the deepest grown from the shallowest through every depth between (--method stack,
    a learning-rate restart at each stage; the stages share the budget equally, so the grown model
    has the same training time or updates as the others).  The deep one is the baseline."""

    family: str
    prefix: str
    depths: Tuple[int, ...]

    def systems(self, group: str, depths: Optional[List[Depth]]) -> Tuple[str, List[System]]:
        if any(not isinstance(d, int) for d in depths or ()):
            raise UserError(
                f"--group {group} grows the encoder: give encoder depths (--depths 6,12), "
                "not shapes E+D"
            )
        depths = sorted(set(depths or self.depths))
        if len(depths) < 2:
            raise UserError(
                f"--group {group} needs two depths at least (--depths SHALLOW,DEEP[,...])"
            )
        shallow, deep = depths[0], depths[-1]
        flags = ["--encoder-layers", str(deep)]
        return f"{self.prefix}_{deep}", [
            depth_system(f"{self.prefix}_{shallow}", self.family, shallow, group, "shallow"),
            System(f"{self.prefix}_{deep}", self.family, list(flags), group, "from scratch", deep),
            System(
                f"{self.prefix}_{'_'.join(map(str, depths))}",
                self.family,
                list(flags),
                group,
                "grown (stack)",
                deep,
                stages=depths[:-1],
            ),
        ]


class Group(NamedTuple):
    title: str
    spec: object  # DepthSweep, Rows or Grown: .systems(group, depths) -> (baseline, systems)


#: Dou et al.'s layer-diversity regularizer (Sec. 3.3) with label smoothing 0.1: a system's flags
DIVERSITY = tuple(recipes.label_smoothed("0.1", "label_smoothed_cross_entropy_with_diversity"))

#: the depth group's families: every way of training a deep post-norm (or pre-norm) Transformer of
#: the package at equal depth, N encoder and N decoder layers, since DeepNet, Admin, DS-Init and
#: ReZero deepen both sides (Wang et al. 2019 deepen the encoder only: that is the wang group).
#: Each family declares its lines (``sweeps["depth"]`` of its declaration, models/families.py).
DEPTH_FAMILIES = families.sweep("depth")

#: the modern group's lines: pre-norm, DLCL and DeepNorm, then the schemes after 2022 (per layer:
#: B2T, Sub-LN, Peri-LN, Mix-LN, DyT, LayerScale; stream-level: DenseFormer, hyper-connections,
#: mHC, ResiDual, ODE RK2 and RK4), each declared beside its presets (``sweeps["modern"]``:
#: models/transformer_dlcl.py, transformer_schemes.py, transformer_streams.py)
MODERN_FAMILIES = families.sweep("modern")

GROUPS = {
    "wang": Group(
        "Wang et al. 2019: post-norm / pre-norm / DLCL / post-norm DLCL against encoder depth",
        DepthSweep(
            (
                ("post-norm", "transformer_postnorm", "postnorm"),
                ("pre-norm", "transformer_prenorm", "prenorm"),
                ("DLCL", "transformer_dlcl", "dlcl"),
                ("post-norm DLCL", "transformer_dlcl_postnorm", "dlcl_postnorm"),
            ),
            depths=(6, 12, 16, 20, 25, 30),
            baseline="postnorm_6",
        ),
    ),
    "bapna": Group(
        "Bapna et al. 2018: post-norm baseline, no residuals, transparent attention against depth",
        DepthSweep(
            (
                ("baseline", "transformer_ta_baseline", "baseline"),
                ("no residuals", "transformer_ta_nores", "nores"),
                ("transparent attention", "transformer_ta", "ta"),
            ),
            depths=(6, 12, 16),
            baseline="baseline_6",
        ),
    ),
    "chen": Group(
        "Chen et al. 2018: Transformer (pre-norm), RNMT+ and the four hybrids",
        Rows(
            tuple(
                (name, arch, (), None, None)
                for name, arch in (
                    ("transformer", "transformer_prenorm"),
                    ("rnmt_plus", "rnmt_plus"),
                    ("hybrid_transformer_rnmt", "hybrid_transformer_rnmt"),
                    ("hybrid_rnmt_transformer", "hybrid_rnmt_transformer"),
                    ("hybrid_cascaded", "hybrid_cascaded"),
                    ("hybrid_multicolumn", "hybrid_multicolumn"),
                )
            ),
            baseline="transformer",
        ),
    ),
    "zhou": Group(
        "Zhou et al. 2016: Deep-Att with and without fast-forward connections at two depths",
        Rows(
            (
                ("noff_2x2", "deep_att_noff_2x2", (), "no F-F", 2),
                ("ff_2x2", "deep_att_ff_2x2", (), "F-F", 2),
                (
                    "noff_5x3",
                    "deep_att_ff",
                    ("--ff-mode", "none", "--encoder-layers", "5", "--decoder-layers", "3"),
                    "no F-F",
                    5,
                ),
                ("ff_5x3", "deep_att_ff_5x3", (), "F-F", 5),
            ),
            baseline="noff_2x2",
        ),
    ),
    "dou": Group(
        "Dou et al. 2018: baseline, dense, linear, iterative, hierarchical, MLA-2/3, +diversity",
        Rows(
            tuple(
                (name, arch, flags, None, None)
                for name, arch, flags in (
                    ("baseline", "transformer_agg_baseline", ()),
                    ("dense", "transformer_dense", ()),
                    ("linear", "transformer_linear_agg", ()),
                    ("iterative", "transformer_iterative_agg", ()),
                    ("hierarchical", "transformer_hier_agg", ()),
                    ("mla2", "transformer_mla2", ()),
                    ("mla3", "transformer_mla3", ()),
                    ("hierarchical+div", "transformer_hier_agg", DIVERSITY),
                )
            ),
            baseline="baseline",
        ),
    ),
    "depth": Group(
        "N + N layers: post-norm, pre-norm, DLCL (Wang et al. 2019), DeepNorm (Wang et al. 2022), "
        "Admin (Liu et al. 2020), DS-Init (Zhang et al. 2019), ReZero (Bachlechner et al. 2020)",
        DepthSweep(DEPTH_FAMILIES, depths=(6, 18), baseline="postnorm_6", both=True),
    ),
    "modern": Group(
        "After 2022, at equal depth and time: B2T (Takase et al. 2023), Sub-LN (Wang et al. 2023), "
        "Peri-LN (Kim et al. 2025), Mix-LN (Li et al. 2025), DyT (Zhu et al. 2025), LayerScale "
        "(Touvron et al. 2021), DenseFormer (Pagliardini et al. 2024), hyper-connections (Zhu et "
        "al. 2025), mHC (Xie et al. 2025), ResiDual (Xie et al. 2023), ODE RK2/RK4 (Li et al. "
        "2022) against pre-norm, DLCL (Wang et al. 2019) and DeepNorm (Wang et al. 2022)",
        DepthSweep(
            MODERN_FAMILIES, depths=((18, 18), (48, 6)), baseline="prenorm_{depth}", both=True
        ),
    ),
    "li": Group(
        "Li et al. 2020: a deep pre-norm DLCL grown from a shallow one (fairseq-deep-grow, stages sharing "
        "the budget) against the same depth from scratch and the shallow model",
        Grown("transformer_dlcl", "dlcl", depths=(6, 12)),
    ),
}


def expand_group(spec: str, depths: Optional[Sequence[Depth]] = None) -> Tuple[str, List[System]]:
    """``NAME`` or ``NAME:SYS,SYS`` (a subset; the baseline is always kept) as (baseline, systems).
    ``depths`` picks the encoder depths of wang and bapna, the depth N (N encoder and N decoder
    layers) of depth and modern, and in any sweep a shape (E, D) (:func:`parse_depths`); zhou's
    are the paper's 2 and 5: pick its systems by name."""
    name, _, subset = spec.partition(":")
    if name not in GROUPS:
        raise UserError(f"--group {name}: unknown group; choose from {', '.join(GROUPS)}")
    group = GROUPS[name].spec
    baseline, systems = group.systems(name, list(depths) if depths else None)
    if baseline not in {s.name for s in systems}:  # a --depths filter dropped it: keep it anyway
        base = group.systems(name, None)[1]
        systems = [s for s in base if s.name == baseline] + systems
    if subset:
        wanted = [w for w in subset.split(",") if w]
        unknown = set(wanted) - {s.name for s in systems}
        if unknown:
            raise UserError(
                f"--group {spec}: no system {', '.join(sorted(unknown))} in {name}; it has "
                f"{', '.join(s.name for s in systems)}"
            )
        systems = [s for s in systems if s.name == baseline or s.name in wanted]
    return baseline, systems
