"""Layer aggregation (Dou, Tu, Wang, Shi, Zhang, 2018. Exploiting Deep Representations for Neural
Machine Translation, Sec. 3.1.1) as layer histories.

Each strategy is a :class:`~fairseq_deep.modules.histories.layer_history.LayerHistory` with its own per-pass state: the
backbone layers are fairseq's, the loop of :mod:`fairseq_deep.models.transformer_stack` asks the
state for each layer's input and for the stack's readout.  H^1..H^L are the layer outputs; the
embedding output H^0 takes part in no aggregation (the paper's sums start at l = 1).

* :class:`DenseHistory` (Eq. 3-4, Fig. 1b): each layer's input adds all previous layer outputs;
* :class:`LinearCombinationHistory` (Eq. 5, Fig. 1c): readout sum_l W_l H^l, W_l a d x d matrix;
* :class:`IterativeAggregationHistory` (Eq. 6-7, Fig. 1d): readout by a chain of AGG nodes;
* :class:`HierarchicalAggregationHistory` (Fig. 2): a tree of AGG nodes fed back into the backbone.

Every node is position-wise, so a decoder step combines the new position's layer outputs only:
incremental decoding caches nothing for aggregation.  No state is stored on a module in forward.
Memory: every running combination is updated when a layer output is pushed; nothing re-stacks the
history.
"""

from dataclasses import dataclass, field
from typing import Callable, List, NamedTuple, Optional, Tuple

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.modules import FairseqDropout, LayerNorm, MultiheadAttention
from torch import Tensor, nn

from ..common.growth import READOUT, GrownState, StackGrowth, declare_part
from .layer_history import HistoryState, LayerHistory

AGG_FUNCTIONS = ("ff_sigmoid", "ff_relu", "self_attn")
AGG_RESIDUALS = ("all", "top", "none")
STRATEGIES = ("none", "dense", "linear", "iterative", "hierarchical")


@dataclass
class AggregationConfig(FairseqDataclass):
    """The ``--agg-*`` options (Dou et al. 2018, Sec. 3.1.1), read by :func:`build_aggregation`
    and :func:`node_factory` only."""

    agg_encoder: ChoiceEnum(list(STRATEGIES)) = field(
        default="none",
        metadata={
            "help": "layer aggregation of the encoder (Dou et al. 2018, Sec. 3.1.1): "
            "dense (Eq. 3; Eq. 4 with --agg-dense-sum states), linear (Eq. 5), "
            "iterative (Eq. 6), hierarchical (Fig. 2)"
        },
    )
    agg_decoder: ChoiceEnum(list(STRATEGIES)) = field(
        default="none", metadata={"help": "layer aggregation of the decoder (as --agg-encoder)"}
    )
    agg_function: ChoiceEnum(list(AGG_FUNCTIONS)) = field(
        default="ff_sigmoid",
        metadata={
            "help": "F of the AGG node LN(F([x;y]) + x + y) (Eq. 7, Table 4): "
            "feed-forward with sigmoid or ReLU, or self-attention over the inputs"
        },
    )
    agg_residual: ChoiceEnum(list(AGG_RESIDUALS)) = field(
        default="all",
        metadata={
            "help": "residual inputs of an AGG node (Table 4): all inputs, the "
            "top-level one, or none"
        },
    )
    agg_ffn_dim: int = field(
        default=-1,
        metadata={
            "help": "hidden size of the AGG feed-forward: -1 (default) the stack's FFN "
            "width (--encoder/decoder-ffn-embed-dim) for iterative/hierarchical "
            "nodes and d for --mla-layers' nodes (Dou et al. Sec. 4.2's parameter "
            "counts), 0 the stack's embedding dim d (the default before issue 15: "
            "older checkpoints saved 0)"
        },
    )
    agg_dropout: float = field(
        default=-1.0,
        metadata={
            "architecture": False,
            "help": "dropout on the output of the AGG node's F: -1 (default) the model's "
            "--dropout, as on every Transformer sublayer (this package's choice); 0 "
            "Eq. 7 as written, which has none",
        },
    )
    agg_linear_init: ChoiceEnum(["top", "avg"]) = field(
        default="top",
        metadata={
            "architecture": False,
            "help": "--agg-* linear: W_L = I, others 0 (starts as the model it is "
            "initialised from), or W_l = I/L",
        },
    )
    agg_dense_sum: ChoiceEnum(["outputs", "states"]) = field(
        default="outputs",
        metadata={
            "help": "--agg-* dense: layer l+1 reads the sum of the layer outputs "
            "1..l, or the literal Eq. 4 recursion over states (grows as 2^l)"
        },
    )


class AggregationNode(nn.Module):
    """AGG(x_1, ..., x_n) = LN(F([x_1; ...; x_n]) + R), Dou et al. Eq. 7 (n = 2) and its
    three-input form of Sec. 3.1.1; the variants of Table 4 are settings:

    * ``function``: F is ``ff_sigmoid`` (default: W_2 sigmoid(W_1 z + b_1) + b_2 on the
      concatenation z), ``ff_relu`` (the same with ReLU), or ``self_attn``: a multi-head
      self-attention over the n inputs *of one position* (the layer axis is the sequence axis),
      whose n outputs are averaged.  Attending over the layer axis keeps the node position-wise,
      as the paper's FF is; its choice of axis is not stated.
    * ``residual``: R = x_1 + ... + x_n (``all``, Eq. 7), R = the top-level input only (``top``),
      or no residual (``none``).  ``top`` is the input from the deepest layer, given by ``top``.

    ``dropout`` on F's output is this package's choice, not the paper's: Eq. 7,
    LN(FF([x; y]) + x + y), has none.  The models give it ``--agg-dropout``, by default the model's
    ``--dropout`` as on every Transformer sublayer; ``--agg-dropout 0`` is Eq. 7 as written.
    """

    def __init__(
        self,
        num_inputs: int,
        embed_dim: int,
        hidden_dim: Optional[int] = None,
        function: str = "ff_sigmoid",
        residual: str = "all",
        top: int = 0,
        num_heads: int = 1,
        dropout: float = 0.0,
    ):
        super().__init__()
        if function not in AGG_FUNCTIONS:
            raise ValueError(f"--agg-function must be one of {AGG_FUNCTIONS}, got {function!r}")
        if residual not in AGG_RESIDUALS:
            raise ValueError(f"--agg-residual must be one of {AGG_RESIDUALS}, got {residual!r}")
        if not 0 <= top < num_inputs:
            raise ValueError(f"top input {top} out of range for {num_inputs} inputs")
        self.num_inputs = num_inputs
        self.function = function
        self.residual = residual
        self.top = top
        hidden_dim = hidden_dim or embed_dim
        if function == "self_attn":
            self.attn = MultiheadAttention(embed_dim, num_heads, self_attention=True)
        else:
            self.fc1 = nn.Linear(num_inputs * embed_dim, hidden_dim)
            self.fc2 = nn.Linear(hidden_dim, embed_dim)
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.layer_norm = LayerNorm(embed_dim)

    def transform(self, inputs: List[Tensor]) -> Tensor:
        """F of Eq. 7 on inputs of shape (..., d); returns (..., d)."""
        if self.function == "self_attn":
            shape = inputs[0].shape
            z = torch.stack([x.reshape(-1, shape[-1]) for x in inputs])  # n x N x d
            h, _ = self.attn(z, z, z, need_weights=False)
            return h.mean(dim=0).view(shape)
        h = self.fc1(torch.cat(inputs, dim=-1))
        h = torch.sigmoid(h) if self.function == "ff_sigmoid" else torch.relu(h)
        return self.fc2(h)

    def forward(self, inputs: List[Tensor]) -> Tensor:
        if len(inputs) != self.num_inputs:
            raise ValueError(f"this AGG node takes {self.num_inputs} inputs, got {len(inputs)}")
        h = self.dropout_module(self.transform(inputs))
        if self.residual == "all":
            for x in inputs:
                h = h + x
        elif self.residual == "top":
            h = h + inputs[self.top]
        return self.layer_norm(h)


class _State(HistoryState):
    """Per-pass state of an aggregation history: the input of the next layer is ``current``."""

    def __init__(self, history: "LayerHistory", embedding: Tensor):
        super().__init__(history, embedding)
        self.current = embedding  # input of the next layer
        self.start(embedding)

    def start(self, embedding: Tensor) -> None:
        pass

    def push(self, y: Tensor) -> None:
        self.count += 1
        self.current = self.add(self.count - 1, y)

    def add(self, l: int, y: Tensor) -> Tensor:
        """Record the output y = H^l of layer l >= 1 and return the input of layer l+1."""
        raise NotImplementedError

    def next_input(self) -> Tensor:
        return self.current

    def readout(self) -> Tensor:
        return self.current


class _DenseState(_State):
    def start(self, embedding):
        self.total: Optional[Tensor] = None  # running sum of the H^i pushed so far (i >= 1)

    def add(self, l, y):
        if self.history.sum_of == "states":  # H^l = y_l + sum_{i<l} H^i: the literal Eq. 4
            h = y if self.total is None else y + self.total
            self.total = h if self.total is None else self.total + h
            return h
        self.total = y if self.total is None else self.total + y  # sum_{i<=l} y_i
        return self.total


class DenseHistory(LayerHistory):
    """Dense connection by addition (Dou et al. Eq. 3, Fig. 1b; Eq. 4 is ``states``): by default
    layer l+1 reads y_1 + ... + y_l; Eq. 4 as written is H^l = Layer(H^{l-1}) + sum_{i<l} H^i.

    Layer l+1 reads, and the stack returns, a running sum; no parameters.  ``sum_of`` says what the
    sum adds up: ``outputs`` (default) the layer outputs y_i = Layer(input_i), so that the input of
    layer l+1 is y_1 + ... + y_l ("each layer's input adds all previous layer outputs"); ``states``
    the literal recursion of Eq. 4, whose states double at every layer (H^l ~ 2^{l-1} y) and which
    therefore suits shallow stacks only.  Layer 1 reads the embedding, layer 2 reads y_1 in both.
    """

    indexed_by_depth = True  # the input depends on the layer's row: no layerdrop
    combination = (
        "dense connections: every layer reads the sum of the layers below it (Dou et al. 2018)"
    )

    def __init__(self, num_layers: int, sum_of: str = "outputs"):
        super().__init__(num_layers)
        if sum_of not in ("outputs", "states"):
            raise ValueError(f"--agg-dense-sum must be 'outputs' or 'states', got {sum_of!r}")
        self.sum_of = sum_of

    def start(self, embedding):
        return _DenseState(self, embedding)


class _LinearState(_State):
    def start(self, embedding):
        self.total: Optional[Tensor] = None

    def push(self, y):
        self.count += 1
        self.current = y
        w = self.history.weights[self.count - 2](y)  # W_l H^l, l = count - 1
        self.total = w if self.total is None else self.total + w

    def readout(self):
        return self.current if self.total is None else self.total


class LinearCombinationHistory(LayerHistory):
    """Linear combination of layers (Dou et al. Eq. 5, Fig. 1c): the stack returns
    H = sum_{l=1}^{L} W_l H^l with learned d x d matrices W_l (unnormalised, no bias); the
    backbone is the plain residual stack.

    ``init``: ``top`` (default: W_L = I, the others 0, so the model starts as the Transformer it is
    initialised from, Sec. 4.1) or ``avg`` (W_l = I / L).
    """

    indexed_by_depth = True
    combination = (
        "linear layer aggregation: the stack returns a learned combination of all its "
        "layers (Dou et al. 2018)"
    )

    def __init__(self, num_layers: int, embed_dim: int, init: str = "top"):
        super().__init__(num_layers)
        if init not in ("top", "avg"):
            raise ValueError(f"--agg-linear-init must be 'top' or 'avg', got {init!r}")
        self.weights = nn.ModuleList(
            nn.Linear(embed_dim, embed_dim, bias=False) for _ in range(num_layers)
        )
        with torch.no_grad():
            for l, w in enumerate(self.weights, start=1):
                if init == "avg":
                    w.weight.copy_(torch.eye(embed_dim) / num_layers)
                else:
                    w.weight.copy_(
                        torch.eye(embed_dim)
                        if l == num_layers
                        else torch.zeros(embed_dim, embed_dim)
                    )

    def start(self, embedding):
        return _LinearState(self, embedding)


class _IterativeState(_State):
    def start(self, embedding):
        self.agg: Optional[Tensor] = None

    def push(self, y):
        self.count += 1
        self.current = y
        l = self.count - 1
        self.agg = y if l == 1 else self.history.nodes[l - 2]([y, self.agg])

    def readout(self):
        return self.current if self.agg is None else self.agg


class IterativeAggregationHistory(LayerHistory):
    """Iterative deep aggregation (Dou et al. Eq. 6, Fig. 1d): a chain of AGG nodes beside the
    backbone, A^1 = H^1, A^l = AGG(H^l, A^{l-1}); the stack returns A^L.  L - 1 nodes; the
    backbone layers read H^{l-1} as usual.  ``top`` of every node is H^l (input 0)."""

    indexed_by_depth = True
    combination = (
        "iterative layer aggregation: the stack returns aggregation nodes over all its "
        "layers (Dou et al. 2018)"
    )

    def __init__(self, num_layers: int, node_factory):
        super().__init__(num_layers)
        self.nodes = nn.ModuleList(node_factory(2, 0) for _ in range(max(num_layers - 1, 0)))

    def start(self, embedding):
        return _IterativeState(self, embedding)


class TreeNode(NamedTuple):
    """One aggregation node of the hierarchical tree: AGG(H^a, [H^b,] [previous node])."""

    layers: Tuple[int, ...]  # backbone layers it merges (1-based)
    takes_previous: bool  # whether the previous node is its last input
    feeds_layer: Optional[int]  # the backbone layer that reads its output (None: stack output)

    @property
    def num_inputs(self) -> int:
        return len(self.layers) + int(self.takes_previous)

    @property
    def top(self) -> int:
        """Index of the input from the deepest layer (the one ``--agg-residual top`` keeps)."""
        return len(self.layers) - 1


def hierarchical_plan(num_layers: int) -> List[TreeNode]:
    """The nodes of the hierarchical aggregation of Dou et al. (Fig. 2b, Sec. 3.1.1).

    A CNN-like tree with filter size 2 over the backbone, nodes of the same depth merged, so that
    node i merges layers 2i-1 and 2i with node i-1:

        A^1 = AGG(H^1, H^2),  A^i = AGG(H^{2i-1}, H^{2i}, A^{i-1})  (i >= 2),

    and A^i is fed back into the backbone as the input of layer 2i+1 (the first layer of the next
    sub-tree).  The last node is the stack's output (A^{L/2} for even L).  An odd L leaves layer L
    alone in the last sub-tree: its node is A = AGG(H^L, A^{(L-1)/2}), two inputs, and it is the
    output (L = 7: AGG(H^1,H^2), AGG(H^3,H^4,.), AGG(H^5,H^6,.), AGG(H^7,.)).  L = 1 has no node.
    """
    plan: List[TreeNode] = []
    first = 1
    while first <= num_layers and num_layers > 1:
        layers = tuple(range(first, min(first + 1, num_layers) + 1))
        last = layers[-1]
        plan.append(TreeNode(layers, bool(plan), last + 1 if last < num_layers else None))
        first = last + 1
    return plan


class _HierarchicalState(_State):
    def start(self, embedding):
        self.pending: List[Tensor] = []
        self.node = 0
        self.agg: Optional[Tensor] = None

    def push(self, y):
        self.count += 1
        self.current = y
        if not self.history.plan:
            return
        self.pending.append(y)
        spec = self.history.plan[self.node]
        if len(self.pending) == len(spec.layers):
            inputs = self.pending + ([self.agg] if spec.takes_previous else [])
            self.agg = self.history.nodes[self.node](inputs)
            self.current = self.agg  # fed back: the input of the next sub-tree
            self.pending = []
            self.node += 1

    def readout(self):
        return self.current if self.agg is None else self.agg


class HierarchicalAggregationHistory(LayerHistory):
    """Hierarchical deep aggregation (Dou et al. Fig. 2): see :func:`hierarchical_plan`."""

    indexed_by_depth = True
    combination = (
        "hierarchical layer aggregation: aggregation nodes over groups of layers feed "
        "the stack (Dou et al. 2018)"
    )

    def __init__(self, num_layers: int, node_factory):
        super().__init__(num_layers)
        self.plan = hierarchical_plan(num_layers)
        self.nodes = nn.ModuleList(node_factory(n.num_inputs, n.top) for n in self.plan)

    def start(self, embedding):
        return _HierarchicalState(self, embedding)


def agg_hidden_dim(agg_ffn_dim: int, embed_dim: int, ffn_dim: Optional[int]) -> int:
    """The hidden size of an AGG node's F: ``--agg-ffn-dim`` when positive, d when 0 (the old
    default, kept by checkpoints that saved it); when negative (the default) the stack's FFN width
    for an aggregation history's nodes (`ffn_dim` given) and d for multi-layer attention's
    (`ffn_dim` None).

    Dou et al. (2018) do not state the width.  Their Sec. 4.2 (Model Complexity) says the
    strategies other than dense add "14.7M to 33.6M" parameters at Base.  New parameters at
    Base (6+6 layers, d 512, FFN 2048), F's width d / FFN width: linear 3.15M / 3.15M (no F),
    iterative 7.88M / 31.49M, hierarchical 5.78M / 23.09M, MLA-2 18.39M / 42.00M, MLA-3
    28.89M / 58.79M.  The default (FFN width for aggregation, d for MLA) puts rows 4-7 in the
    paper's range; the linear combination (Eq. 5: 12 d x d matrices) cannot reach it at any width.
    Counted in tests/test_audit_aggregation.py."""
    if agg_ffn_dim > 0:
        return agg_ffn_dim
    if agg_ffn_dim == 0 or not ffn_dim:
        return embed_dim
    return ffn_dim


def build_aggregation(
    cfg, prefix: str, num_layers: int, embed_dim: int, num_heads: int, ffn_dim: Optional[int] = None
) -> LayerHistory:
    """The history of the `prefix` ("encoder"/"decoder") stack under the ``--agg-*`` options;
    `ffn_dim` is the stack's FFN width (the AGG nodes' hidden size by default)."""
    opts = AggregationConfig.from_namespace(cfg)
    strategy = getattr(opts, f"agg_{prefix}") or "none"
    if strategy not in STRATEGIES:
        raise ValueError(f"--agg-{prefix} must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "none":
        return LayerHistory(num_layers)
    if strategy == "dense":
        return DenseHistory(num_layers, opts.agg_dense_sum)
    if strategy == "linear":
        return LinearCombinationHistory(num_layers, embed_dim, opts.agg_linear_init)
    factory = node_factory(cfg, embed_dim, num_heads, ffn_dim)
    if strategy == "iterative":
        return IterativeAggregationHistory(num_layers, factory)
    return HierarchicalAggregationHistory(num_layers, factory)


def node_factory(cfg, embed_dim: int, num_heads: int, ffn_dim: Optional[int] = None):
    """``factory(num_inputs, top) -> AggregationNode`` under the ``--agg-*`` node options (and the
    model's ``--dropout``); `ffn_dim`: the stack's FFN width (see :func:`agg_hidden_dim`)."""
    opts = AggregationConfig.from_namespace(cfg)
    hidden_dim = agg_hidden_dim(opts.agg_ffn_dim, embed_dim, ffn_dim)

    def make(num_inputs: int, top: int) -> AggregationNode:
        return AggregationNode(
            num_inputs,
            embed_dim,
            hidden_dim=hidden_dim,
            function=opts.agg_function,
            residual=opts.agg_residual,
            top=top,
            num_heads=num_heads,
            dropout=opts.agg_dropout if opts.agg_dropout >= 0 else getattr(cfg, "dropout", 0.0),
        )

    return make


# ---------------------------------------------------------------------------------------------
# Growing (fairseq-deep-grow, modules/common/growth.py): what the aggregation histories need when the
# depth changes
# ---------------------------------------------------------------------------------------------


def _grow_linear(
    history: LinearCombinationHistory, prefix: str, stack: StackGrowth, grown: GrownState
):
    """W_l of a copy: the source layer's W shared out among its copies (W / copies), so that the
    readout is unchanged when the copies are equal; ``--method identity``: 0 for the new layers."""
    for key, l, rest in grown.indexed(prefix + "weights."):
        if stack.method == "identity":
            if l < stack.old_depth:
                grown.copy(key, key)
            else:
                grown.set(
                    key,
                    torch.zeros_like(grown.new[key]),
                    "zeros: --method identity (the readout ignores the new layers)",
                )
            continue
        src = stack.layer_map[l]
        share = stack.copies(range(stack.offset, stack.new_units + 1))[src + stack.offset]
        grown.set(
            key,
            grown.old[f"{prefix}weights.{src}.{rest}"].clone() / share,
            f"W of old layer {src} / {share} copies",
        )


def _grow_nodes(source: Callable[[StackGrowth, int], Optional[int]]):
    """The rule of aggregation nodes: node i starts from old node ``source(stack, i)`` where the
    shapes agree, otherwise it keeps its initialisation (a node of a new place in the tree)."""

    def grow(history: LayerHistory, prefix: str, stack: StackGrowth, grown: GrownState):
        for key, i, rest in grown.indexed(prefix + "nodes."):
            src = source(stack, i)
            if src is None or src < 0 or not grown.copy(key, f"{prefix}nodes.{src}.{rest}"):
                grown.origin[key] = (
                    "initialised: a new aggregation node without a node of its shape"
                )

    return grow


def _iterative_source(stack: StackGrowth, i: int) -> Optional[int]:
    """Node i merges layer i+1 (0-based) into the chain: the node that merged its source."""
    src_layer = stack.layer_map[i + 1]
    return None if src_layer is None else src_layer - 1


def _hierarchical_source(stack: StackGrowth, i: int) -> Optional[int]:
    """Node i merges layers 2i, 2i+1 (0-based): the node that merged the source of its first layer."""
    first = stack.layer_map[2 * i]
    return None if first is None else first // 2


declare_part(
    DenseHistory,
    identity=lambda history: (
        "its DenseHistory (every layer reads the sum of all layers below it, a new layer's output included)"
    ),
)
declare_part(LinearCombinationHistory, grow=_grow_linear, identity=lambda history: READOUT)
declare_part(
    IterativeAggregationHistory,
    grow=_grow_nodes(_iterative_source),
    identity=lambda history: (
        "its IterativeAggregationHistory (the readout's aggregation nodes merge every layer's output)"
    ),
)
declare_part(
    HierarchicalAggregationHistory,
    grow=_grow_nodes(_hierarchical_source),
    identity=lambda history: (
        "its HierarchicalAggregationHistory (aggregation nodes merge every layer's output and feed the layers above)"
    ),
)
