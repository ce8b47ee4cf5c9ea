"""The depth-aware layer builder of models/transformer_stack.py (issue 13): ``build_layer`` gets
layer i of N, bottom first, and what it returns is wrapped once (activation checkpointing)."""

import pytest
from fairseq.models.transformer import TransformerConfig
from helpers import parse_model_args, tiny_dictionary
from torch import nn

from fairseq_deep.models.transformer_stack import (
    HistoryTransformerDecoder,
    HistoryTransformerEncoder,
)
from fairseq_deep.modules.histories.layer_history import LayerHistory


class RecordingEncoder(HistoryTransformerEncoder):
    def build_layer(self, cfg, index, num_layers):
        self.calls = getattr(self, "calls", []) + [(index, num_layers)]
        return super().build_layer(cfg, index, num_layers)


class RecordingDecoder(HistoryTransformerDecoder):
    def build_layer(self, cfg, index, num_layers, no_encoder_attn=False):
        self.calls = getattr(self, "calls", []) + [(index, num_layers)]
        return super().build_layer(cfg, index, num_layers, no_encoder_attn)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_build_layer_gets_index_and_depth_and_is_wrapped_once(checkpoint):
    extra = ["--encoder-layers", "3", "--decoder-layers", "2"]
    if checkpoint:
        extra.append("--checkpoint-activations")
    cfg = TransformerConfig.from_namespace(parse_model_args("transformer_prenorm", extra))
    d = tiny_dictionary()
    enc = RecordingEncoder(cfg, d, nn.Embedding(len(d), 16, d.pad()), LayerHistory(3))
    dec = RecordingDecoder(cfg, d, nn.Embedding(len(d), 16, d.pad()), LayerHistory(2))
    assert enc.calls == [(0, 3), (1, 3), (2, 3)]
    assert dec.calls == [(0, 2), (1, 2)]
    for layer in [*enc.layers, *dec.layers]:
        wrapped = hasattr(layer, "precheckpoint_forward")
        assert wrapped == checkpoint
