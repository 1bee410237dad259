"""The CPU cores this process may use: what worker, job and thread caps are measured against."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity set where the system has one (a container, ``taskset``
    or a batch scheduler can allow fewer cores than the machine has, and ``os.cpu_count()`` counts the machine's),
    else ``os.cpu_count()``; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API (macOS, Windows)
        return os.cpu_count() or 1
