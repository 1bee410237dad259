"""Helpers for tests: build a tiny simulation for any method."""

from __future__ import annotations

from fedblend.testing import same_state, tiny_sim, without_timings

__all__ = ["eval_message", "run_client", "same_state", "tiny_sim", "train_message", "without_timings"]


def eval_message(sim, cid: int, rnd: int | None = None):
    """The evaluation message the server half of ``sim`` would send client ``cid`` now."""
    return sim.method.configure_evaluate(sim.server, cid, sim.sctx(sim.next_round if rnd is None else rnd))


def train_message(sim, cid: int, rnd: int | None = None):
    """The training message the server half of ``sim`` would send client ``cid`` now."""
    return sim.method.configure("train", sim.server, cid, sim.sctx(sim.next_round if rnd is None else rnd))


def run_client(sim, cid: int, msg, rnd: int | None = None, phase: str = "train"):
    """Client ``cid``'s half of one exchange, run in-process on ``msg`` and its stored state (not stored back)."""
    from fedblend.core.client import ClientJob

    rnd = sim.next_round if rnd is None else rnd
    return sim.client_runtime().handle(ClientJob(phase, cid, rnd, msg, sim.store.get(cid)))


def pip_install_target(src, target) -> str | None:
    """``pip install --no-deps --target target src`` (a package on disk, as a user's ``pip install``): offline
    with this environment's setuptools first, else pip's isolated build (fetches setuptools); None when
    installed, else pip's last line of error (the caller skips)."""
    import shutil
    import subprocess
    import sys

    base = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(src)]
    for extra in (["--no-build-isolation", "--no-index"], []):
        res = subprocess.run([*base, *extra], capture_output=True, text=True)
        if res.returncode == 0:
            return None
        shutil.rmtree(target, ignore_errors=True)
    return " ".join(res.stderr.strip().splitlines()[-1:])


def history(out) -> list[dict]:
    """The rows of a run directory's metrics.jsonl."""
    import json
    from pathlib import Path

    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


#: Seconds a live SuperNode may take to answer one exchange in the real-Flower tests. It must cover a slow or busy
#: machine (one exchange starts a ClientApp process that imports flwr, torch and fedblend: about 17 s on an idle
#: 2-core machine, over 25 s at load 9, where a 25 s timeout dropped a healthy node in round 1). A *killed* node is
#: not found by this timeout: the SuperLink marks it offline once its heartbeats stop (Flower's 30 s interval x 2)
#: and answers the pending message with a NODE_UNAVAILABLE error reply, which the backend reports as a fault.
NODE_TIMEOUT = 300


def load_script(name: str, folder: str = "scripts"):
    """The module ``<folder>/<name>.py`` (``scripts/``: the user tools; ``bookkeeping/``: the project's own
    tooling; neither is a package), registered in ``sys.modules`` so that its dataclasses can look their module
    up."""
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
