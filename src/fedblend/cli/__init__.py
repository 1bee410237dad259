"""Command line: ``fedblend run``, ``fedblend report``, ``fedblend partition``, ``fedblend methods``."""
