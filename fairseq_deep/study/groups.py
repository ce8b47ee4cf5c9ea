"""The built-in groups, as data: each a short declaration of one of three kinds of spec,

* :class:`DepthSweep`: families at a list of depths (``--depths`` picks them), one line each in the
  BLEU-against-depth plot (wang, bapna, depth);
* :class:`Rows`: fixed systems at the paper's own sizes (chen, zhou, dou);
* :class:`Grown`: a family's shallow model, its deep one from scratch and the deep one grown from
  the shallow through the depths between (li);

and :func:`expand_group`, which lists a ``--group NAME[:SYS,...]`` value's (baseline, systems).
A new group is one entry of :data:`GROUPS`."""

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple

from ..errors import UserError
from ..models import families
from .systems import System, deep_both_system, depth_system

#: a family of a sweep: (technique: its line in the plot, --arch family, system name prefix)
Family = Tuple[str, str, str]


@dataclass(frozen=True)
class DepthSweep:
    """Every family at every depth: systems ``PREFIX_N``.  ``both``: N encoder and N decoder
    layers (:func:`~.systems.deep_both_system`), else N encoder layers
    (:func:`~.systems.depth_system`)."""

    families: Tuple[Family, ...]
    depths: Tuple[int, ...]  # the default of --depths
    baseline: str
    both: bool = False

    def systems(self, group: str, depths: Optional[List[int]]) -> Tuple[str, List[System]]:
        build = deep_both_system if self.both else depth_system
        return self.baseline, [
            build(f"{prefix}_{n}", family, n, group, technique)
            for technique, family, prefix in self.families
            for n in (depths or self.depths)
        ]


@dataclass(frozen=True)
class Rows:
    """Fixed systems: (name, --arch, flags, technique (None: the name), encoder depth or None);
    --depths does not change them (pick them by name)."""

    rows: Tuple[Tuple[str, str, Tuple[str, ...], Optional[str], Optional[int]], ...]
    baseline: str

    def systems(self, group: str, depths: Optional[List[int]]) -> Tuple[str, List[System]]:
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

    def systems(self, group: str, depths: Optional[List[int]]) -> Tuple[str, List[System]]:
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


DIVERSITY = (
    "--criterion",
    "label_smoothed_cross_entropy_with_diversity",
    "--label-smoothing",
    "0.1",
)

#: the depth group's families: every way of training a deep post-norm (or pre-norm) Transformer of
#: the package at equal depth, N encoder and N decoder layers, since DeepNet, Admin, DS-Init and
#: ReZero deepen both sides (Wang et al. 2019 deepen the encoder only: that is the wang group).
#: Each family declares its lines (``depth_sweep`` of its declaration, models/families.py).
DEPTH_FAMILIES = families.depth_sweep()

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
    "li": Group(
        "Li et al. 2020: a deep pre-norm DLCL grown from a shallow one (fairseq-deep-grow, stages sharing "
        "the budget) against the same depth from scratch and the shallow model",
        Grown("transformer_dlcl", "dlcl", depths=(6, 12)),
    ),
}


def expand_group(spec: str, depths: Optional[Sequence[int]] = None) -> Tuple[str, List[System]]:
    """``NAME`` or ``NAME:SYS,SYS`` (a subset; the baseline is always kept) as (baseline, systems).
    ``depths`` picks the encoder depths of wang and bapna, and the depth N (N encoder and N decoder
    layers) of depth (zhou's are the paper's 2 and 5: pick its systems by name)."""
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
