"""What each half of a method sees besides its state and the messages: the run's public facts (:class:`RunInfo`),
the server's context (:class:`ServerCtx`) and a client's (:class:`ClientCtx`), and the seed-tree nodes of their
random streams. States are plain data (:data:`State`); a client half's work is a generator of TrainSpecs
(:data:`ClientWork`)."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from fedblend.common.params import Params
from fedblend.common.rng import SeedTree
from fedblend.core.message import Message
from fedblend.core.training import TrainConfig, TrainResult, TrainSpec
from fedblend.data.federated import ClientData
from fedblend.models.zoo import FedModel

State = dict[str, Any]
ClientWork = Generator[TrainSpec, TrainResult, tuple[Message, State]]


@dataclass(frozen=True)
class RunInfo:
    """The public facts of a run, known to the server and to every client (a Flower app's run config): the
    model architecture and its initial parameters (both built from the config and the seed), the training
    settings, the number of clients and rounds. No client's data or data size is in here."""

    model: FedModel
    init_params: Params
    train: TrainConfig
    num_clients: int
    rounds: int
    seed: int
    device: str = "cpu"

    @property
    def client_ids(self) -> range:
        """The clients' ids, ``range(num_clients)``."""
        return range(self.num_clients)


@dataclass(frozen=True)
class ServerCtx:
    """What the server half sees besides its state and the messages: the round, its random streams, the run."""

    run: RunInfo
    rnd: int  # 0-based round
    tree: SeedTree  # the server's streams in this round
    #: numbers (or lists of numbers) the server half reports for the round's metrics, e.g. its own timings
    stats: dict = field(default_factory=dict)

    @property
    def model(self) -> FedModel:
        """The run's model (``run.model``): its architecture, parameter names and head."""
        return self.run.model


@dataclass
class ClientCtx:
    """What a client half sees besides its state and the message: its id, the round, its own data, its random
    streams, the public run facts, and a dict of numbers for the round's metrics."""

    cid: int
    rnd: int
    data: ClientData
    run: RunInfo
    tree: SeedTree  # root of this client's streams in this round: tree.torch("batches") etc.
    stats: dict = field(default_factory=dict)
    #: a memo the client's runtime keeps between calls, *not* state: never checkpointed, possibly empty (another
    #: process, a resumed run). A client half may store results there that it would otherwise compute again,
    #: only where the result does not depend on whether the memo is used (e.g. ALA's blend, keyed by its inputs).
    cache: dict = field(default_factory=dict)
    #: what one hook hands a later hook of the same exchange (FedFomo's weights from ``client_init`` to ``reply``):
    #: never state, never metrics, gone after the exchange
    scratch: dict = field(default_factory=dict)

    def tree_for(self, phase: str, rnd: int) -> SeedTree:
        """This client's streams for ``phase`` in round ``rnd`` (what the runtime hands that exchange)."""
        return client_tree(SeedTree(self.run.seed), phase, rnd, self.cid)

    @property
    def model(self) -> FedModel:
        """The run's model (``run.model``): its architecture, parameter names and head."""
        return self.run.model

    @property
    def train(self) -> TrainConfig:
        """The run's client optimiser settings (``run.train``: lr, epochs, batch size, ...)."""
        return self.run.train


def server_tree(root: SeedTree, rnd: int) -> SeedTree:
    """The seed-tree node of the server's streams in round ``rnd`` (``ServerCtx.tree``)."""
    return root.child("server", "round", rnd)


def client_tree(root: SeedTree, phase: str, rnd: int, cid: int) -> SeedTree:
    """The seed-tree node of client ``cid``'s streams for ``phase`` (``"evaluate"`` -> ``"eval"``) in round ``rnd``."""
    return root.child("eval" if phase == "evaluate" else phase, "round", rnd, "client", cid)
