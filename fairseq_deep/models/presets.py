"""Helpers of every named architecture (``register_model_architecture`` functions) of the package.

Presets only fill defaults, so a value given on the command line wins; what a preset's *name*
states (a depth, a column count, an encoder kind) it owns, and a conflicting flag stops with an
error that names the option and the fix (a silently ignored flag would be worse).
"""

import re
from typing import Optional

from fairseq.utils import safe_getattr


def set_default(args, name: str, value):
    """``args.name = value`` unless the command line (or an earlier preset) set it."""
    setattr(args, name, safe_getattr(args, name, value))


def transformer_big(args, ffn_dim: int = 4096):
    """Transformer Big (Vaswani et al. 2017): model 1024, 16 heads, FFN ``ffn_dim``, dropout 0.3."""
    for side in ("encoder", "decoder"):
        set_default(args, f"{side}_embed_dim", 1024)
        set_default(args, f"{side}_ffn_embed_dim", ffn_dim)
        set_default(args, f"{side}_attention_heads", 16)
    set_default(args, "dropout", 0.3)


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


def fix_depth(arch: str, args, encoder_layers: int, decoder_layers: Optional[int] = None):
    """Presets named after an encoder depth (``..._16l``) own it; the depth-free preset of the same
    family (the name without ``_16l``) is the fix.  The decoder keeps 6 layers unless told, or is
    owned too when ``decoder_layers`` is given."""
    family = re.sub(r"_\d+l$", "", arch)  # transformer_dlcl_postnorm_16l -> ..._postnorm
    fix_option(arch, args, "encoder_layers", encoder_layers, family, f"{encoder_layers} encoder layers")
    if decoder_layers is None:
        set_default(args, "decoder_layers", 6)
    else:
        fix_option(arch, args, "decoder_layers", decoder_layers, family, f"{decoder_layers} decoder layers")
