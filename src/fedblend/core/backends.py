"""Client execution backends: *how* clients run, separate from *what* they compute (fedjax
``for_each_client``). The sequential backend runs one client after another; a vectorized backend that trains
same-architecture clients together with ``torch.func.vmap`` can replace it behind the same interface, and must
give the same numbers (each client's randomness comes from its own stream, so order does not matter)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class SequentialBackend:
    name = "sequential"

    def run(self, fn: Callable[..., Any], jobs: Sequence[tuple]) -> list[Any]:
        return [fn(*job) for job in jobs]


BACKENDS = {"sequential": SequentialBackend}
