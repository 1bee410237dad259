"""Helpers below every other layer: the seed tree, parameter dictionaries, typed option tables, the state codec."""
