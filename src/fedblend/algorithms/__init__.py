"""One small module per method, composed from the parts in :mod:`fedblend.core`.

Importing this package registers every built-in method and transform: each is an entry point of the group a
plug-in's is (``fedblend.methods`` / ``fedblend.transforms``, declared in ``pyproject.toml``), loaded by
:func:`fedblend.algorithms.registry.load_builtins`.
"""

from fedblend.algorithms.registry import METHODS, TRANSFORMS, build_method, load_builtins

load_builtins()

__all__ = ["METHODS", "TRANSFORMS", "build_method"]
