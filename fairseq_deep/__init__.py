"""fairseq_deep: a fairseq plugin for training very deep translation models.

Use it as ``fairseq-train --user-dir /path/to/fairseq_deep ...`` (or through the
``fairseq-deep-*`` console scripts, which load it for you).  Importing the package registers its
models, criterions and schedulers with fairseq and installs the patches of fairseq that it needs
(:mod:`fairseq_deep.patches`: safe checkpoint loading, full evaluation batches, clear errors, ...).
"""

__version__ = "0.1.0"

from . import quiet  # noqa: F401  (first of all: filters of log lines fairseq prints while it is imported)

# isort: split
from . import patches
from .criterions import layer_diversity, sentence_cross_entropy, word_distillation  # noqa: F401
from .models import (  # noqa: F401
    deep_att,
    rnmt_plus,
    transformer_agg,
    transformer_dlcl,
    transformer_schemes,
    transformer_streams,
    transformer_ta,
)
from .optim import deep_att_optimizer, noam, rnmt_lr_scheduler  # noqa: F401
from .tasks import translation_deep  # noqa: F401

patches.apply()  # safe checkpoint loading, full evaluation batches, clear errors, ... (idempotent)
