"""One small module per method, composed from the parts in :mod:`fedblend.core`.

Importing this package registers every built-in method and transform: the package is a package entry point of
the groups a plug-in's are (``fedblend.methods`` / ``fedblend.transforms``: ``fedblend = "fedblend.algorithms"``
in ``pyproject.toml``), and :func:`fedblend.algorithms.registry.load_builtins` imports every module of it and
registers each class decorated with ``@register_method`` / ``@register_transform``. A new method's module needs
no line here.
"""

from fedblend.algorithms.registry import METHODS, TRANSFORMS, build_method, load_builtins

load_builtins()

__all__ = ["METHODS", "TRANSFORMS", "build_method"]
