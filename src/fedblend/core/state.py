"""The client-state store: every client's state is data keyed by client id, owned by the runtime.

Client halves receive their state and return the new one; nothing is kept inside per-client objects. A client
that has never been contacted has no entry (``get`` returns ``None``): its client half initialises its state on
the client at first contact (``Method.init_client``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

State = dict[str, Any]


class ClientStore:
    def __init__(self, states: dict[int, State] | None = None):
        self.states: dict[int, State] = dict(states or {})

    def get(self, cid: int) -> State | None:
        return self.states.get(cid)

    def put(self, cid: int, state: State) -> None:
        self.states[cid] = state

    def __contains__(self, cid: int) -> bool:
        return cid in self.states

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.states))
