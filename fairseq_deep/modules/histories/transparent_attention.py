"""Transparent attention (Bapna et al. 2018, Sec. 2.4, Eq. 1-2): M learned mixtures of all layers.

A stack of N layers (plus its embedding output, entry 0) is read by M attention modules; module j
reads

    z^j = sum_{i=0..N} s_{i,j} h^i,      s_{:,j} = softmax_i(dropout(W)_{:,j})          (Eq. 1, 2)

with W an (N+1) x M matrix of learned logits and dropout applied to W itself ("we apply dropout
to W since we empirically found it helpful to stabilize training").  As in the authors' lingvo
``WeightedSumLayer``, the logits are W + 1/(N+1) when dropout is applied (the constant cancels in
the softmax, but makes dropout act from the start, where W = 0).  For the Transformer M is the
number of decoder layers; for RNMT+ M = 1 and a projection follows the combination (``out_proj``).

The parameter is named ``weight`` so that a model holding this module as ``transparent_attention``
has the state-dict key ``...transparent_attention.weight`` that the layer-weight exporter
(:mod:`fairseq_deep.diagnostics.layer_weights`) recognises through :data:`TRANSPARENT_WEIGHTS`:
shape (N+1) x M, softmax over dim 0.
"""

import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn.functional as F
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from torch import Tensor, nn

from ..common.growth import LAYERS, GrownState, StackGrowth, declare_part
from ..common.layer_weight_kinds import LayerWeightKind, layer_labels

INITS = ("uniform", "top")


@dataclass
class TransparentReadoutConfig(FairseqDataclass):
    """The ``--ta-dropout`` and ``--ta-init`` options of a :class:`TransparentReadout`, shared by
    every model with transparent attention (Transformer and RNMT+: one default, the paper's)."""

    ta_dropout: float = field(
        default=0.1,
        metadata={
            "architecture": False,
            "help": "dropout on the (N+1) x M transparent attention logits W (Bapna et al. 2018, "
            "Sec. 2.4; 0.1 as in the authors' lingvo WeightedSumLayer)",
        },
    )
    ta_init: ChoiceEnum(list(INITS)) = field(
        default="uniform",
        metadata={
            "architecture": False,
            "help": "initial weights s: uniform over the N+1 encoder outputs (W = 0), or "
            "top = almost all mass on the top layer (starts close to the plain model)",
        },
    )


class TransparentReadout(nn.Module):
    """``num_readouts`` softmax-weighted sums of ``num_entries`` tensors of the same shape.

    * ``dropout``: rate of the dropout on the logits W (training only).
    * ``init``: ``uniform`` (W = 0: every readout starts as the mean of all entries) or ``top``
      (every readout starts with almost all of its mass on the last entry, i.e. close to the plain
      model that reads only the top layer; the logits of the other entries are ``-top_margin``).
    * ``out_proj``: an optional module applied to each combination (RNMT+: the encoder's final
      projection, applied after the combination as in Sec. 2.4).

    ``forward(entries)`` returns the list of the M readouts.  Each is a running sum over references
    to the entries: no stacked copy of the N+1 entries is made.
    """

    @classmethod
    def from_options(
        cls, cfg, num_entries: int, num_readouts: int, out_proj: Optional[nn.Module] = None
    ) -> "TransparentReadout":
        """The readout under the ``--ta-*`` options of ``cfg`` (:class:`TransparentReadoutConfig`)."""
        opts = TransparentReadoutConfig.from_namespace(cfg)
        return cls(
            num_entries,
            num_readouts,
            dropout=opts.ta_dropout,
            out_proj=out_proj,
            init=str(opts.ta_init),
        )

    def __init__(
        self,
        num_entries: int,
        num_readouts: int,
        dropout: float = 0.0,
        out_proj: Optional[nn.Module] = None,
        init: str = "uniform",
        top_margin: float = 6.0,
    ):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"--ta-init must be one of {INITS}, got {init!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"--ta-dropout must be in [0, 1), got {dropout}")
        self.num_entries = num_entries
        self.num_readouts = num_readouts
        self.dropout = dropout
        weight = torch.zeros(num_entries, num_readouts)
        if init == "top":
            weight[:-1] = -top_margin
        self.weight = nn.Parameter(weight)
        self.out_proj = out_proj

    def extra_repr(self) -> str:
        return f"entries={self.num_entries}, readouts={self.num_readouts}, dropout={self.dropout}"

    def weights(self) -> Tensor:
        """s (Eq. 1), (N+1) x M, without dropout: what the model reads at inference."""
        return torch.softmax(self.weight.float(), dim=0)

    def forward(self, entries: List[Tensor]) -> List[Tensor]:
        if len(entries) != self.num_entries:
            raise ValueError(
                f"transparent attention was built for {self.num_entries} entries (embedding + "
                f"{self.num_entries - 1} layers) but got {len(entries)}"
            )
        w = self.weight
        if self.training and self.dropout > 0:
            w = F.dropout(w + 1.0 / self.num_entries, p=self.dropout, training=True)
        s = torch.softmax(w.float(), dim=0).to(entries[0].dtype)
        readouts = []
        for j in range(self.num_readouts):
            z = entries[0] * s[0, j]
            for i in range(1, self.num_entries):
                z = z + entries[i] * s[i, j]
            if self.out_proj is not None:
                z = self.out_proj(z)
            readouts.append(z)
        return readouts


# ---------------------------------------------------------------------------------------------
# Growing (fairseq-deep-grow, modules/common/growth.py): the (N+1) x M logits when the depth changes
# ---------------------------------------------------------------------------------------------


def _grow_readout(readout: TransparentReadout, prefix: str, stack: StackGrowth, grown: GrownState):
    """Entry u takes the logit of its source entry minus log(number of its copies), so each old
    entry keeps its share of every mixture (exactly, when the copies are equal); where the M
    readouts are one per decoder layer (transformer_ta), column j is that of decoder layer j's
    source."""
    key = prefix + "weight"
    old_w = grown.old[key]
    w = grown.new[key].clone()
    units = range(w.size(0))
    counts = stack.copies(units)
    columns = list(range(w.size(1)))
    decoder = grown.stacks.get("decoder")
    if (
        decoder is not None
        and w.size(1) == decoder.new_depth
        and old_w.size(1) == decoder.old_depth
    ):
        columns = [
            decoder.value_source(j + 1) - 1
            if decoder.method == "identity" and j >= decoder.old_depth
            else (
                decoder.layer_map[j] if decoder.layer_map[j] is not None else decoder.old_depth - 1
            )
            for j in columns
        ]
    for u in units:
        v = stack.value_source(u)
        for j, c in enumerate(columns):
            w[u, j] = old_w[v, c] - math.log(counts[v])
    grown.set(key, w, "transparent weights: source logits - log(copies)")


# every readout reads the new layers: --method identity holds when they are the identity
declare_part(TransparentReadout, grow=_grow_readout, identity=lambda readout: LAYERS)


# fairseq-deep-layer-weights (Bapna et al. 2018, Fig. 1-4): ``transparent_attention.weight``,
# (N+1) x M: one column per attention module j, softmax over the encoder layers (dim 0); plotted
# transposed, so that as for DLCL each row is a reader and the columns are y_0 ... y_N


def _ta_matches(key: str, w: Tensor) -> bool:
    return key.endswith("transparent_attention.weight") and w.dim() == 2


def _ta_effective(w: Tensor, cfg):
    s = torch.softmax(w.detach().float().cpu(), dim=0).t().contiguous()
    return s, torch.ones_like(s, dtype=torch.bool)


def _ta_labels(m: Tensor):
    return [f"dec. attn {j + 1}" for j in range(m.shape[0])], layer_labels(m.shape[1])


TRANSPARENT_WEIGHTS = LayerWeightKind(
    name="transparent_attention",
    suffix="transparent_attention.weight",
    description="transparent attention (Bapna et al. 2018, Eq. 1-2); stored (N+1) x M, "
    "softmax over dim 0, shown transposed (rows = decoder attention modules)",
    matches=_ta_matches,
    effective=_ta_effective,
    labels=_ta_labels,
    mask_small=False,
)
