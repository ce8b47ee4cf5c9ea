"""A model family's size rule for an ``--arch`` string: :func:`model_kind` and :func:`width_flags`
(the sizes of ``--width W``, consistent within each family: the study's and the own-data recipe's
``--width``), each resolving the --arch once and asking its :class:`~fairseq_deep.models.families.Spec`
(``kind``, ``width``); a tool that holds the Spec asks it directly."""

from typing import List, Optional

from ..models import families


def model_kind(arch: str) -> str:
    """The model family of an --arch: transformer, rnmt_plus, rnmt_hybrid, deep_att (what its
    family declares: :mod:`fairseq_deep.models.families`), or other (:attr:`Spec.kind`)."""
    return families.spec(arch).kind  # an unknown --arch: a UserError


def width_flags(arch: str, width: Optional[int]) -> List[str]:
    """Model sizes for ``--width W``, by the size rule of the --arch's family (``sizes`` of its
    declaration: :meth:`Spec.width`): Transformers embed W, FFN 4W, max(2, W // 64) heads (Base at
    512, Big at 1024); RNMT+ embeddings and LSTM cells W (per direction in the encoder); the hybrids
    both; Deep-Att embeddings W/2 and cells W (the paper's 256/512)."""
    return families.spec(arch).width(width) if width else []
