"""The typed exceptions of every expected failure.

Each carries a complete one-line message (what failed, the bad value, what is allowed or how to fix it); the
command line prints it as ``fedblend: error: <message>`` and exits non-zero, the Python API raises it as is.
Unexpected exceptions (bugs) of fedblend's own code are not wrapped, so their tracebacks stay visible; an exception
from code fedblend calls but did not write (a method's hooks, a plug-in) is named as a :class:`HookError`
(:mod:`fedblend.common.guard`), its traceback kept as the cause (``--debug``).
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


class CheckpointMismatchError(ResumeMismatchError):
    """``--resume`` refused because the files of a checkpoint do not belong together: a client-state file of its
    snapshot missing, extra or changed, ``partition.json`` changed since it was written, or a config record whose
    hash does not match. Resuming would not continue the same run, so it is refused (exit 2)."""


class CheckpointDamagedError(CheckpointMismatchError):
    """``--resume`` refused because ``checkpoint.pt`` does not hash to the sha256 recorded when it was written
    (``checkpoint.pt.sha256``), or that record is not one: a damaged file would resume into different rounds."""


class UserFileError(FedblendError, ValueError):
    """A file the user gave (a partition, a PFLlib folder, an agent file, a run's metrics or summary) that cannot
    be used as it is: the message names the file, what is wrong and the fix (exit 2, as bad input)."""


class WorkerError(FedblendError):
    """A client worker process died (killed, out of memory) or could not start; names the worker and why."""


class MessageError(FedblendError, TypeError):
    """A method's message breaks the channel rules (:func:`fedblend.core.message.channel_errors`)."""


class HookError(FedblendError):
    """Code that fedblend calls but did not write -- a plug-in's method, transform, dataset, model or tracker, or a
    built-in method's hook -- raised while fedblend called it (:mod:`fedblend.common.guard`). The one line names
    the plug-in (``plugin``), the hook it raised in (``hook``), the round (``round``, 1-based; None before the
    first) and the client (``client``; None for the server's hooks), the exception and where in the plug-in's code
    it was raised. It is a fault of the run, not bad input (exit 1); ``--debug`` shows the original traceback."""

    def __init__(self, message: str, plugin: str = "", hook: str = "", round: int | None = None,
                 client: int | None = None):
        super().__init__(message)
        self.plugin, self.hook, self.round, self.client = plugin, hook, round, client

    def __reduce__(self):  # crosses process boundaries (a worker's client hook raised) whole
        return (type(self), (str(self), self.plugin, self.hook, self.round, self.client))


class DataError(FedblendError):
    """A dataset file that exists but cannot be read (truncated, wrong format, no permission)."""


class DivergedError(FedblendError):
    """The run diverged: NaN / inf in a state, a model or a loss, every update of a round skipped, or a training
    loss past the divergence bound (``divergence_factor``); names the round and the reason. A diverged run is
    never a result: its summary says ``"status": "diverged"`` and the command exits 1."""

    def __init__(self, message: str, round: int, reason: str | None = None):
        super().__init__(message)
        self.round, self.reason = round, reason or message


class NonFiniteError(DivergedError):
    """A client update with NaN or inf under ``on_nonfinite = "stop"``; names the round, client and tensor."""

    def __init__(self, message: str, round: int, client: int, tensor: str):
        super().__init__(message, round)
        self.client, self.tensor = client, tensor


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: the message says after which round and how to resume.

    A ``KeyboardInterrupt`` so that ``except Exception`` in user code does not swallow it."""

    def __init__(self, message: str, completed_rounds: int):
        super().__init__(message)
        self.completed_rounds = completed_rounds
