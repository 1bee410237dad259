"""The client-state store: every client's state is data keyed by client id, owned by the engine.

Methods receive a client's state and return the new one; nothing is kept inside per-client objects. States
are created lazily by the method's ``init_client`` the first time a client is touched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

State = dict[str, Any]


class ClientStore:
    def __init__(self, init: Callable[[int], State], states: dict[int, State] | None = None):
        self._init = init
        self.states: dict[int, State] = dict(states or {})

    def get(self, cid: int) -> State:
        if cid not in self.states:
            self.states[cid] = self._init(cid)
        return self.states[cid]

    def put(self, cid: int, state: State) -> None:
        self.states[cid] = state

    def __contains__(self, cid: int) -> bool:
        return cid in self.states

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.states))
