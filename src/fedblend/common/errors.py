"""The typed exceptions of every expected failure.

Each carries a complete one-line message (what failed, the bad value, what is allowed or how to fix it); the
command line prints it as ``fedblend: error: <message>`` and exits non-zero, the Python API raises it as is.
Unexpected exceptions (bugs) are not wrapped, so their tracebacks stay visible.
"""

from __future__ import annotations


class FedblendError(Exception):
    """Base class of every expected failure (bad input, missing data, a refused or stopped run)."""


class ConfigError(FedblendError, ValueError):
    """An invalid config value; the message names the field, the bad value and the allowed values."""


class RunExistsError(FedblendError):
    """The output directory already holds a run and neither ``--resume`` nor ``--force`` was given."""


class ResumeMismatchError(FedblendError):
    """``--resume`` with a config that differs from the one the checkpoint was written with."""


class CheckpointError(FedblendError):
    """A checkpoint that is missing, unreadable or not a fedblend checkpoint."""


class CheckpointMissingError(CheckpointError, FileNotFoundError):
    """``--resume`` where no checkpoint was written."""


class DataError(FedblendError):
    """A dataset file that exists but cannot be read (truncated, wrong format, no permission)."""


class NonFiniteError(FedblendError):
    """A client update with NaN or inf under ``on_nonfinite = "stop"``; names the round, client and tensor."""

    def __init__(self, message: str, round: int, client: int, tensor: str):
        super().__init__(message)
        self.round, self.client, self.tensor = round, client, tensor


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: the message says after which round and how to resume.

    A ``KeyboardInterrupt`` so that ``except Exception`` in user code does not swallow it."""

    def __init__(self, message: str, completed_rounds: int):
        super().__init__(message)
        self.completed_rounds = completed_rounds
