"""Range-checked ``argparse`` types shared by every command's numeric flags.

Each flag's allowed range is written once, in the notation of the config's ``RANGES`` (``"[1, 1024]"``, ``"> 0"``)
and checked by the same :class:`~fedblend.common.options.Range`, so ``--threads 0``, ``--rounds 0``,
``--timeout -5`` or ``--nodes 1e11`` fail while the command line is parsed, before anything is loaded, with one
line: ``fedblend: error: --threads must be [1, 1024], got 0``. ``nan`` and ``inf`` never pass. Upper bounds
keep a flag from exhausting the machine (threads, worker or node processes); the values a run is capped at
beyond them (``workers`` at the clients and CPU cores, ``--jobs`` at the CPU cores) are capped with a warning.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from fedblend.common.options import Range

THREADS = "[1, 1024]"  # torch CPU threads of one process
WORKERS = "[1, 1024]"  # also the config's workers range; capped at clients and CPU cores when the run starts
JOBS = "[1, 1024]"  # sweep runs at a time; capped at the CPU cores
BENCH_ROUNDS = "[1, 10000]"
NODES = "[1, 64]"  # SuperNodes of `fedblend deploy` (one process each, on this machine)
TIMEOUT = "(0, 604800]"  # seconds (a week)
MIN_CLIENTS = "[1, 100000]"
RETRIES = "[0, 100]"  # sends again of a message whose reply is a transient Flower error
ACC_RANGE = "[0, 100]"  # report --acc-range LOW HIGH, in percent


def int_in(rng: str) -> Callable[[str], int]:
    """An argparse ``type``: an integer within ``rng``."""
    r = Range.parse(rng)

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value not in r:
            raise argparse.ArgumentTypeError(f"must be {r}, got {value}")
        return value

    parse.__name__ = "int"
    parse.range = r  # type: ignore[attr-defined]
    return parse


def float_in(rng: str) -> Callable[[str], float]:
    """An argparse ``type``: a finite number within ``rng``."""
    r = Range.parse(rng)

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
        if value not in r:
            finite = "" if math.isfinite(value) else "a finite number "
            raise argparse.ArgumentTypeError(f"must be {finite}{r}, got {value}")
        return value

    parse.__name__ = "float"
    parse.range = r  # type: ignore[attr-defined]
    return parse


def cap_at_cores(value: int, what: str) -> int:
    """``value`` capped at the CPU cores this process may use, with a warning when it was larger."""
    import warnings

    from fedblend.common.cores import usable_cores

    cores = usable_cores()
    if value > cores:
        warnings.warn(f"{what} = {value} capped to {cores} (the CPU cores this process may use)", RuntimeWarning,
                      stacklevel=2)
    return min(value, cores)
