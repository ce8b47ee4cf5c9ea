"""Named RNMT+ architectures.  They only fill defaults (a command-line value wins) and chain to
``rnmt_plus``; what a preset's name states (encoder depth, transparent attention, no encoder
residuals) is fixed, and a conflicting flag is an error that names it.  Optimisation settings
(Eq. 1, dropout per language pair, weight decay) live in the recipes under examples/rnmt_plus.

* ``rnmt_plus``: App. A.3 of Chen et al. (1024 units, 6 bidirectional encoder layers, 8 decoder
  layers, 4 attention heads, dropout 0.3 as for En-De).
* ``rnmt_plus_512`` and ``rnmt_plus_512_{12,16,20}l``: the smaller RNMT+ of Bapna et al. (2018,
  Sec. 2.2, "Baseline" of Tables 3-4): 512 units, 6/12/16/20 encoder layers, 8 decoder layers.
* ``rnmt_plus_512_ta[_{12,16,20}l]``: the same with transparent attention (M = 1, the projection
  applied to the weighted combination; "Transparent" rows).
* ``rnmt_plus_512_nores[_{12,16,20}l]``: no residual connections in the encoder ("Baseline -
  residuals" rows; only the 6-layer one trained in the paper).
"""

from fairseq.models import register_model_architecture
from fairseq.utils import safe_getattr

from .config import RNMTPlusConfig


def _set_default(args, name, value):
    setattr(args, name, safe_getattr(args, name, value))


def _fix(arch: str, args, name: str, value, family: str = "rnmt_plus_512"):
    """A preset's named property: a conflicting command-line value is an error naming the fix."""
    given = safe_getattr(args, name, None)
    if given is not None and given != value:
        flag = "--" + name.replace("_", "-")
        raise ValueError(
            f"--arch {arch} has {flag} {value} but {flag} {given} was given: drop {flag}, or use "
            f"--arch {family} with {flag} {given}"
        )
    setattr(args, name, value)


@register_model_architecture("rnmt_plus", "rnmt_plus")
def rnmt_plus_architecture(args):
    """RNMT+ of Chen et al. (2018), App. A.3: 1024 units, 6 + 8 layers, 4 heads."""
    _set_default(args, "dropout", RNMTPlusConfig.dropout)
    _set_default(args, "attention_dropout", args.dropout)  # "all dropout types" share one rate
    for name, value in RNMTPlusConfig().__dict__.items():
        _set_default(args, name, value)


@register_model_architecture("rnmt_plus", "rnmt_plus_512")
def rnmt_plus_512(args):
    """The smaller RNMT+ of Bapna et al. (2018, Sec. 2.2): 512 units, 6 + 8 layers."""
    for name in ("encoder_embed_dim", "decoder_embed_dim", "encoder_hidden_size", "decoder_hidden_size"):
        _set_default(args, name, 512)
    _set_default(args, "encoder_layers", 6)
    rnmt_plus_architecture(args)


def _register(name: str, depth: int, transparent: bool, residuals: bool):
    def preset(args):
        _fix(name, args, "encoder_layers", depth)
        if transparent:
            _fix(name, args, "rnmt_transparent", True)
        if not residuals:
            _fix(name, args, "rnmt_encoder_residual_start", 0)
        rnmt_plus_512(args)

    what = "transparent attention" if transparent else ("no encoder residuals" if not residuals else "baseline")
    preset.__doc__ = f"RNMT+ (512) of Bapna et al. (2018), {depth}-layer encoder, {what} (Tables 3-4)."
    register_model_architecture("rnmt_plus", name)(preset)


for _depth in (6, 12, 16, 20):
    _suffix = "" if _depth == 6 else f"_{_depth}l"
    if _depth != 6:
        _register(f"rnmt_plus_512{_suffix}", _depth, transparent=False, residuals=True)
    _register(f"rnmt_plus_512_ta{_suffix}", _depth, transparent=True, residuals=True)
    _register(f"rnmt_plus_512_nores{_suffix}", _depth, transparent=False, residuals=False)
