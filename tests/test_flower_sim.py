"""``backend = "flower-sim"`` (fedblend.flower.sim): the run on Flower's Simulation Engine, ClientApps in Ray actors,
equal to the sequential backend bit for bit. Skipped with a reason without Flower or Ray
(pip install 'fedblend[simulation]').

Default suite: FedAvg through ``fedblend run --backend flower-sim`` and FedALA through ``simulate`` (each starts a
private Ray instance with 2 actors: about 25-35 s on 2 busy cores), and the refusals (no Ray started). With
``pytest --slow``: every other registered method, a two-node Ray cluster on this machine (``ray start --head``
and ``ray start --address``, each with its own ports and temp dir) running the simulation, and Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower extra is not installed (pip install 'fedblend[simulation]')")
pytest.importorskip("ray", reason="Ray is not installed (pip install 'fedblend[simulation]')")

from fedblend.algorithms import METHODS  # noqa: E402
from fedblend.cli.main import main  # noqa: E402
from fedblend.common.errors import ConfigError  # noqa: E402
from fedblend.config import load_config  # noqa: E402
from fedblend.core.checkpoint import load_checkpoint  # noqa: E402
from fedblend.experiment import run_experiment  # noqa: E402
from fedblend.flower.sim import ContextStates, simulate  # noqa: E402
from tests.helpers import history  # noqa: E402
from tests.test_flower import TINY as FLOWER_TINY  # noqa: E402
from tests.test_flower import tiny_cfg as flower_tiny_cfg  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = [*FLOWER_TINY, "rounds=2"]  # the Flower tests' tiny config, two rounds
SCORES = ("round", "acc", "loss", "train_loss", "global_acc", "bytes_down", "bytes_up", "selected", "per_client")
DEFAULT = ("fedavg", "fedala")  # in the default suite; the others with --slow


def tiny_cfg(method: str):
    return flower_tiny_cfg(method, "rounds=2")


def assert_equal_runs(seq: Path, sim: Path, method: str) -> None:
    a, b = history(seq), history(sim)
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        assert {k: x.get(k) for k in SCORES} == {k: y.get(k) for k in SCORES}, method
        assert "flower_faults" not in y and "dropped_clients" not in y, y
    # the client states lived in the nodes' contexts: the server's checkpoint holds only their versions
    ck = load_checkpoint(sim / "checkpoint.pt")
    assert all(set(s) == {"flower_state_version"} for s in ck["clients"].values())


def test_cli_fedavg_equals_sequential(tmp_path, capsys):
    """``fedblend run --backend flower-sim --workers 2`` writes the run contract with the sequential backend's
    scores."""
    run_experiment(tiny_cfg("fedavg"), tmp_path / "seq")
    sets = [a for s in [*TINY, "method='fedavg'"] for a in ("--set", s)]
    assert main(["run", *sets, "--backend", "flower-sim", "--workers", "2", "--out", str(tmp_path / "sim"),
                 "--quiet"]) == 0
    assert "results in" in capsys.readouterr().out
    assert_equal_runs(tmp_path / "seq", tmp_path / "sim", "fedavg")
    assert (tmp_path / "sim" / "summary.json").exists() and (tmp_path / "sim" / "config.toml").exists()


@pytest.mark.parametrize("method", [m if m in DEFAULT else pytest.param(m, marks=pytest.mark.slow)
                                    for m in [*sorted(set(METHODS) - {"fedavg"}), "fedavg+ala"]])
def test_simulation_equals_sequential(method, tmp_path):
    """Every registered method: per-round scores through Flower's Simulation Engine (2 Ray actors, one virtual
    SuperNode per client, states in the nodes' contexts) equal the sequential backend's bit for bit."""
    cfg = tiny_cfg(method)
    run_experiment(cfg, tmp_path / "seq")
    simulate(cfg, tmp_path / "sim", actors=2)
    assert_equal_runs(tmp_path / "seq", tmp_path / "sim", method)


@pytest.mark.slow
def test_ctrl_c_stops_the_simulation(tmp_path):
    """Ctrl-C in the caller's thread (as ``fedblend run`` gets it, SIGTERM included) stops Flower's engine, Ray and the
    ServerApp thread: RunInterrupted says what was kept and that it cannot resume; the directory is unlocked."""
    import threading

    from fedblend.common.errors import RunInterrupted

    def progress(row, sim):  # in the ServerApp's thread: a real SIGINT to the main thread, as Ctrl-C
        if row["round"] == 2:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    cfg = load_config(None, [*TINY, "method='fedavg'", "rounds=50"])
    with pytest.raises(RunInterrupted, match="cannot resume") as info:
        simulate(cfg, tmp_path / "sim", progress=progress)
    assert info.value.completed_rounds >= 2 and len(history(tmp_path / "sim")) < 50
    run_experiment(tiny_cfg("fedavg"), tmp_path / "sim", force=True)  # not locked any more


def test_refusals(tmp_path):
    """No Ray started: a resume (the contexts are gone), device cuda, and the engine without Flower driving it."""
    cfg = tiny_cfg("fedavg")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match="cannot be resumed"):
        simulate(cfg, tmp_path / "old", resume=True)
    with pytest.raises(ConfigError, match="runs on CPU only"):
        load_config(None, [*TINY, "backend='flower-sim'", "device='cuda'"])
    with pytest.raises(ConfigError, match="fedblend run .* --backend flower-sim"):
        run_experiment(load_config(None, [*TINY, "backend='flower-sim'"]), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_context_states_keep_the_last_versions_exactly():
    import torch
    from flwr.app import RecordDict

    states = ContextStates(RecordDict())
    for v in (1, 2, 3):
        states.save(7, v, {"w": torch.full((2,), float(v)), "s": torch.tensor(0.5), "n": v}, keep=2)
    assert sorted(states.state.array_records) == ["fedblend-client-7-v2", "fedblend-client-7-v3"]
    back = states.load(7, 3)
    assert torch.equal(back["w"], torch.full((2,), 3.0)) and back["n"] == 3
    assert back["s"].shape == () and back["s"].item() == 0.5  # 0-dim stays 0-dim (PartialFed's strategy)
    with pytest.raises(KeyError, match="version 1"):
        states.load(7, 1)


# ------------------------------------------------------------------------------------------ a Ray cluster
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_args(k: int) -> list[str]:
    """One small node (1 CPU, 100 MB object store) with its own ports, so two fit on one machine."""
    ports = {f: _free_port() for f in ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
                                       "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")}
    base = 21000 + 1000 * k + (os.getpid() % 20) * 50
    return ["--num-cpus=1", "--object-store-memory=100000000", "--block", "--disable-usage-stats",
            "--node-ip-address=127.0.0.1", f"--min-worker-port={base}", f"--max-worker-port={base + 49}",
            *(f"--{f}={p}" for f, p in ports.items())]


def _cluster_cpus(address: str, env: dict) -> float:
    code = (f"import ray; ray.init(address={address!r}, logging_level='ERROR'); "
            "print(sum(n['Resources'].get('CPU', 0) for n in ray.nodes() if n['Alive']))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
        return float(out.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return 0.0


@pytest.fixture
def ray_cluster(tmp_path):
    """A head and a second node (``ray start --block``, each in its own session, so stopping one stops exactly the
    processes it started: its process group); yields the head's address. Skips if they do not come up."""
    ray = Path(sys.executable).parent / "ray"
    if not ray.exists():
        pytest.skip(f"Ray's command line is not at {ray}")
    temp = Path(f"/tmp/fb-ray-{os.getpid()}")  # Ray's session files (short: unix socket paths are limited)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    port = _free_port()
    address = f"127.0.0.1:{port}"
    procs = []
    try:
        procs.append(subprocess.Popen([str(ray), "start", "--head", f"--port={port}", f"--temp-dir={temp}",
                                       "--include-dashboard=false", f"--ray-client-server-port={_free_port()}",
                                       *_node_args(0)], stdout=open(tmp_path / "head.log", "w"),
                                      stderr=subprocess.STDOUT, start_new_session=True, env=env))
        time.sleep(5)
        procs.append(subprocess.Popen([str(ray), "start", f"--address={address}", *_node_args(1)],
                                      stdout=open(tmp_path / "node.log", "w"), stderr=subprocess.STDOUT,
                                      start_new_session=True, env=env))
        end = time.monotonic() + 90
        while _cluster_cpus(address, env) < 2:
            if time.monotonic() > end or any(p.poll() is not None for p in procs):
                pytest.skip(f"the two-node Ray cluster did not start: {(tmp_path / 'head.log').read_text()[-800:]}"
                            f"{(tmp_path / 'node.log').read_text()[-800:]}")
            time.sleep(2)
        yield address
    finally:
        for p in reversed(procs):
            os.killpg(p.pid, signal.SIGTERM)
        end = time.monotonic() + 10
        while any(_alive(p.pid) for p in procs) and time.monotonic() < end:  # the whole group, not only `ray start`
            time.sleep(0.5)
        for p in procs:
            if _alive(p.pid):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
        time.sleep(1)
        shutil.rmtree(temp, ignore_errors=True)
    assert not [p.pid for p in procs if _alive(p.pid)], "a Ray node's processes outlived the test"


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.slow
def test_two_node_ray_cluster_equals_sequential(ray_cluster, tmp_path, monkeypatch):
    """The simulation attached to a two-node Ray cluster (RAY_ADDRESS): the pool has one actor per CPU of the
    cluster, two nodes of one CPU each, so one actor runs on each node; results equal the sequential backend's."""
    cfg = tiny_cfg("fedala")
    run_experiment(cfg, tmp_path / "seq")
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster)
    simulate(cfg, tmp_path / "sim")
    assert_equal_runs(tmp_path / "seq", tmp_path / "sim", "fedala")


def test_local_simulation_binds_ray_to_loopback_and_a_cluster_is_joined_only_when_named():
    """A local ``flower-sim`` run starts its private Ray instance on 127.0.0.1, not on the machine's network
    address; only an explicit address (``RAY_ADDRESS``) joins a cluster, and then nothing local is set."""
    from fedblend.flower.sim import backend_config

    local = backend_config(2, None)["init_args"]
    assert local["address"] == "local" and local["_node_ip_address"] == "127.0.0.1" and local["num_cpus"] == 2
    cluster = backend_config(2, "10.0.0.5:6379")["init_args"]
    assert cluster["address"] == "10.0.0.5:6379" and "_node_ip_address" not in cluster and "num_cpus" not in cluster
