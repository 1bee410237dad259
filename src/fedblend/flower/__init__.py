"""Any fedblend method deployed on Flower (the optional extra ``pip install 'fedblend[flower]'``).

* :func:`server_app` / :func:`client_app` (:mod:`fedblend.flower.blocks`): a fedblend method as the
  ``ServerApp`` / ``ClientApp`` of your own Flower app (docs/deploy.md, examples/flower-app);
* :mod:`fedblend.flower.wire`: jobs and results as Flower records (the state codec's named arrays), shape and
  data-digest checks;
* :mod:`fedblend.flower.backend`: the engine backend that sends client jobs to SuperNodes through Flower's Grid;
* :mod:`fedblend.flower.node`: a node's client runtime, its data partition and its clients' states;
* :mod:`fedblend.flower.apps`: the ``ServerApp`` / ``ClientApp`` of the generated app;
* :mod:`fedblend.flower.deploy`: the generated Flower app and ``fedblend deploy`` (loopback SuperLink +
  SuperNodes). How to deploy on real machines: docs/deploy.md;
* :mod:`fedblend.flower.sim`: ``backend = "flower-sim"``, the run on Flower's Simulation Engine (ClientApps in Ray
  actors, the extra ``pip install 'fedblend[simulation]'``; docs/deploy.md section 4).
"""

__all__ = ["client_app", "server_app"]


def __getattr__(name: str):
    # lazy: ``fedblend.flower.deploy`` (the CLI) imports without flwr and says how to install it
    if name in __all__:
        from fedblend.flower import blocks

        return getattr(blocks, name)
    raise AttributeError(f"module 'fedblend.flower' has no attribute {name!r}")
