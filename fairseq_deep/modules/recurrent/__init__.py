"""Recurrent cells and their attention, each with its fused Triton loop beside it (the LN-LSTM,
the fast-forward LSTM, additive attention)."""
