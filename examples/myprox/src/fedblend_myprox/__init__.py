"""Example fedblend plug-ins (see the package's pyproject.toml for the entry points)."""
