"""fedblend: personalized federated learning built around adaptive aggregation.

Layers (arrows point down only): ``cli`` -> ``algorithms`` -> ``core`` -> ``models`` / ``data``.
See ``docs/architecture.md``.
"""

__version__ = "0.1.0"
