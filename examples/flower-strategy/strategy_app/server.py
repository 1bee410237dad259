"""The ServerApp: your own ``ServerApp`` whose ``main`` runs a fedblend method's server half as a Flower Strategy.

``LoggedStrategy`` subclasses :class:`fedblend.flower.MethodStrategy` with server-side code of its own around the
method's: ``configure_train`` tags every training message (Flower metadata: nothing the method reads), and
``aggregate_train`` records, per round, which clients' updates the method aggregated, from which node, and the norm
of the global model it made. ``main`` then writes that log and the Flower ``Result`` beside fedblend's results
(``strategy-log.json``). None of it changes what the method computes: the per-round results equal
``fedblend run``'s for the same config and seed.
"""

import json
from pathlib import Path

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedblend.flower import MethodStrategy, client_reply
from fedblend.flower.strategy import result_json

CONFIG = Path(__file__).parent / "fedblend.toml"


class LoggedStrategy(MethodStrategy):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.log: list[dict] = []

    def configure_train(self, server_round, arrays, config, grid):
        messages = list(super().configure_train(server_round, arrays, config, grid))
        for m in messages:
            m.metadata.group_id = f"round-{server_round}"
        return messages

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)  # the method's own aggregation
        norm = None if arrays is None else float(torch.sqrt(sum((t.double() ** 2).sum()
                                                                for t in arrays.to_torch_state_dict().values())))
        self.log.append({"round": server_round, "phase": self.phase,
                         "clients": [client_reply(r)[0] for r in replies],
                         "nodes": sorted({r.metadata.src_node_id for r in replies}),
                         "num_examples": metrics["num-examples"] if metrics else 0, "global_norm": norm})
        return arrays, metrics


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    strategy = LoggedStrategy(CONFIG, run_config=context.run_config)
    result = strategy.start(grid)
    log = {"aggregations": strategy.log, "result": json.loads(result_json(result))}
    (strategy.out / "strategy-log.json").write_text(json.dumps(log, indent=1) + "\n")
