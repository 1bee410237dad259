"""What produced a result (the run identity recorded in ``summary.json``, the checkpoint and the head of
``config.toml``): the resolved config and its hash, versions, git commit, device, threads, the CPU, plug-ins'
code and the input files; on ``--resume``, what the run started from is kept."""

from __future__ import annotations

import platform
import subprocess
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fedblend
from fedblend.config import RunConfig, config_hash
from fedblend.plugin_code import plugin_code


def git_commit() -> str | None:
    """The commit of the checkout fedblend is imported from (``+dirty`` with uncommitted changes), or None."""
    src = Path(fedblend.__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_identity() -> dict[str, str]:
    """The CPU a run computed on: torch's kernel level (``capability``: e.g. ``AVX512``, ``AVX2``, ``DEFAULT``),
    which decides the last bits of every float result, and the processor's name (``model``)."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"capability": str(torch.backends.cpu.get_cpu_capability()),
            "model": model or platform.processor() or platform.machine()}


def run_identity(cfg: RunConfig, device: str) -> dict[str, Any]:
    """What produced a result: the resolved config and its hash, versions, git commit, device, threads, the CPU
    (:func:`cpu_identity`), each plug-in's package version and source sha256 (``plugins``:
    :func:`fedblend.plugin_code.plugin_code`), and
    (``inputs``, only when the config names one) the sha256 of each file the run reads besides the dataset: the
    config records a path, the same path can hold another file (a re-made agent, a new init), and the hash tells
    the two runs apart."""
    resolved = cfg.resolved()
    identity = {"config_hash": config_hash(resolved), "config": resolved, "fedblend": fedblend.__version__,
                "torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
                "git_commit": git_commit(), "device": device, "threads": torch.get_num_threads(),
                "cpu": cpu_identity()}
    inputs = cfg.input_digests()
    if inputs:
        identity["inputs"] = inputs
    plugins = plugin_code(cfg)  # a plug-in's code is not fedblend's: its own version and source hash
    if plugins:
        identity["plugins"] = plugins
    return identity


def keep_start_inputs(identity: dict, old: dict, ck_path: Path) -> None:
    """On ``--resume``: the identity keeps the input files the run started from (the checkpoint holds what was
    read from them), with a warning for each that has changed since."""
    if "inputs" not in old:
        return
    for key, was in old["inputs"].items():
        now = identity.get("inputs", {}).get(key)
        if now != was:
            warnings.warn(f"{key}: {was['path']} is not the file {ck_path.parent} started from (sha256 "
                          f"{was['sha256'][:12]}..., now {now['sha256'][:12] + '...' if now else 'missing'}); the run "
                          f"continues from its checkpoint and records the file it started from", RuntimeWarning,
                          stacklevel=3)
    identity["inputs"] = old["inputs"]


def keep_cpu_history(identity: dict, old: dict) -> None:
    """On ``--resume``: when the run's last part ran on a CPU whose torch kernels differ from this one's, warn
    (float results may differ from an uninterrupted run's in the last bits); when any part did, list each CPU in
    order under ``cpu_history``."""
    cpus = old.get("cpu_history") or ([old["cpu"]] if old.get("cpu") else [])
    if cpus and cpus[-1]["capability"] != identity["cpu"]["capability"]:
        warnings.warn(f"resuming on a CPU whose torch kernels are {identity['cpu']['capability']}, the run "
                      f"started on {cpus[-1]['capability']} ({cpus[-1].get('model')}): float results may differ from "
                      f"an uninterrupted run in the last bits (the summary's run.cpu_history records each CPU)",
                      RuntimeWarning, stacklevel=3)
    if cpus and cpus[-1] != identity["cpu"]:
        cpus = [*cpus, identity["cpu"]]
    if len(cpus) > 1:  # computed on more than one CPU: each, in order
        identity["cpu_history"] = cpus


def config_header(identity: dict) -> str:
    """Comment lines heading ``config.toml``: the hash and what produced the run (TOML ignores them)."""
    keys = ("config_hash", "fedblend", "torch", "numpy", "python", "git_commit", "device", "threads")
    inputs = "".join(f"# input {k}: {v['path']} sha256 {v['sha256']}\n" for k, v in identity.get("inputs", {}).items())
    return "".join(f"# {k}: {identity[k]}\n" for k in keys) + inputs + "\n"
