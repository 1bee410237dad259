"""Building blocks: any registered fedblend method (plug-ins included) as the ``ServerApp`` and ``ClientApp`` of
your own Flower app.

::

    # my_app/app.py -- [tool.flwr.app.components] serverapp = "my_app.app:server", clientapp = "my_app.app:client"
    from pathlib import Path
    from fedblend.flower import client_app, server_app

    CONFIG = Path(__file__).parent / "fedblend.toml"    # a fedblend run config (ships in the FAB: *.toml)
    server = server_app(CONFIG)
    client = client_app(CONFIG)

The two apps are the ones ``fedblend deploy`` runs (:mod:`fedblend.flower.apps`): the ServerApp is the engine's
round loop over Flower's ``Grid`` (:class:`~fedblend.flower.backend.FlowerBackend`), the ClientApp runs the
method's client half for the node's clients (:class:`~fedblend.flower.node.Node`: its partition from the node
config's ``partition-id`` / ``num-partitions``, its clients' states in its state directory). Only where the
fedblend config comes from differs: the argument of the factory instead of a generated run config, so the
accuracies equal ``fedblend run``'s for the same config and seed (one torch thread, the default).

The app's Flower run config (``[tool.flwr.app.config]``, ``flwr run --run-config``) may set

* the deployment options, under the names of the generated app: ``out`` (the results directory on the
  ServerApp's machine, default ``runs/LABEL`` in its working directory,
  where ``fedblend run`` writes), ``data-dir``, ``num-nodes``,
  ``timeout``, ``min-clients``, ``threads``, ``resume``, ``force`` (they override the factory's keyword arguments),
  ``state-dir`` (the nodes' state directories' parent where a node config names none);
* fedblend config fields under ``fedblend.``: ``fedblend.rounds = 5`` or a table ``[tool.flwr.app.config.fedblend]``
  with ``method = "fedala"``, ``train.lr = 0.05`` ... (``--set`` of ``fedblend run``, applied to the factory's
  config on the server and on every node alike).

Give both factories the same config: the nodes check their data against the server's partition (a mismatch is
refused at the greeting), but not the method.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedblend.config import RunConfig, apply_overrides, config_from_dict, load_config, toml_value
from fedblend.flower import apps

PREFIX = "fedblend."  # run config keys that override fedblend config fields
DEFAULTS: dict[str, Any] = {"out": "", "data-dir": "", "num-nodes": 1, "timeout": 600.0, "min-clients": 1,
                            "threads": 1, "resume": False, "force": False, "state-dir": ""}

def raw_config(config: str | Path | Mapping[str, Any] | RunConfig | None,
               overrides: list[str] | None = None) -> dict[str, Any]:
    """The fedblend config as a raw dict (as read from TOML): from a config file path, a dict, a
    :class:`~fedblend.config.RunConfig` or ``None`` (the defaults), with ``--set``-style ``overrides``.
    Checked now, so a bad config fails when the app module is imported, not in round 1."""
    if isinstance(config, RunConfig):
        raw = config.to_dict()
    elif isinstance(config, Mapping):
        raw = json.loads(json.dumps(dict(config)))  # a copy (and plain values only)
    else:
        raw = load_config(config).to_dict() if config is not None else {}
    raw = apply_overrides(raw, list(overrides or []))
    config_from_dict(raw)
    return raw


def run_config_for(raw: Mapping[str, Any], run_config: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict:
    """The run config :mod:`fedblend.flower.apps` expects (``fedblend-config`` and the deployment options) for
    the app's config ``raw`` and its Flower run config (``fedblend.*`` keys and deployment options, see the module
    docstring)."""
    sets = [f"{k[len(PREFIX):]}={toml_value(v)}" for k, v in sorted(run_config.items()) if k.startswith(PREFIX)]
    cfg = config_from_dict(apply_overrides(dict(raw), sets))
    rc = {**DEFAULTS, **defaults, **{k: v for k, v in run_config.items() if k in DEFAULTS}}
    rc["out"] = str(rc["out"] or Path("runs") / cfg.label)
    rc["fedblend-config"] = json.dumps(cfg.resolved(), sort_keys=True)
    return rc


def server_app(config: str | Path | Mapping[str, Any] | RunConfig | None, *, overrides: list[str] | None = None,
               out: str | Path = "", data_dir: str | Path = "", nodes: int = 1, timeout: float = 600.0,
               min_clients: int = 1, threads: int = 1, resume: bool = False, force: bool = False) -> ServerApp:
    """A Flower ``ServerApp`` running ``config``'s method (its server half, the engine's round loop) on the
    SuperNodes of the run.

    ``out``: the results directory (the run contract of ``fedblend run``: config.toml, metrics.jsonl,
    summary.json, checkpoint.pt); ``nodes``: SuperNodes to wait for before round 1 (give all of them: a client
    whose node joins later misses the rounds before); ``timeout``: seconds to wait for a node's answer;
    ``min_clients``: fewer answers stop the run; ``threads``: torch threads; ``resume`` / ``force`` as in
    ``fedblend run``. The app's run config overrides each (module docstring)."""
    raw = raw_config(config, overrides)
    defaults = {"out": str(out), "data-dir": str(data_dir), "num-nodes": int(nodes), "timeout": float(timeout),
                "min-clients": int(min_clients), "threads": int(threads), "resume": bool(resume),
                "force": bool(force)}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        apps.serve(grid, run_config_for(raw, context.run_config, defaults))

    return app


def client_handler(config: str | Path | Mapping[str, Any] | RunConfig | None, *,
                   overrides: list[str] | None = None) -> Callable[[Message, Context], Message]:
    """The client half of ``config``'s method as one Flower handler, ``handler(msg, context) -> reply``, for the
    ``@app.train()``, ``@app.evaluate()`` and ``@app.query()`` (fedblend's greeting) handlers of your own
    ``ClientApp``: it answers a fedblend message (a job batch, a greeting) for the clients of the node, those of
    its node config (``partition-id`` / ``num-partitions``, or ``clients``; the simulation runtime sets the first
    two), with their states in the node's ``state-dir`` (default ``~/.fedblend/flower-node-K``). The app's
    Flower run config applies as for :func:`server_app` (``fedblend.*`` keys)::

        app = ClientApp()
        fedblend_client = client_handler("fedblend.toml")

        @app.train()
        def train(msg: Message, context: Context) -> Message:
            return fedblend_client(msg, context)      # your own code before or after it
    """
    raw = raw_config(config, overrides)
    memo: dict[str, dict] = {}

    def handle(msg: Message, context: Context) -> Message:
        key = json.dumps(dict(context.run_config), sort_keys=True, default=str)
        if key not in memo:
            memo[key] = run_config_for(raw, context.run_config, {})
        return apps.answer(msg, context, run_config=memo[key])

    return handle


def client_app(config: str | Path | Mapping[str, Any] | RunConfig | None, *,
               overrides: list[str] | None = None) -> ClientApp:
    """A Flower ``ClientApp`` running ``config``'s method (its client half, :func:`client_handler`) for the
    clients of the node."""
    handle = client_handler(config, overrides=overrides)
    app = ClientApp()
    app.query()(handle)
    app.train()(handle)
    app.evaluate()(handle)
    return app
