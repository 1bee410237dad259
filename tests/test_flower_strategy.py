"""fedblend.flower.strategy: a method's server half as a Flower ``Strategy`` (``MethodStrategy``) and its client half
as ClientApp handlers (``client_handler``).

* In-process (seconds): ``MethodStrategy.start`` over a Grid whose nodes answer in this process (tests/test_flower.py's
  ``PushPullGrid``) equals ``fedblend run`` bit for bit for FedAvg, FedALA and FedAPA; its ``Result`` pools the
  evaluation as the engine does; a subclass's ``aggregate_train`` decides what is aggregated (replies left out) and
  what the global model becomes (arrays of its own); the refusals.
* Real processes: examples/flower-strategy (a ServerApp subclassing ``MethodStrategy``, a ClientApp registering
  ``client_handler``) submitted with ``flwr run`` to a SuperLink and 2 SuperNodes on loopback, on tiny real MNIST:
  its per-round scores equal ``fedblend run``'s of the same config, bit for bit. FedAvg in the default suite,
  FedALA and FedAPA with ``pytest --slow`` (as tests/test_flower_blocks.py; each ``flwr run`` pays a fresh ClientApp
  process per node and message).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower extra is not installed (pip install 'fedblend[flower]')")

import torch  # noqa: E402
from flwr.app import ArrayRecord  # noqa: E402

from fedblend.core.checkpoint import load_checkpoint  # noqa: E402
from fedblend.experiment import run_experiment  # noqa: E402
from fedblend.flower import MethodStrategy, client_reply  # noqa: E402
from fedblend.flower.backend import FlowerRunError  # noqa: E402
from tests.helpers import history  # noqa: E402
from tests.test_flower import PushPullGrid, _nodes, run_config, tiny_cfg  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flower-strategy"
CONFIG = EXAMPLE / "strategy_app" / "fedblend.toml"
SCORES = ("acc", "loss", "train_loss", "global_acc", "bytes_down", "bytes_up", "selected", "per_client")
METHODS = ("fedavg", "fedala", "fedapa", "fedapa:options.sequential=true")  # method[:a --set]


def strategy_run(strategy_cls, cfg, tmp: Path):
    """``strategy_cls(cfg).start`` over 2 in-process nodes; returns (the strategy, its Result, metrics rows)."""
    grid = PushPullGrid(run_config(cfg), _nodes(tmp))
    strategy = strategy_cls(cfg, out=tmp / "out", nodes=2)
    result = strategy.start(grid)
    return strategy, result, history(tmp / "out")


class Counting(MethodStrategy):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls: list[tuple[int, str, list[int]]] = []

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.calls.append((server_round, self.phase, [client_reply(r)[0] for r in replies]))
        return super().aggregate_train(server_round, replies)


@pytest.mark.parametrize("spec", METHODS)
def test_strategy_equals_fedblend_run(spec, tmp_path):
    """The engine's round loop through the Strategy's methods: the same per-round scores as the sequential
    simulator; one ``aggregate_train`` per exchange (per client for a sequential server); the Result carries the
    final global model and the evaluation pooled as the engine pools it."""
    method, *sets = spec.split(":")
    cfg = tiny_cfg(method, "rounds=2", *sets)
    run_experiment(cfg, tmp_path / "sim")
    strategy, result, rows = strategy_run(Counting, cfg, tmp_path)
    sequential = cfg.build_method().traits.sequential_server
    for row in rows:
        calls = [c for c in strategy.calls if c[0] == row["round"]]
        assert [c for _, _, cs in calls for c in cs] == row["selected"] and {p for _, p, _ in calls} == {"train"}
        assert len(calls) == (len(row["selected"]) if sequential else 1)
    sim = history(tmp_path / "sim")
    assert len(rows) == len(sim) == 2
    for a, b in zip(sim, rows):
        assert {k: a.get(k) for k in SCORES} == {k: b.get(k) for k in SCORES}, method
    for row in rows:
        ev = result.evaluate_metrics_clientapp[row["round"]]
        assert (ev["acc"], ev["loss"], ev["clients"]) == (row["acc"], row["loss"], 4)
        assert ev.get("global_acc") == row.get("global_acc")
        assert result.train_metrics_clientapp[row["round"]]["train_loss"] == row["train_loss"]
    server = load_checkpoint(tmp_path / "out" / "checkpoint.pt")["server"]
    if len(result.arrays):  # a method with a global model (FedAPA has none)
        final = result.arrays.to_torch_state_dict()
        assert final.keys() == server["global"].keys()
        assert all(torch.equal(final[k], server["global"][k]) for k in final)


class Halving(MethodStrategy):
    """Server-side logic of its own: the method's aggregate, then the global model halved; every call logged."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls: list[tuple[int, list[int], list[int]]] = []
        self.sent: list[dict] = []

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        self.calls.append((server_round, [client_reply(r)[0] for r in replies],
                           sorted({r.metadata.src_node_id for r in replies})))
        self.sent.append({k: v / 2 for k, v in arrays.to_torch_state_dict().items()})
        return ArrayRecord(self.sent[-1]), metrics


def test_arrays_returned_by_aggregate_train_become_the_global_model(tmp_path):
    cfg = tiny_cfg("fedavg", "rounds=2")
    strategy, result, rows = strategy_run(Halving, cfg, tmp_path)
    assert [c[0] for c in strategy.calls] == [1, 2]
    assert all(sorted(clients) == rows[0]["selected"] and nodes == [100, 101] for _, clients, nodes in strategy.calls)
    server = load_checkpoint(tmp_path / "out" / "checkpoint.pt")["server"]
    assert all(torch.equal(server["global"][k], strategy.sent[-1][k]) for k in strategy.sent[-1])
    plain = tmp_path / "plain"
    _, _, base = strategy_run(MethodStrategy, cfg, plain)
    assert base[0]["train_loss"] == rows[0]["train_loss"]  # round 1 trains from the same initial model ...
    assert base[1]["train_loss"] != rows[1]["train_loss"]  # ... round 2 from the halved one


class DropClientZero(MethodStrategy):
    def aggregate_train(self, server_round, replies):
        return super().aggregate_train(server_round, [r for r in replies if client_reply(r)[0] != 0])


def test_replies_left_out_by_aggregate_train_are_not_aggregated(tmp_path):
    cfg = tiny_cfg("fedavg", "rounds=1")
    strategy, _, _ = strategy_run(DropClientZero, cfg, tmp_path / "drop")
    _, _, _ = strategy_run(MethodStrategy, cfg, tmp_path / "all")
    dropped = load_checkpoint(tmp_path / "drop" / "out" / "checkpoint.pt")["server"]["global"]
    full = load_checkpoint(tmp_path / "all" / "out" / "checkpoint.pt")["server"]["global"]
    assert not all(torch.equal(dropped[k], full[k]) for k in full)
    # what was aggregated: the weighted mean of clients 1-3's uploads, as FedAvg computes it over them
    grid = PushPullGrid(run_config(cfg), _nodes(tmp_path / "check"))
    seen = {}

    class Spy(MethodStrategy):
        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            seen.update(dict(client_reply(r) for r in replies))
            return super().aggregate_train(server_round, [r for r in replies if client_reply(r)[0] != 0])

    Spy(cfg, out=tmp_path / "check" / "out", nodes=2).start(grid)
    n = {c: seen[c].metrics["num_samples"] for c in (1, 2, 3)}
    for k in full:
        want = sum(seen[c].arrays["params"][k] * (n[c] / sum(n.values())) for c in (1, 2, 3))
        assert torch.allclose(dropped[k], want, atol=1e-6)


def test_refusals(tmp_path):
    cfg = tiny_cfg("fedavg", "rounds=1")

    class NoSuper(MethodStrategy):
        def aggregate_train(self, server_round, replies):
            return None, None

    class NoMessages(MethodStrategy):
        def configure_train(self, server_round, arrays, config, grid):
            return []

    with pytest.raises(FlowerRunError, match="did not call MethodStrategy.aggregate_train"):
        strategy_run(NoSuper, cfg, tmp_path / "a")
    with pytest.raises(FlowerRunError, match="one per node"):
        strategy_run(NoMessages, cfg, tmp_path / "b")
    strategy = MethodStrategy(cfg, out=tmp_path / "c")
    with pytest.raises(ValueError, match="initial_arrays"):
        strategy.start(None, ArrayRecord({"w": torch.zeros(2)}))
    with pytest.raises(ValueError, match="fedblend.rounds"):
        strategy.start(None, num_rounds=5)


def test_run_config_reaches_the_strategy():
    """``fedblend.*`` keys of the Flower run config override the config's fields, deployment options the
    keyword arguments (as for server_app)."""
    s = MethodStrategy(CONFIG, run_config={"fedblend.method": "fedapa", "fedblend.seed": 7, "out": "/tmp/x",
                                           "num-nodes": 3}, nodes=2)
    assert (s.cfg.method, s.cfg.seed, s.cfg.dataset, str(s.out), s.run_config["num-nodes"]) == \
        ("fedapa", 7, "mnist", "/tmp/x", 3)


# ------------------------------------------------------------------------------------------------ real processes
@pytest.mark.parametrize("method", ["fedavg", *(pytest.param(m, marks=pytest.mark.slow) for m in ("fedala", "fedapa"))])
def test_example_under_flwr_run_equals_fedblend_run(method, tmp_path, real_data_dir, flwr_bin):
    from .test_flower_blocks import flwr_equals_fedblend_run

    # absolute: the ServerApp runs in Flower's app folder, not here (FEDBLEND_DATA may be relative, as in CI)
    flw, out = flwr_equals_fedblend_run(EXAMPLE, CONFIG, tmp_path, method, [], f'data-dir="{real_data_dir.resolve()}"',
                                        SCORES)
    assert len(flw) == 2
    # the subclass's own code ran in the ServerApp: one aggregation per exchange, with the clients and nodes
    own = json.loads((out / "strategy-log.json").read_text())
    for r in (1, 2):
        aggs = [a for a in own["aggregations"] if a["round"] == r]
        assert sorted(c for a in aggs for c in a["clients"]) == flw[r - 1]["selected"]
        assert len(aggs) == 1  # (FedAPA's default server is not sequential)
        assert all(len(a["nodes"]) == len({c % 2 for c in a["clients"]}) for a in aggs)
        assert own["result"]["evaluate"][str(r)]["acc"] == flw[r - 1]["acc"]
