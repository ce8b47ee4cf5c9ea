"""DenseFormer (Pagliardini, Mohtashami, Fleuret, Jaggi, NeurIPS 2024, "DenseFormer: Enhancing
Information Flow in Transformers via Depth Weighted Averaging", Sec. 3, Eq. 1-2).

After block i (1-based) a depth-weighted average (DWA) of the embedding X_0 and the block outputs
X_1 .. X_i is the next block's input (and, after the last block, the stack's output):

    Y_i = sum_{j <= i} alpha_{i,j} X_j,   X_{i+1} = B_{i+1}(Y_i)

the alpha learned, initialised to the residual network (alpha_{i,i} = 1, all others 0), so that
a DenseFormer starts as the plain Transformer, bit for bit.  Two sparsity options (Sec. 3.2):

* dilation k: DWA i reads only the X_j with j = i (mod k) (for k > 1 the embedding only in the
  DWAs of i = 0 (mod k));
* period p: a DWA only after every p-th block (i = 0 mod p); elsewhere the next block reads X_i
  itself, and when the depth is not a multiple of p the stack returns the last block's output.

"kxp-DenseFormer" in the paper; 1x1 is DenseFormer proper.  These are the authors' package's
rules (``denseformer`` on GitHub, epfml/DenseFormer, installable from its repository, not from
PyPI).

It is DLCL's pre-norm combination (Wang et al. 2019, Eq. 8) with three differences, and the
module is a :class:`~fairseq_deep.modules.histories.layer_history.DynamicLinearCombination`: no layer norm
of the entries (DLCL normalises every y_k before weighting it; DWA averages the raw block outputs,
whose blocks are pre-norm Transformer blocks with their own residual), initialisation at the
residual network (DLCL: the mean of the layers below, ``--dlcl-init avg``), and the dilation and
period masks (DLCL's every row reads every layer below).  The readout is the last DWA in both;
DLCL's post-norm form (Eq. 9, a layer norm per row that replaces each layer's last norm) has no
counterpart: on a post-norm stack DenseFormer averages the layers' normalised outputs, which the
paper (pre-norm GPT models) does not test.

The weights are saved as ``dwa_weight`` (not DLCL's ``weight``): entries outside the masks are
never read, so neither a DLCL checkpoint loads into a DenseFormer nor the layer-weight plots take
one for the other.
"""

from dataclasses import dataclass, field
from typing import Tuple

import torch
from fairseq.dataclass import FairseqDataclass
from torch import Tensor, nn

from ..common.growth import READOUT, GrowError, GrownState, StackGrowth, declare_part
from ..common.layer_weight_kinds import LayerWeightKind, cfg_value
from ..histories.layer_history import DynamicLinearCombination, grow_rows, history_labels


@dataclass
class DenseFormerConfig(FairseqDataclass):
    """The ``--denseformer*`` options (Pagliardini et al. 2024)."""

    denseformer: bool = field(
        default=False,
        metadata={
            "help": "DenseFormer (Pagliardini et al. 2024): a learned depth-weighted average of "
            "the embedding and all earlier blocks' outputs after every block, from the residual "
            "network (both stacks)"
        },
    )
    denseformer_dilation: int = field(
        default=1,
        metadata={"help": "DWA i reads only the outputs j = i (mod k) (the paper's k, Sec. 3.2)"},
    )
    denseformer_period: int = field(
        default=1,
        metadata={"help": "a DWA only after every p-th block (the paper's p, Sec. 3.2)"},
    )


def dwa_structure(num_layers: int, dilation: int, period: int) -> Tuple[Tensor, Tensor]:
    """(learned, fixed), (L+1) x (L+1): ``learned`` is 1 where DWA row r (the input of block
    r+1; row L: the readout) has a weight for X_j, ``fixed`` the identity of the rows without a
    DWA (row 0, the embedding, and the rows r != 0 mod p)."""
    n = num_layers + 1
    learned, fixed = torch.zeros(n, n), torch.zeros(n, n)
    for r in range(n):
        if r >= 1 and r % period == 0:
            learned[r, r % dilation : r + 1 : dilation] = 1.0
        else:
            fixed[r, r] = 1.0
    return learned, fixed


class DenseFormerHistory(DynamicLinearCombination):
    """The DWA weights of one stack (module docstring)."""

    combination = (
        "DenseFormer: every block reads a learned depth-weighted average of the blocks below it "
        "(Pagliardini et al. 2024)"
    )

    def __init__(self, num_layers: int, embed_dim: int, dilation: int = 1, period: int = 1):
        super().__init__(num_layers, embed_dim, True, init="residual", layer_norm=False)
        self.dilation, self.period = dilation, period
        learned, fixed = dwa_structure(num_layers, dilation, period)
        self.register_buffer("dwa_learned", learned, persistent=False)
        self.register_buffer("dwa_fixed", fixed, persistent=False)
        del self.weight  # DLCL's parameter: DenseFormer's has its own name (module docstring)
        self.dwa_weight = nn.Parameter(torch.eye(num_layers + 1) * learned)

    def weights(self) -> Tensor:
        return self.dwa_weight * self.dwa_learned + self.dwa_fixed

    row_weights = weights


def build_denseformer(cfg, num_layers: int, embed_dim: int) -> DenseFormerHistory:
    opts = DenseFormerConfig.from_namespace(cfg)
    return DenseFormerHistory(
        num_layers, embed_dim, opts.denseformer_dilation, opts.denseformer_period
    )


# ---------------------------------------------------------------------------------------------
# fairseq-deep-grow: DenseFormer proper (1x1) grows as DLCL's rows; the masks of k x p would move
# ---------------------------------------------------------------------------------------------


def _sparse(history: DenseFormerHistory) -> str:
    return (
        f"its DenseFormer has dilation {history.dilation} and period {history.period}, whose DWA "
        "rows and columns move with the depth"
    )


def _grow(history: DenseFormerHistory, prefix: str, stack: StackGrowth, grown: GrownState):
    if (history.dilation, history.period) != (1, 1) and stack.grows:
        raise GrowError(f"the {stack.name} cannot grow: {_sparse(history)}")
    grow_rows(prefix + "dwa_weight", stack, grown)


declare_part(
    DenseFormerHistory,
    grow=_grow,
    identity=lambda h: READOUT if (h.dilation, h.period) == (1, 1) else _sparse(h),
)


# (c) DenseFormer, Pagliardini et al. 2024 Eq. 1-2: `<stack>.history.dwa_weight`, (L+1) x (L+1):
# row r the DWA after block r (row 0 the embedding, row L the readout), as DLCL's rows; the rows
# without a DWA (--denseformer-period) are the identity, the entries outside the dilation absent.


def _dwa_matches(key: str, w: Tensor) -> bool:
    return key.endswith("history.dwa_weight") and w.dim() == 2 and w.shape[0] == w.shape[1]


def _dwa_effective(w: Tensor, cfg):
    learned, fixed = dwa_structure(
        w.shape[0] - 1,
        int(cfg_value(cfg, "denseformer_dilation", 1)),
        int(cfg_value(cfg, "denseformer_period", 1)),
    )
    return w.detach().float().cpu() * learned + fixed, (learned + fixed) > 0


DENSEFORMER_WEIGHTS = LayerWeightKind(
    name="denseformer",
    suffix="history.dwa_weight",
    description="DenseFormer's depth-weighted averages (Pagliardini et al. 2024, Eq. 1-2); rows "
    "without a DWA (--denseformer-period) are the identity",
    matches=_dwa_matches,
    effective=_dwa_effective,
    labels=history_labels,
)
