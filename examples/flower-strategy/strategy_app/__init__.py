"""A Flower app that uses a fedblend method as a Strategy (server.py) and as ClientApp handlers (client.py)."""
