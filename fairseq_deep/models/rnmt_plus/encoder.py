"""The RNMT+ encoder (Chen et al. 2018, Sec. 4.1, Fig. 1).

Bidirectional layer-normalized LSTM layers, the forward and backward outputs concatenated after
each layer; residual connections from the third layer up (each layer's output dropped out before
it is added to its input); a projection of the final output to the decoder width.  With
``--rnmt-transparent`` the projection is applied to a learned softmax-weighted sum of all layer
outputs instead (Bapna et al. 2018, Sec. 2.4, M = 1).  As in lingvo's ``MTEncoderBiRNN``, the
weighted sum is over the N layer outputs: the embedding (width E, not 2H) is not an entry.

With ``--dlcl-stacks encoder|both`` the layers read a dynamic linear combination of the layers
below them (Wang et al. 2019, pre-norm Eq. 8, all ``--dlcl-*`` options apply) instead of the
previous layer's output, and the projection reads the combination's last row.  The embedding has
another width (E, not 2H), so y_0 of Eq. 8 is the *first layer's* output: layer 1 reads the
embedding, layer l >= 2 reads sum_{k<l} W[l-1, k] LN(y_k) over the layer outputs y_1..y_{l-1}
(each the residual sum where the layer has a residual connection).  The loop is the decoder's too
(:mod:`.stack`).
"""

from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.models import FairseqEncoder
from torch import Tensor, nn

from ...modules.common.growth import declare_stack
from ...modules.common.reorder import reorder_encoder_out
from ...modules.histories.layer_history import LayerHistory
from ...modules.histories.transparent_attention import TransparentReadout
from ...modules.recurrent.ln_lstm import LayerNormLSTM
from .config import RNMTPlusConfig
from .stack import build_history, layer_output, residual_role, run_stack


class RNMTPlusEncoder(FairseqEncoder):
    def __init__(
        self,
        args,
        dictionary,
        embed_tokens: nn.Embedding,
        output_dim: int,
        num_layers: Optional[int] = None,
    ):
        super().__init__(dictionary)
        args = RNMTPlusConfig.from_namespace(
            args
        )  # the dataclass defaults where a namespace has none
        self.padding_idx = embed_tokens.padding_idx
        self.embed_tokens = embed_tokens
        self.max_source_positions = args.max_source_positions
        self.dropout = args.dropout
        self.num_layers = num_layers if num_layers is not None else args.encoder_layers
        self.residual_start = args.rnmt_encoder_residual_start
        H = args.encoder_hidden_size
        E = embed_tokens.embedding_dim
        if self.num_layers < 1:
            raise ValueError(f"--encoder-layers must be at least 1, got {self.num_layers}")
        if self.residual_start == 1 and E != 2 * H:
            raise ValueError(
                f"--rnmt-encoder-residual-start 1 adds the embedding ({E}) to the first layer's "
                f"output ({2 * H}): use 2 or more, or --encoder-embed-dim {2 * H}"
            )
        init = args.rnmt_init_scale or None
        self.layers = nn.ModuleList(
            LayerNormLSTM(
                E if i == 0 else 2 * H,
                H,
                bidirectional=True,
                cell_clip=args.rnmt_cell_clip,
                output_tanh=args.rnmt_output_tanh,
                init_scale=init,
                layer_norm=not args.rnmt_no_layer_norm,
                impl=str(args.rnmt_lstm_impl),
            )
            for i in range(self.num_layers)
        )
        self.output_dim = output_dim
        self.output_projection = nn.Linear(2 * H, output_dim)
        self.transparent_attention = None
        if args.rnmt_transparent:
            self.transparent_attention = TransparentReadout.from_options(args, self.num_layers, 1)
        self.history = build_history(args, "encoder", self.num_layers, 2 * H)
        if self.transparent_attention is not None and type(self.history) is not LayerHistory:
            raise ValueError(
                "--rnmt-transparent and --dlcl-stacks encoder/both both choose what the "
                "decoder reads of the encoder layers: use one of them"
            )

    def forward(
        self,
        src_tokens: Tensor,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
    ) -> Dict[str, List[Tensor]]:
        padding_mask = src_tokens.eq(self.padding_idx)  # B x T
        embedding = self.embed_tokens(src_tokens)
        x = F.dropout(embedding, p=self.dropout, training=self.training).transpose(0, 1)
        time_mask = padding_mask.t() if padding_mask.any() else None  # T x B

        def run_layer(i: int, x: Tensor) -> Tensor:
            y, _ = self.layers[i](x, time_mask)
            return layer_output(i, x, y, self.residual_start, self.dropout, self.training)

        keep = return_all_hiddens or self.transparent_attention is not None
        outputs: Optional[List[Tensor]] = [] if keep else None  # y_1..y_L
        states = run_stack(self.history, run_layer(0, x), self.num_layers, run_layer, outputs)
        if self.transparent_attention is not None:  # the readout of Bapna et al. Eq. 1-2, M = 1
            readout = self.transparent_attention(outputs)[0]
        else:
            readout = states.readout()
        encoder_states = [x, *outputs] if return_all_hiddens else []
        x = self.output_projection(readout)
        if time_mask is not None:
            x = x.masked_fill(time_mask.unsqueeze(-1), 0.0)
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [padding_mask],  # B x T
            "encoder_embedding": [embedding],  # B x T x E
            "encoder_states": encoder_states,  # List[T x B x C]: embedding, then each layer
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [
                src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1)
            ],
        }

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order: Tensor):
        return reorder_encoder_out(encoder_out, new_order)

    def max_positions(self):
        return self.max_source_positions


# fairseq-deep-grow (modules/common/growth.py): the units of the history and of the transparent readout
# are the layer outputs (unit 0: the first layer's); a copied layer keeps its residual connection
declare_stack(
    RNMTPlusEncoder,
    layers=lambda stack: {"layers": stack.layers},
    unit_offset=0,
    layer_role=residual_role,
)
