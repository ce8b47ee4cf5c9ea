"""Deep-Att / Deep-ED with fast-forward connections (Zhou et al., TACL 2016)."""

from .config import DeepAttConfig
from .model import DeepAttModel  # registers the model ...

# isort: split
from . import presets  # noqa: F401,E402  (... then its named architectures)

__all__ = ["DeepAttConfig", "DeepAttModel"]
