"""Beam search reorders every cached tensor along its batch dimension: one helper for all of them.

fairseq calls ``reorder_encoder_out`` and ``reorder_incremental_state`` with ``new_order``, the
batch rows the beam keeps.  A state here is a dict whose values are tensors, lists of tensors or
None.  Time-major entries (T x B x C, or layers x B x H) have their batch at dimension 1; every
other entry (B x T masks, B x C vectors) at dimension 0.
"""

from typing import Dict, Iterable, List, Optional, Union

from torch import Tensor

Entry = Union[Optional[Tensor], List[Tensor]]

#: the entries of fairseq's ``encoder_out`` dict that are time-major (T x B x C)
ENCODER_OUT_TIME_MAJOR = ("encoder_out", "encoder_states", "fc_results")


def reorder_batch(
    state: Dict[str, Entry], new_order: Tensor, time_major: Iterable[str] = ()
) -> Dict[str, Entry]:
    """A new dict: every tensor of ``state`` reordered along its batch dimension, which is 1 for
    the keys in ``time_major`` and 0 for the others; None stays None."""
    time_major = set(time_major)

    def one(key: str, t: Optional[Tensor]) -> Optional[Tensor]:
        return None if t is None else t.index_select(1 if key in time_major else 0, new_order)

    return {
        key: [one(key, t) for t in value] if isinstance(value, list) else one(key, value)
        for key, value in state.items()
    }


def reorder_encoder_out(
    encoder_out: Dict[str, List[Tensor]], new_order: Tensor, time_major: Iterable[str] = ()
) -> Dict[str, List[Tensor]]:
    """fairseq's ``encoder_out`` dict reordered: its own time-major entries and ``time_major``
    (a model's extra T x B x C entries) along dimension 1, the others along dimension 0."""
    return reorder_batch(encoder_out, new_order, (*ENCODER_OUT_TIME_MAJOR, *time_major))


__all__ = ["ENCODER_OUT_TIME_MAJOR", "reorder_batch", "reorder_encoder_out"]
