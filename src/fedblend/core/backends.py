"""Client execution backends: *how* client halves run, separate from *what* they compute.

A backend is started once per run with the method, the public run facts and the clients' data, then runs
lists of :class:`~fedblend.core.client.ClientJob` (training and evaluation alike) and returns their
:class:`~fedblend.core.client.ClientResult` in the same order. Each client's randomness comes from its own
streams, so the order in which clients run changes nothing.

* ``sequential``: one :class:`ClientRuntime` in this process, clients one after another (easy to debug).
* ``vmap`` (:mod:`fedblend.core.vmap`): clients with matching training specs trained as one batched
  computation (for GPUs; equal to sequential within floating-point tolerance).
Every backend is a :class:`~fedblend.core.backend.Backend`: the engine calls ``start``, ``run``, ``report`` and ``close`` and sets
``on_result``, nothing else.

* ``processes``: ``workers`` worker processes, each holding only its own clients' data (client ``c`` lives in
  worker ``c % workers``); every job crosses the process boundary as flat named arrays
  (:mod:`fedblend.common.codec`): the worker receives the message and that client's state, nothing else. Results
  equal the sequential backend's bit for bit at the same per-process thread count (tested).
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedblend.common.codec import decode, encode
from fedblend.common.errors import FedblendError, WorkerError
from fedblend.common.rng import SeedTree
from fedblend.core.backend import Backend
from fedblend.core.client import ClientJob, ClientResult, ClientRuntime
from fedblend.core.message import Message
from fedblend.core.method import Method, RunInfo
from fedblend.data.federated import ClientData


class SequentialBackend(Backend):
    name = "sequential"

    def start(self, method: Method, run: RunInfo, data: Mapping[int, ClientData], tree: SeedTree) -> None:
        self.runtime = ClientRuntime(method, run, data, tree)

    def run(self, jobs: Sequence[ClientJob]) -> list[ClientResult]:
        out = []
        for job in jobs:
            out.append(self.runtime.handle(job))
            self.finished(job)
        return out


# ---------------------------------------------------------------------------------------------- processes
def _pack_job(job: ClientJob) -> bytes:
    state = None if job.state is None else encode(job.state, as_numpy=True)
    return pickle.dumps((job.phase, job.cid, job.rnd, job.msg.to_arrays(), state))


def _unpack_job(blob: bytes) -> ClientJob:
    phase, cid, rnd, msg, state = pickle.loads(blob)
    return ClientJob(phase, cid, rnd, Message.from_arrays(msg), None if state is None else decode(state))


def _pack_result(res: ClientResult) -> bytes:
    state = None if res.state is None else encode(res.state, as_numpy=True)
    return pickle.dumps((res.reply.to_arrays(), state, encode(res.stats, as_numpy=True)))


def _unpack_result(blob: bytes) -> ClientResult:
    reply, state, stats = pickle.loads(blob)
    return ClientResult(Message.from_arrays(reply), None if state is None else decode(state), decode(stats))


def _worker_main(conn) -> None:  # pragma: no cover - runs in the worker process
    """A worker: receive its setup (method, run facts, its own clients' data), build the client runtime, then
    answer job batches until told to stop.

    Every failure goes to the parent, which names it once: fedblend's named errors (a client hook that raised,
    :class:`~fedblend.common.errors.HookError`; a reply that breaks the contract) whole, anything else as its
    traceback. A parent that is gone (stopped by SIGTERM or Ctrl-C, its pipe closed) ends the worker without a
    word, and Ctrl-C at a terminal, which reaches every process of the group, is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _serve(conn)
    except (EOFError, OSError):  # the parent closed the pipe (it stopped): nothing to report to
        pass
    finally:
        conn.close()


def _serve(conn) -> None:  # pragma: no cover - runs in the worker process
    conn.send_bytes(b"hello")
    method, run, data, tree, threads = pickle.loads(conn.recv_bytes())
    torch.set_num_threads(threads)
    clients = {cid: ClientData(**decode(arrays)) for cid, arrays in data.items()}
    runtime = ClientRuntime(method, run, clients, tree)
    conn.send_bytes(b"ready")
    while True:
        blob = conn.recv_bytes()
        if not blob:
            break
        try:
            jobs = pickle.loads(blob)
            answer = pickle.dumps(("ok", [_pack_result(runtime.handle(_unpack_job(j))) for j in jobs]))
        except FedblendError as exc:  # named (a client hook raised, a reply that breaks the contract): as it is
            answer = _named(exc)
        except Exception:
            answer = pickle.dumps(("error", traceback.format_exc()))
        conn.send_bytes(answer)


def _named(exc: FedblendError) -> bytes:
    """The answer that carries a named error to the parent, which raises it as it is (one that does not survive
    pickling, as its type and message)."""
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:  # noqa: BLE001 - an exception type that cannot be rebuilt: its text is what matters
        return pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))
    return pickle.dumps(("named", blob))


class ProcessBackend(Backend):
    """Client halves in ``workers`` spawned processes with ``threads`` torch threads each (default: this
    process's threads divided among the workers, at least one)."""

    name = "processes"

    def __init__(self, workers: int = 2, threads: int | None = None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers, self.threads = workers, threads
        self.procs: list[Any] = []
        self.conns: list[Any] = []

    def start(self, method: Method, run: RunInfo, data: Mapping[int, ClientData], tree: SeedTree) -> None:
        if torch.device(run.device).type != "cpu":
            raise ValueError("backend 'processes' runs clients on the CPU; use device = 'cpu' (or backend "
                             "'sequential' on a GPU)")
        threads = self.threads or max(1, torch.get_num_threads() // self.workers)
        ctx = mp.get_context("spawn")
        for w in range(self.workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name=f"fedblend-client-worker-{w}")
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
            # the setup goes only to a worker that is listening (a worker that dies first is an error, not a hang);
            # its clients' tensors are serialised once, without intermediate copies, and released when sent
            if self._receive(w, starting=True) != b"hello":
                raise WorkerError(f"client worker {w} did not start (an unexpected first message)")
            own = {cid: encode(vars(d), as_numpy=True) for cid, d in data.items() if cid % self.workers == w}
            blob = pickle.dumps((method, run, own, tree, threads), protocol=pickle.HIGHEST_PROTOCOL)
            del own
            try:
                parent.send_bytes(blob)
            except OSError:
                self._died(w, starting=True)
            del blob
        for w in range(self.workers):
            if self._receive(w, starting=True) != b"ready":
                raise WorkerError(f"client worker {w} did not start (an unexpected message)")

    def run(self, jobs: Sequence[ClientJob]) -> list[ClientResult]:
        per: list[list[int]] = [[] for _ in range(self.workers)]
        for i, job in enumerate(jobs):
            per[job.cid % self.workers].append(i)
        for w, idx in enumerate(per):
            if idx:
                try:
                    self.conns[w].send_bytes(pickle.dumps([_pack_job(jobs[i]) for i in idx]))
                except OSError:  # the worker is gone (a broken pipe)
                    self._died(w)
        out: list[ClientResult | None] = [None] * len(jobs)
        errors, named = [], []
        for w, idx in enumerate(per):
            if not idx:
                continue
            status, payload = pickle.loads(self._receive(w))
            if status == "named":  # a client hook that raised, a reply that breaks the contract: the same error as
                named.append(pickle.loads(payload))  # in process, raised once every worker's answer is read
                continue
            if status != "ok":
                errors.append(f"worker {w}: {payload}")
                continue
            for i, blob in zip(idx, payload):
                out[i] = _unpack_result(blob)
                self.finished(jobs[i])
        if named:
            raise named[0]
        if errors:
            more = f"\n(and {len(errors) - 1} more worker(s) failed)" if len(errors) > 1 else ""
            raise RuntimeError(f"a client failed in a worker process: {errors[0]}{more}")
        return out  # type: ignore[return-value]

    def _receive(self, w: int, starting: bool = False) -> bytes:
        """Worker ``w``'s answer; a worker that died (killed, out of memory, or a script without an
        ``if __name__ == "__main__":`` guard, which spawned workers re-run) is an error, never a hang."""
        conn, proc = self.conns[w], self.procs[w]
        while not conn.poll(1.0):
            if not proc.is_alive():
                self._died(w, starting)
        try:
            return conn.recv_bytes()
        except (EOFError, OSError):
            self._died(w, starting)

    def _died(self, w: int, starting: bool = False):
        """Raise the :class:`WorkerError` of worker ``w``, which is gone: how it ended (its exit code, or the
        signal that killed it) and what to do. The ``__main__`` hint only where it can be the cause: a worker that
        exits with an error while starting (spawned workers re-run the parent's script)."""
        proc = self.procs[w]
        proc.join(timeout=5)
        code = proc.exitcode
        if code is None:
            how = "stopped answering"
        elif code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            how = f"was killed by {name}" + (" (out of memory, or killed by a user or a scheduler)"
                                             if -code == signal.SIGKILL else "")
        else:
            how = f"exited with code {code}"
        if starting and code is not None and code > 0:
            fix = ("worker processes are spawned: a script that uses backend 'processes' must run its code under "
                   "`if __name__ == \"__main__\":`; or use backend = 'sequential'")
        elif starting:
            fix = "run again, or use backend = 'sequential'"
        else:
            fix = ("the run stopped; continue it from its last checkpoint with --resume (backend = 'sequential' "
                   "runs without worker processes)")
        raise WorkerError(f"client worker {w} (pid {proc.pid}) {how} {'while starting' if starting else 'during the run'}"
                          f"; {fix}")

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send_bytes(b"")
                conn.close()
            except OSError:
                pass
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
        self.procs, self.conns = [], []


def _vmap_backend():
    from fedblend.core.vmap import VmapBackend

    return VmapBackend()


BACKENDS = {"sequential": SequentialBackend, "processes": ProcessBackend, "vmap": _vmap_backend}


def make_backend(name: str, workers: int = 2, threads: int | None = None) -> Backend:
    """The backend called ``name`` (``BACKENDS``)."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {name!r}")
    return ProcessBackend(workers, threads) if name == "processes" else BACKENDS[name]()
