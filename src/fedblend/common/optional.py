"""Optional packages (the extras of ``pyproject.toml``), imported where they are used.

A missing one is a one-line :class:`MissingPackageError` naming what needs it and the extra that installs it
(the command line prints it as ``fedblend: error: ...``, exit 2), never a traceback from inside a reader or a
plot. Callers for which the package only adds a by-product (a run's or a report's PNG) catch it and warn
instead.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from fedblend.common.errors import ConfigError


class MissingPackageError(ConfigError):
    """An optional package that the requested work needs is not installed; the message says which extra to
    install."""


def require(module: str, extra: str, what: str) -> ModuleType:
    """``module`` imported, or a :class:`MissingPackageError`: "WHAT needs the MODULE package ...: pip install
    'fedblend[EXTRA]'"."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise MissingPackageError(f"{what} needs the {module} package, which is not installed ({reason}): "
                                  f"pip install 'fedblend[{extra}]'") from exc


def pyplot(what: str) -> ModuleType:
    """``matplotlib.pyplot`` on the file-only Agg backend (extra ``plot``), for ``what`` (named in the error)."""
    require("matplotlib", "plot", what).use("Agg")
    return require("matplotlib.pyplot", "plot", what)
