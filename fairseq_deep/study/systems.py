"""A study's systems: :class:`System` (a row: fairseq-train ``--arch`` plus flags), a ``--system``
value parsed, and the systems of a family at a depth (the presets' names where they exist)."""

import re
import shlex
from dataclasses import dataclass, field
from functools import cached_property
from typing import List, Optional, Sequence, Tuple

from fairseq.models import ARCH_MODEL_REGISTRY

from ..errors import UserError
from ..models import families
from ..models.presets import named_depth

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

    @cached_property
    def spec(self) -> families.Spec:
        """Its --arch resolved, once (its family, preset and depths: :func:`families.spec`); an
        --arch fairseq does not know is a UserError."""
        return families.spec(self.arch)


_NAME = re.compile(r"^[A-Za-z0-9][\w.+-]*$")


def infer_depth(arch: str, flags: Sequence[str]) -> Optional[int]:
    """The encoder depth a system states: ``--encoder-layers N`` (the last one) or an arch named
    ``..._Nl``; None when neither says."""
    depth = named_depth(arch)
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
        raise UserError(
            f"--system {value!r}: expected NAME=ARCH [FLAGS...], e.g. "
            '--system "dlcl=transformer_dlcl --encoder-layers 6"'
        )
    name, arch = words[0].split("=", 1)
    if not _NAME.match(name) or not arch:
        raise UserError(
            f"--system {value!r}: NAME must be letters, digits, '_', '.', '+', '-' "
            "and ARCH must not be empty"
        )
    flags = words[1:]
    if "--arch" in flags or "-a" in flags:
        raise UserError(f"--system {value!r}: give the architecture as NAME=ARCH, not --arch")
    depth = infer_depth(arch, flags)
    # "dlcl_20" and "dlcl_6" are one technique (a line of the BLEU-against-depth plot) at two depths
    m = re.match(r"^(.+?)[_-]?(\d+)l?$", name)
    technique = m.group(1) if m and depth is not None and int(m.group(2)) == depth else name
    return System(name, arch, flags, group, technique=technique, depth=depth)


def preset_depths(arch: str) -> Tuple[int, int]:
    """(encoder, decoder) layers that ``--arch arch`` gives when no flag sets them
    (:attr:`families.Spec.depths`)."""
    return families.spec(arch).depths


def shaped_system(
    name: str, family: str, encoder: int, decoder: int, group: str, technique: str
) -> System:
    """``family`` with ``encoder`` + ``decoder`` layers: the depth-free preset ``family`` where it
    has them, else ``family_{E}l`` where that preset has them (one of another shape, e.g.
    ``transformer_admin_60l``'s 60 + 12 for 60 + 60, or ``transformer_b2t_18l``'s 18 + 18 for
    18 + 6, is not used: a depth-named preset owns its depths), else ``family`` with
    ``--encoder-layers E`` and/or ``--decoder-layers D`` where they differ from its own."""
    own = preset_depths(family)
    named = f"{family}_{encoder}l"
    if own != (encoder, decoder) and named in ARCH_MODEL_REGISTRY:
        if preset_depths(named) == (encoder, decoder):
            return System(name, named, [], group, technique, encoder)
    flags = [] if own[0] == encoder else ["--encoder-layers", str(encoder)]
    flags += [] if own[1] == decoder else ["--decoder-layers", str(decoder)]
    return System(name, family, flags, group, technique, encoder)


def depth_system(name: str, family: str, depth: int, group: str, technique: str) -> System:
    """N encoder layers over the preset's own decoder: ``family`` for its own depth (6),
    ``family_{N}l`` where that preset has N + the same decoder, else ``family --encoder-layers N``
    (:func:`shaped_system`)."""
    return shaped_system(name, family, depth, preset_depths(family)[1], group, technique)


def deep_both_system(name: str, family: str, depth: int, group: str, technique: str) -> System:
    """N encoder and N decoder layers: ``family_{N}l`` where that preset has N + N layers (a
    preset of another shape, e.g. ``transformer_admin_60l``'s 60 + 12, is not used), the
    depth-free ``family`` where it has them, else ``family --encoder-layers N --decoder-layers N``
    (:func:`shaped_system`)."""
    return shaped_system(name, family, depth, depth, group, technique)
