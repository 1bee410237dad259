"""A Flower federation of local processes: a SuperLink and SuperNodes started as children of this process (each
in its own process group), on loopback or in network namespaces, the ``flwr`` CLI pointed at them, and every
process stopped at the end (also on errors and Ctrl-C).

The processes talk gRPC over loopback, and gRPC honours the proxy variables (``http_proxy``, ``https_proxy``,
``grpc_proxy``, in either case): with a proxy set, their loopback traffic would go to it and the run would never
start. Every process started here therefore gets the loopback addresses added to ``no_proxy`` / ``NO_PROXY`` /
``no_grpc_proxy`` (:func:`loopback_env`); other traffic (a dataset download) still uses the proxy.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from fedblend.common.errors import FedblendError

CONNECTION = "fedblend-local"


class DeployError(FedblendError):
    """The local deployment failed (a process did not start, the run failed)."""


LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")
PROXY_VARS = ("http_proxy", "https_proxy", "grpc_proxy", "all_proxy")
NO_PROXY_VARS = ("no_proxy", "NO_PROXY", "no_grpc_proxy")


def loopback_env(env: dict[str, str], extra: tuple[str, ...] = ()) -> dict[str, str]:
    """``env`` with the loopback addresses the local federation uses (and ``extra`` ones, e.g. the SuperLink's
    address in a network namespace) added to every no-proxy list (gRPC reads ``no_grpc_proxy``, else
    ``no_proxy``), so a proxy set for the internet never sees its traffic."""
    out = dict(env)
    for var in NO_PROXY_VARS:
        have = [h.strip() for h in out.get(var, "").split(",") if h.strip()]
        out[var] = ",".join(have + [h for h in (*LOOPBACK, *extra) if h not in have])
    return out


def proxies_set(env: dict[str, str] | None = None) -> list[str]:
    """The proxy variables set in ``env`` (default: this process's environment)."""
    env = os.environ if env is None else env
    return [v for name in PROXY_VARS for v in (name, name.upper()) if env.get(v)]


def log_tail(path: Path, lines: int = 3, width: int = 300) -> str:
    """The last non-empty lines of a log file, joined with " | " (for a one-line error)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    tail = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    return " | ".join(t[:width] for t in tail)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    """A Flower command next to this Python (a virtual environment's bin), else on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise DeployError(f"{name} not found: install the Flower extra (pip install 'fedblend[flower]')")
    return found


@dataclass
class LocalFederation:
    """A SuperLink and SuperNodes as child processes (each in its own process group): on loopback, or as hosts of
    their own. ``address`` is where the SuperLink listens and what the nodes and the ``flwr`` CLI dial;
    ``netns`` puts a process in a network namespace (``ip netns exec``; keys ``"superlink"``,
    ``"supernode-K"``, ``"flwr"``), so that processes on one machine reach each other only over the links
    between their namespaces, as separate hosts do (tests/test_flower_netns.py)."""

    base: Path
    port: int = 0
    env: dict = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    tls: dict | None = None  # {"ca": path, "cert": path, "key": path} for TLS
    auth: bool = False  # SuperNode authentication (needs tls)
    address: str = "127.0.0.1"
    netns: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        self.base.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        home = self.base / "flwr-home"
        home.mkdir(exist_ok=True)
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # Flower's own
        self.env = loopback_env({**os.environ, "PATH": path, "FLWR_HOME": str(home), "PYTHONUNBUFFERED": "1",
                                 **self.env}, (self.address,))
        link = {"address": f"{self.address}:{self.port}"}
        link.update({"root-certificates": str(self.tls["ca"])} if self.tls else {"insecure": True})
        (home / "config.toml").write_text(tomli_w.dumps({"superlink": {"default": CONNECTION, CONNECTION: link}}))

    def _in_ns(self, name: str, cmd: list[str]) -> list[str]:
        """``cmd`` run inside process ``name``'s network namespace, if it has one (``ip netns exec`` execs the
        command: same process, so its process group and signals work as without it)."""
        ns = self.netns.get(name)
        return ["ip", "netns", "exec", ns, *cmd] if ns else cmd

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.base / f"{name}.log", "ab")  # noqa: SIM115 - closed by the child's exit
        p = subprocess.Popen(self._in_ns(name, cmd), stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.base,
                             start_new_session=True)
        log.close()
        self.procs[name] = p
        return p

    def start_superlink(self) -> None:
        cmd = [_bin("flower-superlink"), "--host", self.address, "--port", str(self.port),
               "--database", str(self.base / "superlink.db")]
        if self.tls:
            cmd += ["--ssl-ca-certfile", self.tls["ca"], "--ssl-certfile", self.tls["cert"],
                    "--ssl-keyfile", self.tls["key"]]
        else:
            cmd.append("--insecure")
        if self.auth:
            cmd.append("--enable-supernode-auth")
        self._spawn("superlink", cmd)
        self.wait_port(self.port, "superlink")

    def start_supernode(self, k: int, node_config: str, key: str | None = None) -> subprocess.Popen:
        """SuperNode ``k`` with ``node_config``; ``key``: its private key file (SuperNode authentication)."""
        cmd = [_bin("flower-supernode"), "--superlink", f"{self.address}:{self.port}", "--host", "127.0.0.1",
               "--port", str(free_port()), "--node-config", node_config, "--max-retries", "0"]
        cmd += ["--root-certificates", self.tls["ca"]] if self.tls else ["--insecure"]
        if key:
            cmd += ["--auth-supernode-private-key", key]
        return self._spawn(f"supernode-{k}", cmd)

    def wait_port(self, port: int, name: str, timeout: float = 60.0) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.procs[name].poll() is not None:
                raise DeployError(f"{name} exited (code {self.procs[name].returncode}); see "
                                  f"{self.base / (name + '.log')}")
            if self._port_open(name, port):
                return
            time.sleep(0.2)
        raise DeployError(f"{name} did not open port {port} in {timeout:.0f}s; see {self.base / (name + '.log')}")

    def _port_open(self, name: str, port: int) -> bool:
        """Whether ``address:port`` accepts a connection, seen from process ``name``'s namespace."""
        if not self.netns.get(name):
            with socket.socket() as s:
                return s.connect_ex((self.address, port)) == 0
        probe = f"import socket; socket.create_connection(({self.address!r}, {port}), 2)"
        return subprocess.run(self._in_ns(name, [sys.executable, "-c", probe]), capture_output=True).returncode == 0

    def flwr(self, *args: str, timeout: float | None = None, log: str = "flwr-run") -> subprocess.CompletedProcess:
        with open(self.base / f"{log}.log", "ab") as f:
            return subprocess.run(self._in_ns("flwr", [_bin("flwr"), *args]), stdout=f, stderr=subprocess.STDOUT, env=self.env,
                                  cwd=self.base, timeout=timeout)

    def flwr_following(self, *args: str, timeout: float | None, follow: Path,
                       on_row: Callable[[dict, Any], None] | None, log: str = "flwr-run") -> subprocess.CompletedProcess:
        """:meth:`flwr`, calling ``on_row(row, None)`` for every line appended to ``follow`` (a metrics.jsonl
        the run writes) while it runs."""
        if on_row is None:
            return self.flwr(*args, timeout=timeout, log=log)
        reader = MetricsFollower(follow)
        with open(self.base / f"{log}.log", "ab") as f:
            p = subprocess.Popen(self._in_ns("flwr", [_bin("flwr"), *args]), stdout=f, stderr=subprocess.STDOUT, env=self.env,
                                 cwd=self.base)
            t0 = time.monotonic()
            try:
                while p.poll() is None:
                    if timeout is not None and time.monotonic() - t0 > timeout:
                        p.kill()
                        p.wait()
                        raise subprocess.TimeoutExpired(p.args, timeout)
                    for row in reader.new_rows():
                        on_row(row, None)
                    time.sleep(0.5)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for row in reader.new_rows():
            on_row(row, None)
        return subprocess.CompletedProcess(p.args, p.returncode)

    def kill(self, name: str) -> None:
        """Stop one process and its children (its process group): SIGTERM, then SIGKILL."""
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                return
            try:
                p.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # children left in the group (SuperExec, ClientApp processes)
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def failed(self) -> list[str]:
        """The processes started here that have already exited (a SuperLink or SuperNode that failed)."""
        return [name for name, p in self.procs.items() if p.poll() is not None]

    def close(self) -> None:
        for name in [n for n in self.procs if n != "superlink"] + ["superlink"]:
            self.kill(name)


class MetricsFollower:
    """The complete rows appended to a metrics.jsonl since the last call (a resumed run rewrites the file: then it
    is read from its start again, skipping rounds already seen)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.seen = Path(path), 0, 0

    def new_rows(self) -> list[dict]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:
            self.offset = 0
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        self.offset += end
        rows = []
        for line in data[:end].decode().splitlines():
            if line.strip():
                row = json.loads(line)
                if "round" in row and not row.get("stopped") and row["round"] > self.seen:
                    self.seen = row["round"]
                    rows.append(row)
        return rows


@contextmanager
def local_federation(base: Path, **kw):
    fed = LocalFederation(Path(base), **kw)
    try:
        yield fed
    finally:
        fed.close()
