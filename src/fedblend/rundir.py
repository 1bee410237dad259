"""One writer per run directory: the lock, what a run owns in its directory, and names that stay in their folder.

**The lock.** Every command that writes into a directory of results (``run``, ``--resume``, the runs of a
``sweep`` and the sweep folder itself, ``partition --out`` and ``--export``, ``pretrain``, ``deploy``,
``report --out``, ``export tensorboard``) holds :class:`DirLock` on it while it writes: an exclusive
``fcntl.flock`` on ``DIR/.fedblend.lock``, taken without waiting. A second writer is refused with one line
naming the directory and the holding process id (:class:`RunLockedError`, exit 2). ``flock`` is the
operating system's own mechanism (no package to install, unlike ``filelock``, which wraps the same call): the
kernel releases it when the process ends in any way, ``kill -9`` included, so a crash never leaves a stale lock
behind; the file a killed process leaves is reused. The lock is re-entrant within one process (``pretrain``
holds its run directory across the run and the agent file). It does not work across machines on NFS;
run directories are local. A lock that had to create its directory removes it again when it is left empty.

**What a run owns** (:data:`OWNED`): the run files, ``clients/``, ``clients.ckpt/``, ``tensorboard/``,
``mlruns/``, ``wandb/``, ``.mlflow_run``, ``partition.png``, ``checkpoint.pt.sha256`` and temporary files named after any of them
(``checkpoint.pt.tmp``). :func:`clear_run` removes
exactly these (``--force``), without following symbolic links, and nothing else: files of the user's that
happen to sit in the directory, and the sweep's ``stdout.log``, are left alone.

**Names** (:func:`check_name`): a config value that becomes part of a path (``name``) must be one path
component: no ``/`` or ``\\``, not ``.`` or ``..``, no control characters, at most 200 characters.

**Runs die with their sweep** (:func:`die_with_parent`): ``fedblend sweep`` starts each run with
``FEDBLEND_PARENT_PID`` set; the run asks the kernel for SIGTERM when its parent dies (Linux
``prctl(PR_SET_PDEATHSIG)``; elsewhere a thread polls the parent id), so a sweep killed even with ``kill -9``
leaves no run writing on its own. SIGTERM stops a run at its last checkpoint (exit 130), as Ctrl-C does.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from fedblend.common.errors import CheckpointMissingError, ConfigError, RunExistsError
from fedblend.core.checkpoint import FILENAME

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".fedblend.lock"
PARENT_ENV = "FEDBLEND_PARENT_PID"
RUN_FILES = ("config.toml", "partition.json", "partition.txt", "metrics.jsonl", "metrics.csv", "summary.json",
             "checkpoint.pt", "accuracy.png")
OWNED_DIRS = ("clients", "clients.ckpt", "tensorboard", "mlruns", "wandb")  # trackers: TensorBoard, MLflow, W&B
OWNED = RUN_FILES + OWNED_DIRS + ("partition.png", ".mlflow_run", "checkpoint.pt.sha256")
MAX_NAME = 200


class RunLockedError(RunExistsError):
    """Another process writes the directory (exit 2, like an existing run without ``--resume`` / ``--force``)."""


# ------------------------------------------------------------------------------------------------ the lock
_HELD: dict[str, DirLock] = {}  # realpath -> the lock this process holds (re-entry counts)
_HELD_GUARD = threading.Lock()


def _pid_of(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
        return int(text) if text.isdigit() else None
    except (OSError, ValueError):
        return None


def locked_by(directory: str | Path) -> int | None:
    """The id of the process holding ``directory``'s lock (0 if held but unknown), or None when free.
    Probes without creating anything."""
    path = Path(directory) / LOCK_NAME
    key = os.path.realpath(directory)
    if key in _HELD:
        return os.getpid()
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return _pid_of(path) or 0
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def wait_unlocked(directory: str | Path, seconds: float) -> int | None:
    """Wait up to ``seconds`` for ``directory``'s lock to be free; the holder's pid if it is still held."""
    end = time.monotonic() + seconds
    while True:
        pid = locked_by(directory)
        if pid is None or time.monotonic() >= end:
            return pid
        time.sleep(0.2)


class DirLock:
    """``with DirLock(path, what="run directory"):`` -- hold ``path``'s writer lock (see the module docstring).

    Creates ``path`` (and missing parents) when needed; ``created`` tells whether it did. On release the lock
    file is removed, then the directories it created if they are empty. Raises :class:`RunLockedError` when
    another process holds the lock, :class:`ConfigError` when ``path`` cannot be a directory."""

    def __init__(self, path: str | Path, what: str = "run directory"):
        self.path, self.what = Path(path), what
        self.created: list[Path] = []
        self.fd: int | None = None
        self.depth = 0

    @property
    def key(self) -> str:
        return os.path.realpath(self.path)

    def __enter__(self) -> DirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> DirLock:
        if fcntl is None:  # not a POSIX system: no lock (a warning says so), the rest works as before
            import warnings

            warnings.warn("this platform has no fcntl.flock: run directories are not locked", RuntimeWarning,
                          stacklevel=2)
            self._outer, self.depth = None, 0
            self._make_dir()
            return self
        with _HELD_GUARD:
            outer = _HELD.get(self.key)
            if outer is not None:  # re-entry in this process: the outer holder keeps the file
                outer.depth += 1
                self.fd, self.depth, self._outer = -1, 1, outer
                return self
        self._outer = None
        self._make_dir()
        lock = self.path / LOCK_NAME
        while True:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                self._remove_created()
                raise ConfigError(f"cannot lock {self.what} {self.path}: {exc.strerror}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise ConfigError(f"cannot lock {self.what} {self.path}: {exc.strerror}") from exc
                pid = _pid_of(lock)
                who = f"process {pid}" if pid else "another process"
                raise RunLockedError(f"{self.path} is in use: {who} is writing into it, so it cannot be this "
                                     f"command's {self.what} (one writer at a time: wait for that process to end "
                                     f"or stop it, or choose another directory)") from None
            try:  # the holder before us may have removed the file after we opened it: lock the current file
                same = os.path.samestat(os.fstat(fd), os.stat(lock))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd, self.depth = fd, 1
        with _HELD_GUARD:
            _HELD[self.key] = self
        return self

    def release(self) -> None:
        if self.depth == 0:
            return
        self.depth = 0
        if self._outer is not None:
            self._outer.depth -= 1
            return
        with _HELD_GUARD:
            _HELD.pop(self.key, None)
        try:
            os.unlink(self.path / LOCK_NAME)  # still ours: nobody else can hold it while we do
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        self._remove_created()

    def _make_dir(self) -> None:
        if self.path.is_dir():
            return
        if self.path.exists() or self.path.is_symlink():
            raise ConfigError(f"{self.path} is a file, not a directory")
        missing = []
        p = self.path
        while not p.exists() and p != p.parent:
            missing.append(p)
            p = p.parent
        try:
            for d in reversed(missing):
                try:
                    d.mkdir()
                except FileExistsError:
                    if not d.is_dir():
                        raise
                    continue  # made meanwhile by another run (siblings started together): not ours to remove
                self.created.append(d)
        except OSError as exc:
            self._remove_created()
            raise ConfigError(f"cannot create {self.what} {self.path}: {exc.strerror}") from exc

    def _remove_created(self) -> None:
        for d in reversed(self.created):
            try:
                d.rmdir()  # only when empty
            except OSError:
                break
        self.created = []


# ------------------------------------------------------------------------------------------------ --force
def owned_entries(out: str | Path) -> list[Path]:
    """The entries of run directory ``out`` that a run wrote (:data:`OWNED` and temporary files named after them)."""
    out = Path(out)
    if not out.is_dir():
        return []
    found = []
    for entry in sorted(os.listdir(out)):
        if entry in OWNED or any(entry.startswith(f"{name}.") and entry != LOCK_NAME for name in OWNED):
            found.append(out / entry)
    return found


def clear_run(out: str | Path) -> list[Path]:
    """Remove everything the earlier run in ``out`` owns (``--force``): its files, its client folders, its
    TensorBoard events, temporary files. Only direct entries of ``out`` are removed; a symbolic link is removed,
    never followed. Returns what was removed."""
    removed = []
    for p in owned_entries(out):
        if p.is_symlink() or not p.is_dir():
            p.unlink(missing_ok=True)
        else:
            shutil.rmtree(p)
        removed.append(p)
    return removed


# ------------------------------------------------------------------------------------------------ names
def check_name(value: str, where: str = "name") -> str:
    """``value`` if it can be one path component (the run's folder name), else a :class:`ConfigError`."""
    bad = [c for c in value if c in "/\\" or ord(c) < 32 or ord(c) == 127]
    if bad or value in (".", "..") or len(value) > MAX_NAME:
        why = (f"a path separator or control character ({bad[0]!r})" if bad else
               f"more than {MAX_NAME} characters" if len(value) > MAX_NAME else "a relative path")
        raise ConfigError(f"{where} becomes a folder name and must be one plain name, got {value!r} "
                          f"({why}); use letters, digits, '-', '_', '.'")
    return value


# ------------------------------------------------------------------------------------------------ sweeps
def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process that must not outlive this one (see :func:`die_with_parent`)."""
    return {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}


def die_with_parent() -> bool:
    """When started by :func:`child_env`: SIGTERM this process when its parent dies (Linux: the kernel's
    ``PR_SET_PDEATHSIG``; elsewhere a thread polling the parent's id every half second). Returns whether it
    was set up. The variable is removed, so this process's own children do not inherit it."""
    text = os.environ.pop(PARENT_ENV, None)
    if not text or not text.isdigit():
        return False
    parent = int(text)
    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(1, int(signal.SIGTERM), 0, 0, 0) == 0  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            armed = False
    if not armed:
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="fedblend-parent-watch", daemon=True).start()
    if os.getppid() != parent:  # the parent died before we asked
        os.kill(os.getpid(), signal.SIGTERM)
    return True


# ------------------------------------------------------------------------------------------ results dir
def holds_run(out: Path) -> list[str]:
    """The run files in ``out`` (empty when it is not a run directory)."""
    return [f for f in RUN_FILES if (out / f).exists()] if out.is_dir() else []


def check_out_dir(out: Path, resume: bool, force: bool) -> None:
    """Fail before anything is written when ``out`` cannot hold this run (see module docstring)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory")
    anc = out
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir() or not os.access(anc, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: cannot create or write it ({anc} is not a writable directory)")
    if resume:
        if not (out / FILENAME).is_file():
            raise CheckpointMissingError(f"--resume: no checkpoint at {out / FILENAME} (checkpoint_every = 0, or the "
                                         f"run stopped before its first checkpoint); start again with --force")
        return
    files = holds_run(out)
    if files and not force:
        raise RunExistsError(f"{out} already holds a run ({', '.join(files)}); use --resume to continue it, "
                             f"--force to replace it, or another --out")
