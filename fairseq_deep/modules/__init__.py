"""Reusable modules: layer histories (residual, DLCL, aggregation), readouts and recurrent cells."""

from .additive_attention import AdditiveAttention
from .fast_forward_lstm import FFLSTMCell, FFLSTMLayer, FFLSTMStack
from .layer_aggregation import (
    AggregationNode,
    DenseHistory,
    HierarchicalAggregationHistory,
    IterativeAggregationHistory,
    LinearCombinationHistory,
)
from .layer_history import (
    DLCLConfig,
    DynamicLinearCombination,
    EntryState,
    HistoryState,
    LayerHistory,
    build_dlcl,
)
from .ln_lstm import LayerNormLSTM
from .transparent_attention import TransparentReadout

__all__ = [
    "AdditiveAttention",
    "AggregationNode",
    "DLCLConfig",
    "DenseHistory",
    "DynamicLinearCombination",
    "EntryState",
    "FFLSTMCell",
    "FFLSTMLayer",
    "FFLSTMStack",
    "HierarchicalAggregationHistory",
    "HistoryState",
    "IterativeAggregationHistory",
    "LayerHistory",
    "LayerNormLSTM",
    "LinearCombinationHistory",
    "TransparentReadout",
    "build_dlcl",
]
