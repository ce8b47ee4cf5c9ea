"""``--freeze-grown-from N[,M]`` of ``--task translation_deep``: the bottom layers of a grown model
do not train (Wu et al. 2019 train the layers grown on top of a fixed bottom first).

:data:`LAYER_KEY` says which parameters are a layer's, and of which layer, in every family of the
package: ``encoder.layers.3.fc1.weight``, a Deep-Att encoder column's
``encoder.columns.1.layers.3...``, RNMT+'s ``encoder.stack.layers.3...`` (``fairseq-deep-grow``
maps layers by the same keys).
"""

import re

from ..errors import UserError

#: a layer's parameter or buffer: (side, the column or stack before ``layers.``, layer index, the rest)
LAYER_KEY = re.compile(r"^(encoder|decoder)\.((?:columns\.\d+\.|stack\.)?)layers\.(\d+)\.(.+)$")


def freeze_bottom_layers(model, value: str) -> int:
    """``--freeze-grown-from N[,M]``: no gradient for the parameters of encoder layers 0..N-1 (and
    decoder layers 0..M-1; of every column of a Deep-Att encoder), as Wu et al. (2019) first train
    the layers grown on top of a fixed bottom.  Returns how many parameter tensors were frozen."""
    try:
        bounds = [int(v) for v in str(value).split(",")]
    except ValueError:
        bounds = []
    if len(bounds) not in (1, 2) or min(bounds) < 0:
        raise UserError(
            f"--freeze-grown-from takes N or N,M (encoder, decoder layers), got {value!r}"
        )
    limit = {"encoder": bounds[0], "decoder": bounds[1] if len(bounds) > 1 else 0}
    depth = {"encoder": 0, "decoder": 0}
    frozen = 0
    for name, p in model.named_parameters():
        m = LAYER_KEY.match(name)
        if not m:
            continue
        side, index = m.group(1), int(m.group(3))
        depth[side] = max(depth[side], index + 1)
        if index < limit[side]:
            p.requires_grad_(False)
            frozen += 1
    for side in limit:
        if limit[side] > depth[side]:
            raise UserError(
                f"--freeze-grown-from {value}: the model has {depth[side]} {side} layers, fewer than "
                f"the {limit[side]} to freeze"
            )
    return frozen
