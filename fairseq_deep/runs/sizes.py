"""A model family's size rule: :func:`model_kind` (the family of an ``--arch``) and
:func:`width_flags` (the sizes of ``--width W``, consistent within each family: the study's and the
own-data recipe's ``--width``)."""

import logging
from typing import List, Optional

from ..errors import UserError

logger = logging.getLogger("fairseq_deep.runs")


def model_kind(arch: str) -> str:
    """The model family of an --arch: transformer, rnmt_plus, rnmt_hybrid, deep_att or other."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    import fairseq_deep  # noqa: F401  (registers the architectures)

    if arch not in ARCH_MODEL_NAME_REGISTRY:
        raise UserError(
            f"--arch {arch}: not a fairseq architecture (fairseq-deep-list-archs lists "
            "this package's)"
        )
    model = ARCH_MODEL_NAME_REGISTRY[arch]
    if model in ("rnmt_plus", "rnmt_hybrid", "deep_att"):
        return model
    return "transformer" if model.startswith("transformer") else "other"


def width_flags(arch: str, width: Optional[int]) -> List[str]:
    """Model sizes for ``--width W``, consistent within each family: Transformers embed W, FFN 4W,
    max(2, W // 64) heads (Base at 512, Big at 1024); RNMT+ embeddings and LSTM cells W (per
    direction in the encoder); the hybrids both; Deep-Att embeddings W/2 and cells W (the paper's
    256/512)."""
    if not width:
        return []
    kind = model_kind(arch)
    heads = str(max(2, width // 64))
    w, w4 = str(width), str(4 * width)
    transformer = [
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
    rnn = ["--encoder-hidden-size", w, "--decoder-hidden-size", w]
    if kind == "transformer":
        return transformer
    if kind == "rnmt_plus":
        return ["--encoder-embed-dim", w, "--decoder-embed-dim", w] + rnn
    if kind == "rnmt_hybrid":
        return transformer + rnn
    if kind == "deep_att":
        return [
            "--encoder-embed-dim",
            str(max(1, width // 2)),
            "--decoder-embed-dim",
            str(max(1, width // 2)),
        ] + rnn
    logger.warning("--width: no sizes known for --arch %s; it keeps its own", arch)
    return []
