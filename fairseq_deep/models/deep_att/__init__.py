"""Deep-Att / Deep-ED with fast-forward connections (Zhou et al., TACL 2016)."""

from . import presets  # noqa: F401  (registers the named architectures)
from .model import DeepAttConfig, DeepAttModel

__all__ = ["DeepAttConfig", "DeepAttModel"]
