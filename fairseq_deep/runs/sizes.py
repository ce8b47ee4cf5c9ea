"""A model family's size rule: :func:`model_kind` (the family of an ``--arch``) and
:func:`width_flags` (the sizes of ``--width W``, consistent within each family: the study's and the
own-data recipe's ``--width``), both read off the family's declaration
(:mod:`fairseq_deep.models.families`)."""

import logging
from typing import List, Optional

from fairseq.models import ARCH_MODEL_NAME_REGISTRY

from ..models import families

logger = logging.getLogger("fairseq_deep.runs")


def model_kind(arch: str) -> str:
    """The model family of an --arch: transformer, rnmt_plus, rnmt_hybrid, deep_att (what its
    family declares: :mod:`fairseq_deep.models.families`), or other."""
    family = families.of_arch(arch)  # an unknown --arch: a UserError
    if family is not None:
        return family.kind
    # fairseq's own models: its Transformers are sized as ours
    return "transformer" if ARCH_MODEL_NAME_REGISTRY[arch].startswith("transformer") else "other"


def width_flags(arch: str, width: Optional[int]) -> List[str]:
    """Model sizes for ``--width W``, by the size rule of the --arch's family (``sizes`` of its
    declaration): Transformers embed W, FFN 4W, max(2, W // 64) heads (Base at 512, Big at 1024);
    RNMT+ embeddings and LSTM cells W (per direction in the encoder); the hybrids both; Deep-Att
    embeddings W/2 and cells W (the paper's 256/512)."""
    if not width:
        return []
    family = families.of_arch(arch)
    if family is not None:
        return family.sizes(width)
    if model_kind(arch) == "transformer":
        return families.transformer_sizes(width)
    logger.warning("--width: no sizes known for --arch %s; it keeps its own", arch)
    return []
