"""RNMT+ (Chen et al. 2018) and its hybrids with the Transformer (Sec. 6); importing registers them."""

from . import hybrids, model, presets  # noqa: F401  (register the model and its architectures)
from .decoder import RNMTPlusDecoder
from .encoder import RNMTPlusEncoder
from .model import RNMTPlusModel

__all__ = ["RNMTPlusDecoder", "RNMTPlusEncoder", "RNMTPlusModel"]
