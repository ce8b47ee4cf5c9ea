"""Interleaved bi-directional encoder and interface of Deep-Att / Deep-ED (Zhou et al. 2016,
Sec. 3.1, Eq. 3, 5-8).

One or two independent columns of F-F LSTM layers over the source embeddings.  In column c
(0-based) layer k (0-based) runs backward when (k + c) is odd: the direction alternates with the
layer (the term (-1)^k of Eq. 3) and the first layers of the two columns run in opposite directions.
``--ff-encoder-directions forward`` runs every layer forward ("Uni", Table 4).

Interface (Eq. 7, 8), computed once per sentence and returned in ``encoder_out["encoder_out"]``:

* ``att``: e_t = [h^{a1}_t, h^{a2}_t, f^{a1}_t, f^{a2}_t] of the top layers, projected by W_p to
  1/``ff_proj_ratio`` of its size (T x B x C).  The decoder attends over it (Eq. 9).
* ``ed``: the static vector [h_m of column 1, Max_t h of column 2, Max_t f of column 1, Max_t f of
  column 2] (1 x B x C).  h_m is column 1's top h at the last real step of its processing order
  (the last source word when that layer runs forward, as with the paper's n_e = 9).

Without F-F (``--ff-mode none``) the f parts are left out.  fairseq left-pads the source: the
encoder moves each sentence to the front (right padding), reverses backward layers within each
sentence's length, and hands the interface back in the layout of ``src_tokens``.

The interface holds f, which does not fit float16 (see :mod:`fairseq_deep.modules.recurrent.fast_forward_lstm`):
with float16/bfloat16 parameters or under autocast it is computed and returned in float32.  The
encoder's parameters stay float32 when the model is cast to float16 (``--fp16``; issue 24): their
gradients pass the float16 range (:class:`~fairseq_deep.modules.common.precision.Float32UnderHalf`).
"""

from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.models import FairseqEncoder
from torch import Tensor, nn

from ...modules.common.growth import declare_stack
from ...modules.common.precision import Float32UnderHalf
from ...modules.common.reorder import reorder_encoder_out
from ...modules.recurrent.fast_forward_lstm import FFLSTMStack, gather_time, wide_linear
from .config import DeepAttConfig


def interface_dim(hidden: int, columns: int, ff_mode: str) -> int:
    """Size of e_t (Eq. 7)."""
    f_part = 4 * hidden * columns if ff_mode != "none" else 0
    return hidden * columns + f_part


def column_directions(layers: int, column: int, interleaved: bool) -> List[bool]:
    """True = backward.  Column 0 starts forward, column 1 backward (when interleaved)."""
    return [interleaved and (k + column) % 2 == 1 for k in range(layers)]


def to_front_index(pad_mask: Tensor) -> Tensor:
    """T x B index putting each sentence's real tokens first (in order), then its pads."""
    B, T = pad_mask.shape
    key = pad_mask.long() * T + torch.arange(T, device=pad_mask.device)[None, :]
    return key.argsort(dim=1).t()


class DeepAttEncoder(Float32UnderHalf, FairseqEncoder):
    """Its parameters stay float32 under ``.half()`` (--fp16): see the module docstring."""

    def __init__(self, args, dictionary, embed_tokens: nn.Embedding):
        super().__init__(dictionary)
        args = DeepAttConfig.from_namespace(
            args
        )  # the dataclass defaults where a namespace has none
        self.embed_tokens = embed_tokens
        self.padding_idx = embed_tokens.padding_idx
        self.max_source_positions = args.max_source_positions
        self.interface = args.ff_interface
        self.ff_mode = args.ff_mode
        self.dropout = args.dropout
        H, n, cols = args.encoder_hidden_size, args.encoder_layers, args.ff_encoder_columns
        if cols not in (1, 2):
            raise ValueError(f"--ff-encoder-columns must be 1 or 2, got {cols}")
        interleaved = args.ff_encoder_directions == "interleaved"
        self.columns = nn.ModuleList(
            FFLSTMStack(
                embed_tokens.embedding_dim,
                H,
                column_directions(n, c, interleaved),
                ff_mode=args.ff_mode,
                dropout=args.dropout,
                impl=args.deep_att_cell_impl,
            )
            for c in range(cols)
        )
        e_dim = interface_dim(H, cols, args.ff_mode)
        if args.ff_interface == "att" and args.ff_proj_ratio > 1:
            if e_dim % args.ff_proj_ratio:
                raise ValueError(
                    f"--ff-proj-ratio {args.ff_proj_ratio} does not divide the "
                    f"interface size {e_dim}"
                )
            self.proj = nn.Linear(e_dim, e_dim // args.ff_proj_ratio, bias=False)  # W_p
            self.output_dim = e_dim // args.ff_proj_ratio
        else:
            self.proj = None
            self.output_dim = e_dim

    def drop(self, h: Tensor) -> Tensor:
        return F.dropout(h, p=self.dropout, training=self.training)

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None, **unused):
        pad_mask = src_tokens.eq(self.padding_idx)  # B x T
        lengths = (~pad_mask).long().sum(1)
        x = self.embed_tokens(src_tokens).transpose(0, 1)  # T x B x E
        has_pads = bool(pad_mask.any())
        if has_pads:
            front = to_front_index(pad_mask)
            x = gather_time(x, front)
        outs = [col(x, lengths) for col in self.columns]  # (f, h, states, last_h)
        if self.interface == "ed":
            e = self._static(outs, lengths, x.size(0))
            return self._out(e[None], [])
        hs = [self.drop(h) for _, h, _, _ in outs]
        fs = [f for f, _, _, _ in outs] if self.ff_mode != "none" else []
        e = torch.cat(hs + fs, dim=-1)
        if self.proj is not None:
            e = wide_linear(
                self.proj, e
            )  # e holds f: float32 under --fp16/--amp (fast_forward_lstm)
        if has_pads:  # back to the layout of src_tokens
            e = gather_time(e, front.argsort(dim=0))
        return self._out(e, [pad_mask] if has_pads else [])

    def _static(self, outs, lengths: Tensor, T: int) -> Tensor:
        """Deep-ED's e (Eq. 7): B x C."""
        pad = (torch.arange(T, device=lengths.device)[:, None] >= lengths[None, :])[:, :, None]

        def tmax(v):
            return v.masked_fill(pad, float("-inf")).max(dim=0).values

        parts = [self.drop(outs[0][3])]
        if len(outs) > 1:
            parts.append(tmax(self.drop(outs[1][1])))
        if self.ff_mode != "none":
            parts += [tmax(f) for f, _, _, _ in outs]
        return torch.cat(parts, dim=-1)

    @staticmethod
    def _out(e: Tensor, mask: List[Tensor]) -> Dict[str, List[Tensor]]:
        return {
            "encoder_out": [e],  # T x B x C (Deep-Att) or 1 x B x C (Deep-ED)
            "encoder_padding_mask": mask,  # B x T, True = pad; empty when nothing is padded
            "encoder_embedding": [],
            "encoder_states": [],
            "src_tokens": [],
            "src_lengths": [],
        }

    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order: Tensor):
        """Every tensor of every list follows the beam (``encoder_out`` is T x B x C or 1 x B x C)."""
        return reorder_encoder_out(encoder_out, new_order)

    def max_positions(self):
        return self.max_source_positions


# fairseq-deep-grow (modules/common/growth.py): each column is a stack of its own, grown by the same map
# (a copy keeps its layer's direction: FFLSTMLayer's role)
declare_stack(
    DeepAttEncoder,
    layers=lambda stack: {
        f"columns.{c}.layers": column.layers for c, column in enumerate(stack.columns)
    },
)
