"""Hybrids of RNMT+ and the Transformer (Chen et al. 2018, Sec. 6, App. A.4-A.6), ``--arch`` of the
model ``rnmt_hybrid``:

* ``hybrid_transformer_rnmt``: Transformer Big encoder + RNMT+ decoder (Table 5, the best pair);
* ``hybrid_rnmt_transformer``: RNMT+ encoder (its projection to the decoder width) + Transformer Big
  decoder (Table 5);
* ``hybrid_cascaded``: RNMT+ encoder (with projection), its output layer-normalized and fed to N
  Transformer layers without positional embeddings (best: 4 on top of 6), RNMT+ decoder (Fig. 2a,
  App. A.5, Table 6); ``--hybrid-pretrained RNMT_CKPT --hybrid-freeze-pretrained`` loads the RNMT+
  part from an ``rnmt_plus`` checkpoint and freezes it, as in the paper;
* ``hybrid_multicolumn``: encoder columns (``--hybrid-columns rnmt,transformer``, any number), each
  column's output layer-normalized, concatenated and projected to the decoder width by a
  layer-normalized affine transformation, RNMT+ decoder (Fig. 2b, App. A.6, Table 6); each column
  can be loaded from a checkpoint (``--hybrid-pretrained A,B``, the encoder of an ``rnmt_plus`` or of
  a ``hybrid_transformer_rnmt``/``transformer`` model) and frozen.

In every hybrid ``--encoder-layers`` counts Transformer encoder layers and ``--rnmt-encoder-layers``
RNMT+ encoder layers.  ``--dropout`` is both components' unless ``--hybrid-transformer-dropout`` /
``--hybrid-rnmt-dropout`` give each its own, and ``--hybrid-rnmt-attention-dropout`` the RNMT+
decoder's attention (App. A.4-A.6 use each model's own rates: En-Fr 0.1 for the Transformer Big,
0.2 for RNMT+).  The Transformer parts are fairseq's own layers; as in Chen et al. (Sec. 2.3)
they are pre-norm with a final layer norm by default.

The residual schemes (``--deepnorm``, ``--admin``, ``--rezero``) replace a post-norm layer's
residual connection and do not apply: a hybrid refuses them with one line.  ``--ds-init``
re-initialises every Transformer layer of a hybrid (l counted within each Transformer part).

Files as fairseq's transformer package: ``config`` (options and how each part reads them),
``encoders`` (cascaded, multi-column, pre-trained parts), ``model``, ``presets``.
"""

from . import model, presets  # noqa: F401  (register the model and its architectures)
from .config import (
    COLUMN_KINDS,
    HybridConfig,
    RNMTHybridConfig,
    component_dropout,
    rnmt_options,
    transformer_cfg,
)
from .encoders import CascadedEncoder, MultiColumnEncoder, TransformerLayers, load_encoder_weights
from .model import RNMTHybridModel

__all__ = [
    "COLUMN_KINDS",
    "CascadedEncoder",
    "HybridConfig",
    "MultiColumnEncoder",
    "RNMTHybridConfig",
    "RNMTHybridModel",
    "TransformerLayers",
    "component_dropout",
    "load_encoder_weights",
    "rnmt_options",
    "transformer_cfg",
]
