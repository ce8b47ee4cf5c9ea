from .layer_history import DynamicLinearCombination, HistoryState, LayerHistory, build_dlcl

__all__ = ["DynamicLinearCombination", "HistoryState", "LayerHistory", "build_dlcl"]
