"""How a ``fedblend`` command ends: its error line and exit code, SIGTERM as Ctrl-C, the library's log records
and warnings on stderr (the contract is in :mod:`fedblend.cli.main`'s docstring)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from fedblend.common.errors import (
    ConfigError,
    FedblendError,
    ResumeMismatchError,
    RunExistsError,
    RunInterrupted,
    UserFileError,
)

# exit 2; other expected failures exit 1
INPUT_ERRORS = (ConfigError, RunExistsError, ResumeMismatchError, UserFileError)


def failure_code(exc: BaseException, debug: bool) -> int | None:
    """The exit code of a command that raised ``exc`` (an expected failure, a failed file write torch reports, a
    Ctrl-C outside a run), after printing its ``fedblend: error:`` line on stderr; None: re-raise it (``debug``,
    or no expected failure)."""
    if isinstance(exc, (FedblendError, OSError, RunInterrupted)):
        if isinstance(exc, BrokenPipeError) and stdout_reader_gone():
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
            return 128 + signal.SIGPIPE
        if debug:
            return None
        print(f"fedblend: error: {one_line(exc)}", file=sys.stderr)
        return 130 if isinstance(exc, RunInterrupted) else 2 if isinstance(exc, INPUT_ERRORS) else 1
    if isinstance(exc, RuntimeError):  # torch reports a failed file write / read (a full disk) as a RuntimeError
        if debug or not torch_io_error(exc):
            return None
        print(f"fedblend: error: a file could not be written or read ({one_line(exc)}); the disk may be full: free "
              f"space, then run again (a run continues from its last checkpoint with --resume)", file=sys.stderr)
        return 1
    if isinstance(exc, KeyboardInterrupt) and not debug:  # outside a run (loading data, building a partition)
        print("fedblend: error: interrupted", file=sys.stderr)
        return 130
    return None


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end is closed (``| head`` has read what it wanted): the one broken
    pipe that is not a fault. A broken pipe to a client worker or a socket is one, and is reported."""
    import select
    import stat

    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


class StderrHandler(logging.Handler):
    """Writes records to the current ``sys.stderr`` (looked up at each record, so a replaced stderr is honoured)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def setup_logging(level: int) -> None:
    """The library logs through ``logging.getLogger("fedblend...")`` (what a deployment does, resumes, faults a
    Flower backend noticed); the command shows INFO and above on stderr as ``fedblend: message`` (``--quiet``:
    warnings only, ``--debug``: everything). A program using the library configures logging itself."""
    log = logging.getLogger("fedblend")
    log.setLevel(level)
    if not any(isinstance(h, StderrHandler) for h in log.handlers):
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter("fedblend: %(message)s"))
        log.addHandler(handler)
        log.propagate = False


def sigterm_interrupts() -> None:
    """SIGTERM (a scheduler, ``kill``, ``fedblend sweep`` stopping its runs) stops a command as Ctrl-C does: a run
    keeps its last checkpoint and exits 130 saying how to resume. SIGINT alone cannot do this for runs started in
    the background, where the shell starts them with SIGINT ignored."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, raise_interrupt)


def raise_interrupt(signum, frame):
    # once: a run stopping at its checkpoint is not interrupted again by a repeated SIGTERM (the kernel's parent-
    # death signal can arrive once per exiting thread of a killed sweep)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def one_line(exc: BaseException) -> str:
    text = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.filename else str(exc)
    if isinstance(exc, OSError) and not isinstance(exc, FedblendError):
        from fedblend.common.files import hint

        text += f" ({hint(exc.errno)})" if hint(exc.errno) else ""
    return " ".join(text.split()) or type(exc).__name__


def torch_io_error(exc: RuntimeError) -> bool:
    """Whether a RuntimeError is torch's report of a failed file write or read (its errno is lost)."""
    text = str(exc)
    return any(s in text for s in ("PytorchStreamWriter", "PytorchStreamReader", "file write failed",
                                   "inline_container", "unexpected pos"))


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"fedblend: warning: {' '.join(str(message).split())}", file=sys.stderr)
