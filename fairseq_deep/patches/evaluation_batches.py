"""Evaluation covers every sentence: the final partial batch that fairseq drops, given back.

Replaces: ``fairseq.data.data_utils.batch_by_size``, which drops the last batch when its size is
not a multiple of ``--required-batch-size-multiple`` (8 by default: ``fairseq-generate`` on a
100-line test set translates 96; fairseq issue #5036).  :func:`batch_by_size_all` calls it and
adds the dropped sentences as a final, smaller batch.

Versions: fairseq ``main`` of about 2024 (ve-fairseq 0.12.3) drops the batch; the official 0.12.2
does not, and there the shim adds nothing.

Pinned by: tests/test_reliability.py (``test_shim_gives_back_exactly_what_fairseq_drops``,
``test_evaluation_iterator_yields_every_sentence``, ``test_generate_translates_every_line``,
``test_validation_counts_every_sentence``).
"""

import numpy as np
from fairseq.data import data_utils

from .install import fairseq_original, install


def batch_by_size_all(
    indices,
    num_tokens_fn,
    num_tokens_vec=None,
    max_tokens=None,
    max_sentences=None,
    required_batch_size_multiple=1,
    fixed_shapes=None,
):
    """fairseq's ``batch_by_size``, with the sentences of a dropped final batch given back."""
    if not isinstance(indices, np.ndarray):  # an iterator would be consumed by fairseq's call
        indices = np.fromiter(indices, dtype=np.int64, count=-1)
    batches = fairseq_original(batch_by_size_all)(
        indices,
        num_tokens_fn,
        num_tokens_vec=num_tokens_vec,
        max_tokens=max_tokens,
        max_sentences=max_sentences,
        required_batch_size_multiple=required_batch_size_multiple,
        fixed_shapes=fixed_shapes,
    )
    covered = sum(len(b) for b in batches)
    if covered < len(indices):
        seen = np.concatenate(batches) if len(batches) else np.empty(0, dtype=np.int64)
        missing = indices[~np.isin(indices, seen)].astype(np.int64)
        batches = list(batches) + [missing]
    return batches


def apply():
    install(data_utils, "batch_by_size", batch_by_size_all)
