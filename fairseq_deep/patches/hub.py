"""The hub interface (``Model.from_pretrained``) on sentencepiece data.

Replaces: ``fairseq.hub_utils.from_pretrained``, which without ``bpe=`` gives a model whose
``translate`` passes words to a model that knows sentencepiece pieces (``<unk>`` everywhere, pieces
in the output, no error).  :func:`hub_from_pretrained_checked` calls it, then applies the
``spm.model`` beside the data (with a warning) or stops naming the arguments to give
(:func:`~fairseq_deep.data.sentencepiece_data.sentencepiece_to_apply`, the check
fairseq-deep-interactive makes on the command line); and, on a machine without an accelerator, it
filters torch's ``pin_memory`` warning that every ``translate()`` would print.  Installed at import,
since ``from_pretrained`` runs in the user's own process.

Versions: every fairseq 0.12 (0.12.2 and ve-fairseq 0.12.3).

Pinned by: tests/test_interactive.py (``test_hub_interface_applies_the_sentencepiece_model_beside_the_data``,
``test_hub_interface_refuses_sentencepiece_data_without_a_model``).
"""

import logging

import torch
from fairseq import hub_utils

from ..data.sentencepiece_data import sentencepiece_to_apply
from ..quiet import quiet_pin_memory
from .install import fairseq_original, install

logger = logging.getLogger(
    "fairseq_deep.interactive"
)  # the logger of the same check in -interactive


def hub_from_pretrained_checked(
    model_name_or_path,
    checkpoint_file="model.pt",
    data_name_or_path=".",
    archive_map=None,
    **kwargs,
):
    """fairseq's ``hub_utils.from_pretrained`` (``Model.from_pretrained``, the hub interface), then
    :func:`~fairseq_deep.data.sentencepiece_data.sentencepiece_to_apply`: without ``bpe=`` the hub's
    ``translate`` passes words to a model that knows sentencepiece pieces (``<unk>`` everywhere,
    pieces in the output, no error), so the ``spm.model`` beside the data is applied, with a
    warning, or the load stops naming the arguments to give."""
    from omegaconf import open_dict

    if not torch.cuda.is_available():
        quiet_pin_memory()  # torch's warning on every translate(): fairseq's batches ask for pinned memory
    loaded = fairseq_original(hub_from_pretrained_checked)(
        model_name_or_path, checkpoint_file, data_name_or_path, archive_map, **kwargs
    )
    cfg = loaded["args"]
    if loaded["task"] is None or isinstance(cfg, dict):  # fairseq's vocoders: no text in or out
        return loaded
    model = sentencepiece_to_apply(cfg, how="hub")
    if model is not None:
        logger.warning(
            "the data is sentencepiece data and no bpe= was given: translating with bpe='sentencepiece', "
            "sentencepiece_model=%r (found beside the data; pass bpe= to choose)",
            model,
        )
        with open_dict(cfg):
            cfg.bpe = {"_name": "sentencepiece", "sentencepiece_model": model}
    return loaded


def apply():
    install(hub_utils, "from_pretrained", hub_from_pretrained_checked)
