"""The ServerApp and ClientApp of this Flower app: fedblend's building blocks on the config next to this file.

The method is the config's ``method`` (any registered fedblend method or plug-in), overridden here by the run
config's ``fedblend.method`` (pyproject.toml, or ``flwr run ... --run-config 'fedblend.method="fedala"'``).
"""

from pathlib import Path

from fedblend.flower import client_app, server_app

CONFIG = Path(__file__).parent / "fedblend.toml"  # shipped in the app's FAB (*.toml files are)

server = server_app(CONFIG)
client = client_app(CONFIG)
