"""fedblend: personalized federated learning built around adaptive aggregation.

Layers (arrows point down only): ``cli`` -> ``config`` / ``experiment`` -> ``algorithms`` -> ``core`` ->
``models`` / ``data`` -> ``common``.
See ``docs/architecture.md``.

From Python or a notebook: ``result = fedblend.run({"method": "fedala", "dataset": "fmnist", "rounds": 5})``
(:mod:`fedblend.api`): the summary, the per-round history and each client's results.
"""

__version__ = "0.1.0"

#: the notebook / Python API (``fedblend.api``), loaded on first use so ``import fedblend`` stays light
_API = ("run", "load", "load_config", "open_run", "RunResult")


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module("fedblend.api"), name)
    raise AttributeError(f"module 'fedblend' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
