"""How a layer reads the layers below it: the one idea under every paper of fairseq_deep.

A *layer history* owns the parameters of a connection scheme (weights, layer norms) and hands out
a fresh :class:`HistoryState` for every forward pass.  The state holds the outputs y_0 (embedding)
... y_l of the layers run so far and answers two questions:

* ``next_input()``: the input x_{l+1} of the next layer;
* ``readout()``: what the stack returns after its last layer.

Nothing is stored on the module during ``forward``, so a history is re-entrant (activation
checkpointing, two forward passes in flight) and each pass starts clean.

Memory: each y_k (or its layer norm) is computed once when pushed and kept by reference; a
combination is a running ``sum_k w_k * e_k`` over those references.  Autograd then keeps one tensor
per layer, not the O(L^2) copies that re-stacking all entries at every layer would keep.
"""

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.modules import LayerNorm
from torch import Tensor, nn

from ..common.growth import LAYERS, READOUT, GrownState, StackGrowth, declare_part
from ..common.layer_weight_kinds import LayerWeightKind, cfg_value, layer_labels
from ..common.precision import no_autocast

#: the warnings of fairseq-deep-layer-weights about a DLCL matrix (its kind is declared here)
logger = logging.getLogger("fairseq_deep.diagnostics.layer_weights")


class HistoryState:
    """One forward pass through a stack, created by :meth:`LayerHistory.start` with the embedding
    output y_0: the interface the layer loop reads.  ``count`` is the number of outputs pushed so
    far, the embedding included.  Every history's state (residual, DLCL, aggregation) derives from
    this class."""

    def __init__(self, history: "LayerHistory", embedding: Tensor):
        self.history = history
        self.count = 1

    def push(self, y: Tensor) -> None:
        """Record the output of the next layer."""
        raise NotImplementedError

    def next_input(self) -> Tensor:
        """The input of the next layer."""
        raise NotImplementedError

    def readout(self) -> Tensor:
        """What the stack returns after its last layer."""
        return self.next_input()


class EntryState(HistoryState):
    """The state of a history that combines entries e_k = ``history.entry(k, y_k)``: it keeps all
    of them (``history.keeps_all_entries``) or only the last one (the residual network)."""

    def __init__(self, history: "LayerHistory", embedding: Tensor):
        super().__init__(history, embedding)
        self.entries: List[Tensor] = []
        self.count = 0
        self.push(embedding)

    def push(self, y: Tensor) -> None:
        entry = self.history.entry(self.count, y)
        if self.history.keeps_all_entries:
            self.entries.append(entry)
        else:
            self.entries = [entry]
        self.count += 1

    def next_input(self) -> Tensor:
        """The input of the next layer; after the last layer, the stack's readout."""
        return self.history.combine(self.count - 1, self.entries)

    readout = next_input


class LayerHistory(nn.Module):
    """The residual network (He et al. 2016): layer l+1 reads y_l, the stack returns y_L.

    This is the plain Transformer's connection, and the special case of every other history:
    DLCL with W[l+1, l] = 1 and all other weights 0 (Wang et al. 2019, Sec. 3).
    """

    #: memory policy of :class:`EntryState`: keep every entry (a combination reads them all) or
    #: only the last one
    keeps_all_entries = False
    #: whether what layer l reads depends on l (its row of weights, its place in a tree): skipping
    #: a layer (layerdrop) would then hand layers the wrong rows, so the stacks refuse layerdrop
    indexed_by_depth = False

    #: what a layer reads under this history, for a history that is not the residual one (the
    #: reason fairseq-deep-export gives for refusing it)
    combination = "a combination of earlier layers"

    def __init__(self, num_layers: int):
        super().__init__()
        self.num_layers = num_layers

    def not_residual(self) -> Optional[str]:
        """None for the residual network itself, else what this history does instead
        (``combination``): fairseq's own Transformer has the residual network only."""
        return None if type(self) is LayerHistory else self.combination

    def start(self, embedding: Tensor) -> HistoryState:
        return EntryState(self, embedding)

    def entry(self, k: int, y: Tensor) -> Tensor:
        """What is kept of y_k (computed once, when it is pushed)."""
        return y

    def combine(self, row: int, entries: List[Tensor]) -> Tensor:
        """Row `row` (0..L) combines y_0..y_row into the input of layer row+1 (row L: readout)."""
        return entries[-1]

    def hidden(self, y: Tensor) -> Tensor:
        """What a layer's output y is to the rest of the model (the encoder states transparent
        attention reads, the decoder's inner states): y itself, but for a history whose layers
        carry several streams (modules/schemes/residual_streams.py)."""
        return y


INITS = ("avg", "one", "residual")


class DynamicLinearCombination(LayerHistory):
    """Dynamic linear combination of layers, DLCL (Wang et al. 2019, Eq. 7-9).

    ``x_{l+1} = G(y_0, ..., y_l)`` with one weight W[l+1, k] per (layer, earlier layer):

    * pre-norm (Eq. 8):  G = sum_k W[l+1, k] * LN_k(y_k); one LN per *incoming* layer k, applied
      once when y_k is pushed.  The embedding's entry gets no LN unless ``normalize_embed``
      (as the authors' code); the stack's final LN (footnote 3) stays with the encoder/decoder.
    * post-norm (Eq. 9): G = LN_{l+1}(sum_k W[l+1, k] * y_k); one LN per *row*, the row of the
      embedding (input of layer 1) without LN unless ``normalize_embed``.  Here y_k is the residual
      sum x + F(x) of layer k *before* its post-norm: the model removes each post-norm layer's last
      LN and this LN takes its place, so that with residual weights the model **is** the post-norm
      Transformer (LN_{l+1} playing layer l's final LN).  ``normalize_embed`` normalises the
      embedding in its row only (later rows sum the raw y_0); the authors' code
      (``fairseq/modules/dlcl.py``) normalises its entry too, so that layer 1 reads
      LN_0(W[0, 0] LN_0(y_0)), the same LN twice (docs/transformer_dlcl.md).

    Rows are 0..L: row r forms the input of layer r+1 from entries 0..r, row L is the readout.

    Settings (the ablations of Table 6 are settings, not copies of the model):

    * ``init``: ``avg`` (W[r, k] = 1/(r+1), the authors' public default, and our default: every
      layer starts from the mean of the layers below, which keeps the input's scale independent of
      depth), ``one`` (All-One) or ``residual`` (W[r, r] = 1: starts as the plain residual net).
    * ``learnable=False``: weights are a fixed buffer ("- learnable weight").
    * ``layer_norm=False``: no LN in G ("- layer norm."). For post-norm the layers then keep their
      own final LN and G is a plain weighted sum of their normalised outputs.
    * ``softmax=True``: each row is a softmax over its logits (an option of the authors' code);
      it needs ``init='avg'`` (logits 0, i.e. the uniform average).
    """

    keeps_all_entries = True
    indexed_by_depth = True
    combination = "DLCL: every layer reads a weighted sum of all layers below it (Wang et al. 2019)"

    def __init__(
        self,
        num_layers: int,
        embed_dim: int,
        normalize_before: bool,
        init: str = "avg",
        learnable: bool = True,
        layer_norm: bool = True,
        normalize_embed: bool = False,
        softmax: bool = False,
    ):
        super().__init__(num_layers)
        if init not in INITS:
            raise ValueError(f"--dlcl-init must be one of {INITS}, got {init!r}")
        if softmax and init != "avg":
            raise ValueError(
                "--dlcl-softmax-weights normalises each row with a softmax, which starts from "
                f"the uniform average: use --dlcl-init avg (got --dlcl-init {init})"
            )
        self.normalize_before = normalize_before
        self.use_layer_norm = layer_norm
        self.softmax = softmax
        n = num_layers + 1
        mask = torch.ones(n, n).tril()
        if softmax:
            weight = torch.zeros(n, n)
        elif init == "avg":
            weight = mask / mask.sum(dim=1, keepdim=True)
        elif init == "one":
            weight = mask.clone()
        else:
            weight = torch.eye(n)
        if learnable:
            self.weight = nn.Parameter(weight)
        else:
            self.register_buffer("weight", weight)
        self.register_buffer("mask", mask, persistent=False)
        # saved with the weights: logits and plain weights have the same name and shape, so a
        # checkpoint says which it holds (see _load_from_state_dict)
        self.register_buffer("softmax_rows", torch.tensor(bool(softmax)))
        # pre-norm: norms[k] normalises entry k; post-norm: norms[r] normalises row r
        self.norms = nn.ModuleList(
            LayerNorm(embed_dim) if layer_norm and (i > 0 or normalize_embed) else nn.Identity()
            for i in range(n)
        )

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        """Refuse softmax logits loaded as plain weights (or the reverse): same name and shape,
        another meaning.  A checkpoint from before the flag was saved is taken as it is."""
        key = prefix + "softmax_rows"
        saved = state_dict.get(key)
        if saved is None:
            state_dict[key] = self.softmax_rows.clone()
        elif bool(saved) != self.softmax:
            error_msgs.append(
                f"{prefix}weight: the checkpoint holds "
                f"{'softmax logits' if bool(saved) else 'plain layer weights'} (trained "
                f"{'with' if bool(saved) else 'without'} --dlcl-softmax-weights) but this model was built "
                f"{'with' if self.softmax else 'without'} it: "
                f"{'add' if bool(saved) else 'drop'} --dlcl-softmax-weights"
            )
            state_dict[key] = self.softmax_rows.clone()
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def start(self, embedding: Tensor) -> HistoryState:
        if torch.is_grad_enabled():
            if type(self).combine is not DynamicLinearCombination.combine:
                return EntryState(self, embedding)  # a subclass's own combination
            return _TrainingState(self, embedding)
        # inference (every step of beam search): the weights read once per pass, as Python floats
        return _InferenceState(self, embedding, self.weights().tolist())

    def weights(self) -> Tensor:
        """The effective (L+1) x (L+1) lower-triangular weight matrix (rows as in Fig. 5)."""
        if self.softmax:
            return torch.softmax(self.weight.masked_fill(self.mask == 0, float("-inf")), dim=1)
        return self.weight * self.mask

    def row_weights(self) -> Tensor:
        """The weights a forward pass reads its rows from (entries above the diagonal are never
        read): the softmax rows, or the parameter itself."""
        return self.weights() if self.softmax else self.weight

    def entry(self, k: int, y: Tensor) -> Tensor:
        return self.norms[k](y) if self.normalize_before else y

    def combine(self, row: int, entries: List[Tensor]) -> Tensor:
        w = self.row_weights()[row, : len(entries)]
        out = weighted_sum(w, entries)
        return out if self.normalize_before else self.norms[row](out)


class _InferenceState(EntryState):
    """DLCL without autograd: each row is ``e_0 * w_0`` plus one ``add_(e_k, alpha=w_k)`` per entry."""

    def __init__(
        self, history: "DynamicLinearCombination", embedding: Tensor, rows: List[List[float]]
    ):
        self.rows = rows
        super().__init__(history, embedding)

    def next_input(self) -> Tensor:
        row = self.count - 1
        w = self.rows[row]
        out = self.entries[0] * w[0]
        for k in range(1, len(self.entries)):
            out.add_(self.entries[k], alpha=w[k])
        return out if self.history.normalize_before else self.history.norms[row](out)

    readout = next_input


class _TrainingState(EntryState):
    """DLCL with autograd: one autograd node per row (:class:`_DeferredRow`), whose backward forms
    the whole gradient of the row's newest entry e_r, sum_{r'>=r} W[r', r] g_r', in one
    matrix-vector product over the row gradients g_r..g_L, instead of a product per (row, entry)
    pair that autograd then sums (three large ops per row instead of three per pair).  The forward
    is :func:`weighted_sum`'s (the same values); the gradients, up to the order of float additions."""

    def __init__(self, history: "DynamicLinearCombination", embedding: Tensor):
        self.weight = history.row_weights()
        self.carry: Optional[Tensor] = None  # the last row's carry (see _DeferredRow)
        self.memo: Optional[Tuple[int, Tensor]] = None  # (row, input): each row is formed once
        super().__init__(history, embedding)

    def next_input(self) -> Tensor:
        row = self.count - 1
        if self.memo is not None and self.memo[0] == row:
            return self.memo[1]
        entries = self.entries
        carry = self.carry if self.carry is not None else entries[0].new_zeros(())
        out, self.carry = _DeferredRow.apply(
            self.weight, carry, entries[-1], entries, row, self.history.num_layers + 1
        )
        if not self.history.normalize_before:
            out = self.history.norms[row](out)
        self.memo = (row, out)
        return out

    readout = next_input


class _DeferredRow(torch.autograd.Function):
    """Row r of DLCL, x_{r+1} = sum_{k<=r} W[r, k] e_k, as an autograd node whose backward returns
    the gradient of its newest entry e_r only, but the whole of it.

    Inputs: the weights W ((L+1) x (L+1)), the carry of row r-1 and e_r (the entries e_0..e_r are
    read from the list, untracked).  Outputs: x_{r+1}, and a carry that row r+1 takes.  In the
    backward the carry's gradient is the (L+1) x numel matrix G of the row gradients g_{r+1}..g_L
    (zeros above the top row of this backward); row r writes g_r into G[r] and returns

    * dL/de_r = sum_{r'>=r} W[r', r] g_{r'} = W[r:, r] @ G[r:] (no other row returns one for e_r);
    * dL/dW[r:, r] = G[r:] @ e_r, column r of W (every row's weight of e_r);
    * G, as the gradient of row r-1's carry.

    Row r's backward runs after those of rows r+1..L (they take its carry), so G[r:] is complete
    when it is read; a backward from an inner layer finds no carry gradient and starts from zeros."""

    @staticmethod
    def forward(
        ctx, weight: Tensor, carry: Tensor, entry: Tensor, entries: List[Tensor], row: int, n: int
    ):
        with no_autocast(entry):
            out = _sum_of_products(weight[row, : row + 1], entries)
        ctx.row, ctx.n = row, n
        ctx.save_for_backward(weight, entry)
        ctx.set_materialize_grads(False)
        # the carry holds nothing (a stride-0 view); only its gradient G matters
        return out, out.new_zeros(()).expand(n, out.numel())

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Optional[Tensor], grad_carry: Optional[Tensor]):
        weight, entry = ctx.saved_tensors
        row, n = ctx.row, ctx.n
        with no_autocast(entry):
            if grad_carry is None:  # the top row of this backward
                G = entry.new_empty(
                    (n, entry.numel()), dtype=entry.dtype if grad is None else grad.dtype
                )
                G[row + 1 :].zero_()
            else:
                G = grad_carry
            if grad is None:
                G[row].zero_()
            else:
                G[row].copy_(grad.reshape(-1))
            below = G[row:]
            grad_entry = grad_weight = None
            if ctx.needs_input_grad[2]:
                grad_entry = (weight[row:, row].to(G.dtype) @ below).view(entry.shape)
            if ctx.needs_input_grad[0]:
                grad_weight = weight.new_zeros(weight.shape)
                grad_weight[row:, row] = below @ entry.reshape(-1).to(G.dtype)
        return grad_weight, (G if ctx.needs_input_grad[1] else None), grad_entry, None, None, None


def _sum_of_products(w: Tensor, entries) -> Tensor:
    ws = w.to(entries[0].dtype).unbind(0)
    out = entries[0] * ws[0]
    for e, wk in zip(entries[1:], ws[1:]):
        out.addcmul_(e, wk)
    return out


class _WeightedSum(torch.autograd.Function):
    """sum_k w[k] * entries[k], as one autograd node that keeps references to the entries.

    The same result as a Python loop of ``w[k] * e_k`` products, with one in-place ``addcmul_``
    per entry instead of an index, a product and a sum, and no stacked copy of the entries."""

    @staticmethod
    def forward(ctx, w: Tensor, *entries: Tensor) -> Tensor:
        ctx.save_for_backward(w, *entries)
        return _sum_of_products(w, entries)

    @staticmethod
    def backward(ctx, grad: Tensor):
        w, *entries = ctx.saved_tensors
        grad_w = None
        if ctx.needs_input_grad[0]:
            g = grad.reshape(-1)
            grad_w = torch.stack([torch.dot(g, e.reshape(-1)) for e in entries]).to(w.dtype)
        ws = w.to(grad.dtype).unbind(0)
        grads = [grad * wk if ctx.needs_input_grad[k + 1] else None for k, wk in enumerate(ws)]
        return (grad_w, *grads)


def weighted_sum(w: Tensor, entries: List[Tensor]) -> Tensor:
    """sum_k w[k] * entries[k] over tensors of one shape (w: one weight per entry)."""
    if not torch.is_grad_enabled():
        return _sum_of_products(w, entries)
    return _WeightedSum.apply(w, *entries)


DLCL_STACKS = ChoiceEnum(["both", "encoder", "decoder", "none"])  # --dlcl-stacks


@dataclass
class DLCLConfig(FairseqDataclass):
    """The ``--dlcl-*`` options (Wang et al. 2019), read by :func:`build_dlcl` only; every model
    that offers DLCL composes this dataclass into its own options."""

    dlcl_stacks: DLCL_STACKS = field(
        default="both",
        metadata={
            "help": "stacks that combine their layers with DLCL (Wang et al. 2019, Eq. 7); "
            "'none' gives the plain residual Transformer"
        },
    )
    dlcl_init: ChoiceEnum(list(INITS)) = field(
        default="avg",
        metadata={
            "architecture": False,
            "help": "initial weights: avg = 1/(l+1) over the row (authors' code), one = "
            "All-One, residual = W[l+1,l]=1 (Table 6)",
        },
    )
    dlcl_fixed_weights: bool = field(
        default=False, metadata={"help": "keep the DLCL weights at their initial values (Table 6)"}
    )
    dlcl_no_layer_norm: bool = field(
        default=False,
        metadata={"help": "drop the layer norm of Eq. 8/9 (Table 6, '- layer norm.')"},
    )
    dlcl_normalize_embed: bool = field(
        default=False,
        metadata={
            "help": "also layer-normalise the embedding: its entry (pre-norm) or its row "
            "(post-norm: once, where the authors' code also normalises the entry)"
        },
    )
    dlcl_softmax_weights: bool = field(
        default=False,
        metadata={"help": "softmax-normalise each row of DLCL weights (needs --dlcl-init avg)"},
    )


def build_dlcl(cfg, prefix: str, num_layers: int, embed_dim: int, normalize_before: bool):
    """The history a stack uses under the ``--dlcl-*`` options of ``cfg`` (residual when DLCL is
    off there).  ``cfg`` is a model's options, whose dataclass composes :class:`DLCLConfig` and
    states the model's default of ``--dlcl-stacks`` (``both`` for ``transformer_dlcl``, ``none``
    for RNMT+ and the hybrids' RNMT+ parts, :class:`~fairseq_deep.models.rnmt_plus.config.RNMTPlusConfig`)."""
    opts = DLCLConfig.from_namespace(cfg)
    if opts.dlcl_stacks not in ("both", prefix):
        return LayerHistory(num_layers)
    return DynamicLinearCombination(
        num_layers,
        embed_dim,
        normalize_before,
        init=opts.dlcl_init,
        learnable=not opts.dlcl_fixed_weights,
        layer_norm=not opts.dlcl_no_layer_norm,
        normalize_embed=opts.dlcl_normalize_embed,
        softmax=opts.dlcl_softmax_weights,
    )


# ---------------------------------------------------------------------------------------------
# Growing (fairseq-deep-grow, modules/common/growth.py): what the histories need when the depth changes
# ---------------------------------------------------------------------------------------------


def _residual_identity(history: LayerHistory) -> str:
    """The residual network keeps the stack's outputs when the new layers are the identity; a
    history that declares no rule of its own is refused with what it does instead."""
    why = history.not_residual()
    return LAYERS if why is None else f"its {type(history).__name__} ({why})"


declare_part(LayerHistory, identity=_residual_identity)


def dlcl_rows(stack: StackGrowth) -> Dict[int, Tuple[int, Dict[int, int]]]:
    """{new row: (old row, {new column: old column})} of the DLCL rows that keep old weights.

    Row r forms the input of unit r+1 (row U: the readout).  stack: the rows of the old layers;
    identity: those and the readout, which reads the old units only; interleave: the row of the
    first copy of each old layer (and the readout), its columns the last copies below it."""
    U_old, U_new = stack.old_units, stack.new_units
    rows: Dict[int, Tuple[int, Dict[int, int]]] = {}
    if not stack.grows:
        return {r: (r, {c: c for c in range(r + 1)}) for r in range(U_old + 1)}
    if stack.method in ("stack", "identity"):
        for r in range(U_old):
            rows[r] = (r, {c: c for c in range(r + 1)})
        if stack.method == "identity":
            rows[U_new] = (U_old, {c: c for c in range(U_old + 1)})
        return rows
    seen = set()
    for r in range(U_new + 1):
        readout = r == U_new
        if not readout:
            v = stack.unit_source(r + 1)
            if v is None or v in seen:
                continue
            seen.add(v)
            old_row = v - 1
        else:
            old_row = U_old
        last: Dict[int, int] = {}
        for c in range(r + 1):
            last[stack.value_source(c)] = c
        rows[r] = (old_row, {c_new: c_old for c_old, c_new in last.items() if c_old <= old_row})
    return rows


def grow_rows(key: str, stack: StackGrowth, grown: GrownState, zero_unread: bool = True):
    """The (U+1) x (U+1) weights ``key`` of a linear combination of units: the rows of kept
    layers keep their old weights (:func:`dlcl_rows`), the others the grown model's initial ones;
    ``zero_unread``: a kept row's entries that read no old unit are 0 (not for softmax logits)."""
    w = grown.new[key].clone()  # the model's own initialisation for rows without a source
    old_w = grown.old[key]
    rows = dlcl_rows(stack)
    for r, (old_r, cols) in rows.items():
        if stack.method != "stack" or r >= stack.old_units:  # rows that may read new units
            if zero_unread:
                w[r, : r + 1] = 0.0  # a kept row reads exactly what the old row read
        for c_new, c_old in cols.items():
            w[r, c_new] = old_w[old_r, c_old]
    grown.set(key, w, f"rows {sorted(rows)} from the old weights, the others initialised")


def _grow_dlcl(
    history: DynamicLinearCombination, prefix: str, stack: StackGrowth, grown: GrownState
):
    """W, (U+1) x (U+1) over units: the rows of kept layers keep their old weights (:func:`dlcl_rows`),
    new rows take the model's ``--dlcl-init``; the layer norms, one per unit, follow the unit map
    (``--method identity``: the readout's norm is the old top's)."""
    grow_rows(prefix + "weight", stack, grown, zero_unread=not history.softmax)
    for key, u, rest in grown.indexed(prefix + "norms."):
        src = stack.unit_source(u)
        if stack.method == "identity" and u == stack.new_units:
            src = stack.old_units  # the readout's norm (post-norm: the old top's)
        elif stack.method == "identity" and u <= stack.old_units:
            src = u
        if src is None or not grown.copy(key, f"{prefix}norms.{src}.{rest}"):
            grown.origin[key] = "initialised: a norm of a unit without source"


def _dlcl_identity(history: DynamicLinearCombination) -> str:
    if history.softmax:
        return "DLCL with --dlcl-softmax-weights (a weight of exactly 0 is a logit of -inf)"
    return READOUT  # the readout row gives the new layers weight 0


declare_part(DynamicLinearCombination, grow=_grow_dlcl, identity=_dlcl_identity)


# fairseq-deep-layer-weights (Wang et al. 2019, Sec. 6.4, Fig. 5): ``<stack>.history.weight``,
# (L+1) x (L+1), lower triangular, as DynamicLinearCombination.weights() reads it


def _dlcl_matches(key: str, w: Tensor) -> bool:
    return key.endswith("history.weight") and w.dim() == 2 and w.shape[0] == w.shape[1]


def _dlcl_effective(w: Tensor, cfg):
    """As ``DynamicLinearCombination.weights()``: masked row softmax or the lower triangle."""
    w = w.detach().float().cpu()
    valid = torch.ones_like(w, dtype=torch.bool).tril()
    if cfg_value(cfg, "dlcl_softmax_weights", False):
        return torch.softmax(w.masked_fill(~valid, float("-inf")), dim=1), valid
    upper = w.masked_fill(valid, 0).abs().max().item() if w.numel() else 0.0
    if upper > 0:
        logger.warning(
            "DLCL matrix has non-zero entries above the diagonal (max %.3g); they are "
            "not used by the model and are masked",
            upper,
        )
    return w * valid, valid


def history_labels(m: Tensor):
    n = m.shape[0]
    rows = [f"layer {r + 1}" for r in range(n - 1)] + ["readout"]
    return rows, layer_labels(n)


DLCL_WEIGHTS = LayerWeightKind(
    name="dlcl",
    suffix="history.weight",
    description="dynamic linear combination of layers (Wang et al. 2019, Eq. 7-9)",
    matches=_dlcl_matches,
    effective=_dlcl_effective,
    labels=history_labels,
)
