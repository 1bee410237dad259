"""fedblend: personalized federated learning built around adaptive aggregation.

Layers (arrows point down only): ``cli`` -> ``config`` / ``experiment`` -> ``algorithms`` -> ``core`` ->
``models`` / ``data`` -> ``common``.
See ``docs/architecture.md``.
"""

__version__ = "0.1.0"
