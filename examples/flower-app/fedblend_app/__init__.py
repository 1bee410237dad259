"""fedblend-flower-app: a fedblend method as a Flower app."""
