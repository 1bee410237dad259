"""``fedblend deploy`` with proxy variables set: the processes it starts exempt their loopback addresses from the
proxy (gRPC honours ``http_proxy`` / ``https_proxy`` / ``grpc_proxy``), and a failed run says which process
failed and quotes its log.

The real deploy with every proxy variable pointing at a port where nothing listens is
``tests/test_flower.py::test_deploy_on_loopback_equals_fedblend_run`` (one deployment, about 100 s, serves both).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("flwr", reason="the Flower extra is not installed (pip install 'fedblend[flower]')")

from fedblend.flower import deploy  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # the deploy's processes run one thread each

DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens there
PROXY_VARS = ["http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "grpc_proxy", "all_proxy", "ALL_PROXY"]


def test_started_processes_exempt_loopback_from_the_proxy(tmp_path, monkeypatch):
    for v in PROXY_VARS:
        monkeypatch.setenv(v, DEAD_PROXY)
    monkeypatch.setenv("no_proxy", "example.org")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_grpc_proxy", raising=False)
    fed = deploy.LocalFederation(tmp_path / "w")
    for var in ("no_proxy", "NO_PROXY", "no_grpc_proxy"):
        hosts = fed.env[var].split(",")
        assert {"127.0.0.1", "localhost"} <= set(hosts), (var, fed.env[var])
    assert fed.env["no_proxy"].startswith("example.org,")  # the user's own entries stay
    assert fed.env["http_proxy"] == DEAD_PROXY  # other traffic (a dataset download) still goes to the proxy
    # what a child process sees: gRPC in it would bypass the proxy for 127.0.0.1
    code = "import os; print(os.environ['no_grpc_proxy'], os.environ['NO_PROXY'])"
    out = subprocess.run([sys.executable, "-c", code], env=fed.env, capture_output=True, text=True, check=True)
    assert "127.0.0.1" in out.stdout.split()[0] and "127.0.0.1" in out.stdout.split()[1]


def test_a_failed_run_names_the_process_and_quotes_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("https_proxy", DEAD_PROXY)
    (tmp_path / "supernode-1.log").write_text("starting\nERROR: could not connect to 127.0.0.1:5 (proxy refused)\n")
    (tmp_path / "flwr-run.log").write_text("submitted\nRun failed\n")
    msg = deploy._failure(1, ["supernode-1"], tmp_path, None)
    assert "flwr run exited 1" in msg and "supernode-1 exited early" in msg
    assert "ERROR: could not connect to 127.0.0.1:5 (proxy refused)" in msg
    assert "proxy variables are set (https_proxy)" in msg and "\n" not in msg
    msg = deploy._failure(0, [], tmp_path, {"status": "diverged", "stop_reason": "round 2: NaN", "rounds": 1})
    assert "status 'diverged': round 2: NaN" in msg and "Run failed" in msg



@pytest.mark.parametrize("given", ["rel/data", "./rel/data", "../up/data"])
def test_deploy_makes_a_relative_fedblend_data_absolute(given, tmp_path, monkeypatch):
    """``FEDBLEND_DATA`` relative to where ``fedblend deploy`` is started (the README's form) reaches the app as
    the absolute folder: the ServerApp and the SuperNodes run in other folders, where the relative path would
    name nothing (the run failed with "ServerApp exit code 201")."""
    import fedblend.flower.deploy as dp
    from fedblend.config import RunConfig

    seen = {}
    monkeypatch.setattr(dp, "_bin", lambda name: name)
    monkeypatch.setattr(dp, "_deploy_locked", lambda cfg, out, work, nodes, data_dir, *a, **k: seen.update(d=data_dir))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("FEDBLEND_DATA", given)
    dp.deploy_local(RunConfig(), tmp_path / "out", 1)
    assert seen["d"] == (tmp_path / "cwd" / given).resolve() and seen["d"].is_absolute()
    dp.deploy_local(RunConfig(), tmp_path / "out2", 1, data_dir="explicit")  # a given --data-dir wins
    assert seen["d"] == "explicit"
