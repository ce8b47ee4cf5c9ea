"""Helpers of every named architecture (``--arch``) of the package: each is registered with
:func:`register_preset` (which calls fairseq's ``register_model_architecture``).

Presets only fill defaults, so a value given on the command line wins; what a preset's *name*
states (a depth, a column count, an encoder kind) it owns, and a conflicting flag stops with an
error that names the option and the fix (a silently ignored flag would be worse).
"""

import argparse
import re
from typing import Callable, Dict, Optional, Tuple

from fairseq.models import register_model_architecture
from fairseq.models.transformer.transformer_legacy import transformer_vaswani_wmt_en_de_big
from fairseq.utils import safe_getattr

#: pre-norm layers (tensor2tensor's, and Chen et al.'s Transformer): what fairseq's
#: ``transformer_wmt_en_de_big_t2t`` sets besides the Big sizes and two dropouts
PRENORM = {"encoder_normalize_before": True, "decoder_normalize_before": True}


def set_default(args, name: str, value):
    """``args.name = value`` unless the command line (or an earlier preset) set it."""
    setattr(args, name, safe_getattr(args, name, value))


_BIG_SIZES = (
    "encoder_embed_dim",
    "encoder_ffn_embed_dim",
    "encoder_attention_heads",
    "decoder_embed_dim",
    "decoder_ffn_embed_dim",
    "decoder_attention_heads",
    "dropout",
)


def transformer_big(args, ffn_dim: Optional[int] = None):
    """The sizes of Transformer Big (Vaswani et al. 2017) as fairseq's own preset
    ``transformer_vaswani_wmt_en_de_big`` states them (model 1024, 16 heads, FFN 4096, dropout
    0.3), FFN ``ffn_dim`` when given, for a model that is not fairseq's Transformer (the hybrids).
    A Transformer chains to fairseq's preset itself (its ``parent``)."""
    if ffn_dim is not None:
        set_default(args, "encoder_ffn_embed_dim", ffn_dim)
        set_default(args, "decoder_ffn_embed_dim", ffn_dim)
    big = argparse.Namespace()
    transformer_vaswani_wmt_en_de_big(big)
    for name in _BIG_SIZES:
        set_default(args, name, getattr(big, name))


def fill_defaults(args, config):
    """Every option of a FairseqDataclass instance that is still unset takes its default."""
    for name, value in config.__dict__.items():
        if not name.startswith("_"):  # fairseq's own `_name`
            set_default(args, name, value)


def fix_option(arch: str, args, name: str, value, instead: str, stated: Optional[str] = None):
    """``args.name = value``, because ``--arch arch`` states it; a different value given on the
    command line is an error pointing to ``--arch instead``, which leaves the option free."""
    flag = "--" + name.replace("_", "-")
    given = safe_getattr(args, name, None)
    if given is not None and str(given) != str(value):
        raise ValueError(
            f"--arch {arch} has {stated or f'{flag} {value}'} but {flag} {given} was given: "
            f"drop {flag}, or use --arch {instead} {flag} {given}"
        )
    setattr(args, name, value)


#: a preset named after the encoder depth it owns ends in ``_<N>l`` (``transformer_dlcl_30l``);
#: the name without it is the depth-free preset of the same family (``transformer_dlcl``)
NAMED_DEPTH = re.compile(r"_(\d+)l$")


def named_depth(arch: str) -> Optional[int]:
    """The encoder depth the name of ``arch`` states (``..._30l``: 30), or None."""
    m = NAMED_DEPTH.search(arch)
    return int(m.group(1)) if m else None


def depth_free(arch: str) -> str:
    """``arch`` without the depth its name states: ``transformer_dlcl_postnorm_16l`` ->
    ``transformer_dlcl_postnorm`` (a name that states none, as it is)."""
    return NAMED_DEPTH.sub("", arch)


def fix_depth(arch: str, args, encoder_layers: int, decoder_layers: Optional[int] = None):
    """Presets named after an encoder depth (``..._16l``) own it; the depth-free preset of the same
    family (the name without ``_16l``: :func:`depth_free`) is the fix.  The decoder keeps 6 layers
    unless told, or is owned too when ``decoder_layers`` is given."""
    family = depth_free(arch)
    fix_option(
        arch, args, "encoder_layers", encoder_layers, family, f"{encoder_layers} encoder layers"
    )
    if decoder_layers is None:
        set_default(args, "decoder_layers", 6)
    else:
        fix_option(
            arch, args, "decoder_layers", decoder_layers, family, f"{decoder_layers} decoder layers"
        )


def same_as(name: str, default=None) -> Callable:
    """A default of ``defaults`` that is another option's value (``default`` when unset), read
    when the preset runs: ``{"attention_dropout": same_as("dropout")}``."""
    return lambda args: safe_getattr(args, name, default)


def register_preset(
    model: str,
    name: str,
    doc: str,
    parent: Optional[Callable] = None,
    fixed: Optional[Dict] = None,
    defaults: Optional[Dict] = None,
    depth: Optional[Tuple[int, Optional[int]]] = None,
    instead: Optional[str] = None,
    options: Optional[type] = None,
):
    """Register ``--arch name`` of ``model``: a preset that owns ``depth`` (encoder layers, and
    decoder layers unless None: :func:`fix_depth`) and the options of ``fixed`` (a conflicting
    flag stops and points to ``--arch instead``, by default ``model``), fills ``defaults`` (in
    order; a callable value, such as :func:`same_as`, is called with the namespace), then the
    defaults of the dataclass ``options`` (a family's base preset: each option's default is
    stated once, in its dataclass), then chains to ``parent`` (a preset of this package or
    fairseq's), which fills the rest."""

    def preset(args):
        if depth is not None:
            fix_depth(name, args, *depth)
        for key, value in (fixed or {}).items():
            fix_option(name, args, key, value, instead or model)
        for key, value in (defaults or {}).items():
            set_default(args, key, value(args) if callable(value) else value)
        if options is not None:
            fill_defaults(args, options())
        if parent is not None:
            parent(args)

    preset.__doc__ = doc
    preset.__name__ = name
    register_model_architecture(model, name)(preset)
    return preset


def first_line(fn: Callable) -> str:
    """The first line of a preset's docstring, without its full stop (to name a derived preset)."""
    return fn.__doc__.splitlines()[0].rstrip(".")
