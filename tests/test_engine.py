import dataclasses
import json

import pytest
import torch

from fedblend.common.rng import SeedTree
from fedblend.config import load_config
from fedblend.core.checkpoint import load_checkpoint
from fedblend.core.engine import Simulation
from fedblend.core.sampling import SamplingConfig, sample_clients
from fedblend.experiment import run_experiment
from tests.helpers import same_state, tiny_sim, without_timings

SYN = """
method = "{method}"
dataset = "synthetic"
model = "mlp"
rounds = 6
seed = 3
checkpoint_every = 2
[partition]
kind = "dirichlet"
alpha = 0.5
num_clients = 5
min_samples = 5
[train]
lr = 0.05
momentum = 0.9
batch_size = 16
optimizer_state = "keep"
[sampling]
scheme = "uniform_range"
low = 0.6
"""


def _cfg(tmp_path, method="fedavg", overrides=()):
    p = tmp_path / "c.toml"
    p.write_text(SYN.format(method=method))
    return load_config(p, list(overrides))


def _metrics(d):
    return without_timings([json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()])


def test_whole_tiny_run_is_deterministic(tmp_path, tiny_fed):
    a = tiny_sim(tiny_fed, "fedavg", rounds=3, seed=5, momentum=0.9, optimizer_state="keep")
    b = tiny_sim(tiny_fed, "fedavg", rounds=3, seed=5, momentum=0.9, optimizer_state="keep")
    c = tiny_sim(tiny_fed, "fedavg", rounds=3, seed=6, momentum=0.9, optimizer_state="keep")
    for s in (a, b, c):
        s.run()
    assert without_timings(a.history) == without_timings(b.history)
    assert all(torch.equal(a.server["global"][k], b.server["global"][k]) for k in a.server["global"])
    assert without_timings(a.history) != without_timings(c.history)


@pytest.mark.parametrize("method", ["fedavg", "local", "fedavg-ft"])
def test_resume_equals_uninterrupted(tmp_path, method):
    cfg = _cfg(tmp_path, method)
    full = run_experiment(cfg, tmp_path / "full")
    # "killed" after 3 rounds: the last checkpoint is from round 2, round 3 is redone after --resume
    stopped = run_experiment(cfg, tmp_path / "cut", stop_after=3)
    assert stopped == {"stopped_at": 3}
    assert load_checkpoint(tmp_path / "cut" / "checkpoint.pt")["next_round"] == 2
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True)
    assert _metrics(tmp_path / "full") == _metrics(tmp_path / "cut")
    for k in ("best_accuracy", "final_accuracy", "best_round", "rounds"):
        assert full[k] == resumed[k]
    a = load_checkpoint(tmp_path / "full" / "checkpoint.pt")
    b = load_checkpoint(tmp_path / "cut" / "checkpoint.pt")
    assert a["clients"] and same_state(a["clients"], b["clients"]) and same_state(a["server"], b["server"])


def test_resume_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        run_experiment(_cfg(tmp_path), tmp_path / "none", resume=True)


def test_results_directory_contract(tmp_path):
    s = run_experiment(_cfg(tmp_path, overrides=["rounds=2"]), tmp_path / "r")
    for f in ("config.toml", "partition.json", "partition.txt", "metrics.jsonl", "metrics.csv", "summary.json"):
        assert (tmp_path / "r" / f).exists(), f
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    for k in ("best_accuracy", "final_accuracy", "global_accuracy", "rounds", "seconds_per_round", "seed", "method"):
        assert k in summary
    assert 0 <= summary["final_accuracy"] <= 1 and summary["rounds"] == 2 and summary["seed"] == 3
    assert summary == s | {"wall_seconds": summary["wall_seconds"]}
    # the resolved config reproduces the run
    again = load_config(tmp_path / "r" / "config.toml")
    assert again.to_dict() == _cfg(tmp_path, overrides=["rounds=2"]).to_dict()


def test_sampling_schemes():
    tree = SeedTree(0)
    assert sample_clients(SamplingConfig("fixed", join_ratio=1.0), 10, 0, tree) == list(range(10))
    fixed = sample_clients(SamplingConfig("fixed", join_ratio=0.3), 10, 0, tree)
    assert len(fixed) == 3 and fixed == sorted(set(fixed))
    sizes = {len(sample_clients(SamplingConfig("uniform_range", low=0.6), 20, r, tree)) for r in range(200)}
    assert min(sizes) == 12 and max(sizes) == 20 and len(sizes) == 9
    assert sample_clients(SamplingConfig("fixed", join_ratio=0.3), 10, 4, tree) == \
        sample_clients(SamplingConfig("fixed", join_ratio=0.3), 10, 4, SeedTree(0))


def test_eval_every(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedavg", rounds=5)
    sim.protocol = type(sim.protocol)(every=2)
    sim.run()
    assert [("acc" in m) for m in sim.history] == [False, True, False, True, True]


def test_sequential_server_mode_sees_earlier_uploads(tiny_fed):
    """With sequential_server the second client of a round receives the model aggregated from the first."""
    from fedblend.algorithms.fedavg import FedAvg

    class SeqAvg(FedAvg):
        name = "seqavg-test"

        def declare(self, choice):
            return dataclasses.replace(super().declare(choice), sequential_server=True)

    sim = tiny_sim(tiny_fed, "fedavg", rounds=1)
    sim.method = SeqAvg()
    seen = []
    orig = sim.method.configure_train
    sim.method.configure_train = lambda server, cid, sctx: seen.append(orig(server, cid, sctx)) or seen[-1]
    sim.run_round()
    assert not torch.equal(seen[0].params()["fc1.weight"], seen[1].params()["fc1.weight"])


def test_disk_store_returns_what_was_stored_and_survives_resume(tiny_fed, tmp_path):
    """store = disk: exactly the states a memory store holds, one file per client; checkpoints are hard-linked
    snapshots, so a run resumed from round 2 after later writes equals the uninterrupted run."""
    from fedblend.core.state import DiskStore

    spec = dict(rounds=4, seed=2, join_ratio=0.5, momentum=0.5, optimizer_state="keep")
    mem = tiny_sim(tiny_fed, "fedavg+ala", **spec)
    mem.run()
    disk = Simulation.create(mem.method, tiny_fed, "mlp", mem.run_info.train, 4, 2, mem.sampling,
                             store=DiskStore(tmp_path / "clients"))
    disk.run_round(), disk.run_round()
    disk.save(tmp_path / "ck" / "checkpoint.pt")
    disk.run_round(), disk.run_round()  # later writes replace the live files, not the snapshot's
    assert without_timings(disk.history) == without_timings(mem.history)
    assert same_state(disk.store.states, mem.store.states) and sorted(disk.store) == sorted(mem.store.states)
    twin = Simulation.create(mem.method, tiny_fed, "mlp", mem.run_info.train, 4, 2, mem.sampling,
                             store=DiskStore(tmp_path / "clients2"))
    twin.restore(tmp_path / "ck" / "checkpoint.pt")
    assert twin.next_round == 2 and (tmp_path / "ck" / "clients.ckpt").is_dir()
    twin.run()
    assert without_timings(twin.history) == without_timings(mem.history)
    assert same_state(twin.store.states, mem.store.states)
    assert disk.store.get(99) is None and 99 not in disk.store


def test_eval_clients_subset_is_seeded(tiny_fed):
    from fedblend.core.evaluation import evaluate_params

    sim = tiny_sim(tiny_fed, "fedavg", rounds=2)
    other = tiny_sim(tiny_fed, "local", rounds=2)  # same seed, another method: the same clients
    sim.protocol = other.protocol = type(sim.protocol)(clients=2)
    chosen = sim.eval_clients(0)
    assert len(set(chosen)) == 2 and chosen == other.eval_clients(0)
    assert len({tuple(sim.eval_clients(t)) for t in range(20)}) > 1  # a different subset in other rounds
    m = sim.run_round()
    res = [evaluate_params(sim.model, sim.server["global"], tiny_fed.clients[c].test_x, tiny_fed.clients[c].test_y)
           for c in chosen]
    assert m["eval_clients"] == 2 and m["acc"] == sum(r[0] for r in res) / sum(r[2] for r in res)
    assert "eval_clients" not in tiny_sim(tiny_fed, "fedavg", rounds=1).run_round()  # all clients: no extra key


def test_run_with_disk_store_resumes_and_matches_memory(tmp_path):
    """store = "disk" through the run contract: same metrics as the memory store, files per client, and a killed
    run resumed (also switching the store, a runtime-only field) equals the uninterrupted one."""
    mem = run_experiment(_cfg(tmp_path, "fedavg+ala"), tmp_path / "mem")
    disk = run_experiment(_cfg(tmp_path, "fedavg+ala", ["store='disk'"]), tmp_path / "disk")
    assert _metrics(tmp_path / "mem") == _metrics(tmp_path / "disk") and mem["best_accuracy"] == disk["best_accuracy"]
    assert sorted(p.name for p in (tmp_path / "disk" / "clients").glob("*.pt"))
    assert (tmp_path / "disk" / "clients.ckpt").is_dir()
    run_experiment(_cfg(tmp_path, "fedavg+ala", ["store='disk'"]), tmp_path / "cut", stop_after=3)
    run_experiment(_cfg(tmp_path, "fedavg+ala"), tmp_path / "cut", resume=True)  # resumed in memory
    assert _metrics(tmp_path / "mem") == _metrics(tmp_path / "cut")


def test_engine_refuses_a_backend_that_is_not_a_backend(tiny_fed):
    class Duck:  # has run(), but not the interface the engine drives
        def run(self, jobs):
            return []

    with pytest.raises(TypeError, match="backend must be a fedblend.core.backend.Backend"):
        tiny_sim(tiny_fed, "fedavg", rounds=1, backend=Duck())


@pytest.mark.parametrize("backend", ["sequential", "vmap", "processes"])
def test_every_backend_reports_each_job_once_to_the_progress_hook(tiny_fed, backend):
    """``on_client("done", cid)`` once per training and per evaluation job, whichever backend runs them; the
    hook is unset after each exchange."""
    from fedblend.core.backends import make_backend

    be = make_backend(backend, workers=2, threads=1) if backend == "processes" else make_backend(backend)
    sim = tiny_sim(tiny_fed, "fedavg", rounds=2, seed=1, backend=be)
    done: list[int] = []
    sim.on_client = lambda kind, n: done.append(n) if kind == "done" else None
    with sim:
        sim.run()
    per_round = [sorted(m["selected"]) for m in sim.history]
    evaluated = tiny_fed.num_clients  # every client is evaluated each round
    assert len(done) == sum(len(s) for s in per_round) + evaluated * len(per_round)
    assert sorted(done[: len(per_round[0])]) == per_round[0]
    assert be.on_result is None
