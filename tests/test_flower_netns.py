"""Flower across real hosts, built on this machine: a SuperLink in one network namespace and three SuperNodes in
three others, joined by veth pairs on a bridge, with addresses that exist only inside those namespaces (the test
process itself cannot reach the SuperLink). TLS everywhere and SuperNode authentication: the three registered
nodes run the app, a fourth node whose key was never registered is refused, one node is killed after round 1 and
the run finishes with its client reported as dropped and its status "finished-degraded". Every namespace and
process is removed afterwards.

Skips with the reason where namespaces cannot be made (not root, no ``ip``, no CAP_NET_ADMIN).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("flwr", reason="the Flower extra is not installed (pip install 'fedblend[flower]')")

from fedblend.config import load_config  # noqa: E402
from tests.helpers import NODE_TIMEOUT, history  # noqa: E402
from tests.test_flower import FMNIST_TINY, _children, _logs  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

SUBNET = "10.77.0"  # the link's address is .1, node k's is .(10 + k): inside the namespaces only
LINK_ADDR = f"{SUBNET}.1"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.fixture
def hosts():
    """``(link_ns, [node_ns x 4])``: the SuperLink's namespace with a bridge at ``LINK_ADDR/24`` and four node
    namespaces, each with ``eth0`` (a veth whose peer is on the bridge) at ``SUBNET.(10 + k)/24``."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's ip")
    tag = f"fbns{os.getpid() % 100000}"
    link, nodes = f"{tag}-link", [f"{tag}-n{k}" for k in range(4)]
    made: list[str] = []

    def cleanup() -> None:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # also removes its veth ends

    try:
        for ns in (link, *nodes):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", link, "link", "add", "br0", "type", "bridge")
        _ip("-n", link, "addr", "add", f"{LINK_ADDR}/24", "dev", "br0")
        _ip("-n", link, "link", "set", "br0", "up")
        for k, ns in enumerate(nodes):
            port = f"{tag}v{k}"
            _ip("link", "add", port, "netns", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", link, "link", "set", port, "master", "br0")
            _ip("-n", link, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{SUBNET}.{10 + k}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
    except subprocess.CalledProcessError as exc:
        cleanup()
        pytest.skip(f"network namespaces cannot be made here: {' '.join(exc.cmd)}: {exc.stderr.strip()}")
    try:
        yield link, nodes
    finally:
        cleanup()
    assert not (_namespaces() & set(made)), "a namespace was left behind"


def _reachable_from_here(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((LINK_ADDR, port)) == 0


def test_tls_auth_deployment_across_namespace_hosts_survives_a_killed_node(hosts, tmp_path, real_data_dir, flwr_bin):
    from fedblend.flower.certs import make_certificates
    from fedblend.flower.deploy import CONNECTION, local_federation, write_app

    link, nodes = hosts
    certs = make_certificates(tmp_path / "certs", hosts=[LINK_ADDR], nodes=4)  # node-3: never registered
    tls = {"ca": str(certs / "ca.crt"), "cert": str(certs / "server.crt"), "key": str(certs / "server.key")}
    cfg = load_config(None, [*FMNIST_TINY, "rounds=3", "eval.every=3"])  # 3 clients, one per node
    out, work = tmp_path / "out", tmp_path / "fed"
    netns = {"superlink": link, "flwr": link, **{f"supernode-{k}": ns for k, ns in enumerate(nodes)}}
    with local_federation(work, tls=tls, auth=True, address=LINK_ADDR, netns=netns) as fed:
        fed.start_superlink()
        assert not _reachable_from_here(fed.port), "the SuperLink is reachable outside its namespaces"
        for k in range(3):
            assert fed.flwr("supernode", "register", str(certs / f"node-{k}.pub"), CONNECTION,
                            timeout=120).returncode == 0, _logs(work)
            fed.start_supernode(k, f'partition-id={k} num-partitions=3 state-dir="{work / f"node-{k}"}"',
                                key=str(certs / f"node-{k}"))
        intruder = fed.start_supernode(3, f'partition-id=0 num-partitions=3 state-dir="{work / "node-3"}"',
                                       key=str(certs / "node-3"))
        assert intruder.wait(120) != 0
        assert "Failed to activate SuperNode" in (work / "supernode-3.log").read_text()
        app = write_app(cfg, work / "app", out, real_data_dir, nodes=3, timeout=NODE_TIMEOUT)
        run = subprocess.Popen(fed._in_ns("flwr", [sys.executable, "-c",
                                                   "import sys; from flwr.cli.app import app; sys.exit(app())",
                                                   "run", str(app), CONNECTION, "--stream"]),
                               env=fed.env, cwd=work, stdout=open(work / "flwr-run.log", "wb"),
                               stderr=subprocess.STDOUT)
        try:
            t0 = time.monotonic()
            while not (out / "metrics.jsonl").exists() or len(history(out)) < 1:
                assert time.monotonic() - t0 < 600 and run.poll() is None, f"round 1 did not finish\n{_logs(work)}"
                time.sleep(0.5)
            fed.kill("supernode-2")  # its host goes down after round 1; it does not come back
            assert run.wait(600) == 0, _logs(work)
        finally:
            if run.poll() is None:
                run.kill()
    hist = history(out)
    assert [m["round"] for m in hist] == [1, 2, 3]
    assert "dropped_clients" not in hist[0]
    assert hist[1]["dropped_clients"] == [2] and hist[2]["dropped_clients"] == [2]  # node 2 served client 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished-degraded" and summary["rounds"] == 3  # it lost client 2: it says so
    assert summary["clients_lost"]["clients"] == [2] and summary["clients_lost"]["rounds"] == [2, 3]
    assert _children() == []
