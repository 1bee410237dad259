"""Any fedblend method deployed on Flower (the optional extra ``pip install 'fedblend[flower]'``).

* :class:`MethodStrategy` (:mod:`fedblend.flower.strategy`): a method's server half as a Flower ``Strategy`` in your
  own ``ServerApp`` (subclass it, or compose it in your ``@app.main()``), and :func:`client_handler`, its client
  half as the ``@app.train()`` / ``@app.evaluate()`` / ``@app.query()`` handler of your own ``ClientApp``
  (docs/deploy.md, examples/flower-strategy);
* :func:`server_app` / :func:`client_app` (:mod:`fedblend.flower.blocks`): a fedblend method as the whole
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

__all__ = ["MethodStrategy", "client_app", "client_handler", "client_reply", "server_app"]
_HOME = {"MethodStrategy": "strategy", "client_reply": "strategy"}  # else blocks


def __getattr__(name: str):
    # lazy: ``fedblend.flower.deploy`` (the CLI) imports without flwr and says how to install it
    if name in __all__:
        import importlib

        return getattr(importlib.import_module(f"fedblend.flower.{_HOME.get(name, 'blocks')}"), name)
    raise AttributeError(f"module 'fedblend.flower' has no attribute {name!r}")
