"""One writer per run directory (``fedblend.rundir``): the lock against real processes (a run in a subprocess, a
real ``kill -9``), ``--force`` leaving nothing of the old run, names that cannot leave ``runs/``, ``partition
--out`` over a run, ``--export pflib`` over an earlier export, and the lock's own rules (re-entry, the folder it
created, a stale lock file)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedblend.cli.main import main
from fedblend.rundir import LOCK_NAME, DirLock, RunLockedError, clear_run, locked_by

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = """dataset = "synthetic"
model = "mlp"
rounds = {rounds}
checkpoint_every = 1
[partition]
num_clients = 3
min_samples = 5
[log]
plot = false
"""
FAST = ["--quiet", "--threads", "1"]


def config(tmp_path: Path, rounds: int = 2, name: str = "tiny.toml") -> Path:
    path = tmp_path / name
    path.write_text(TINY.format(rounds=rounds))
    return path


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def start_run(cfg: Path, out: Path, *extra: str) -> subprocess.Popen:
    """``fedblend run`` in its own process, returned once it holds the lock and has finished a round."""
    p = subprocess.Popen([sys.executable, "-m", "fedblend.cli.main", "run", str(cfg), "--out", str(out), *FAST,
                          *extra], env=env(), stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 1):
        assert p.poll() is None, p.stderr.read()
        assert time.time() < deadline, "the run did not get going"
        time.sleep(0.1)
    return p


def kill9(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedblend: error: "), err
    return err[0]


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_writer_is_refused_while_a_run_writes_and_the_kernel_frees_the_lock_on_kill(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="tensorboard not installed")
    cfg = config(tmp_path, rounds=100000)
    out = tmp_path / "run"
    p = start_run(cfg, out)
    try:
        assert locked_by(out) == p.pid
        attempts = {
            "resume": ["run", str(cfg), "--out", str(out), "--resume", *FAST],
            "force": ["run", str(cfg), "--out", str(out), "--force", *FAST],
            "partition": ["partition", str(cfg), "--out", str(out), "--force"],
            "export pflib": ["partition", str(cfg), "--export", "pflib", str(out)],
            "export tensorboard": ["export", "tensorboard", str(out)],
            "report": ["report", str(out), "--out", str(out)],
            "pretrain": ["pretrain", str(cfg), "--set", "method=pfedrlla", "--out", str(tmp_path / "x"), "--quiet"],
        }
        (tmp_path / "x.run").symlink_to(out)  # pretrain's run directory is OUT.run: here the running run
        for what, argv in attempts.items():
            capsys.readouterr()
            assert main(argv) == 2, what
            line = one_error(capsys)
            assert "is in use" in line and f"process {p.pid}" in line, (what, line)
        assert p.poll() is None  # the run was left alone
    finally:
        kill9(p)
    # kill -9 leaves the lock file but the kernel released the lock: the next writer takes it
    assert (out / LOCK_NAME).exists() and locked_by(out) is None
    assert main(["export", "tensorboard", str(out)]) == 0
    assert not (out / LOCK_NAME).exists()  # taken, then released and removed by the process that took it


def test_sweep_runs_die_with_a_killed_sweep_and_a_restart_finishes_them_once(tmp_path, capsys):
    """A sweep killed with SIGKILL takes its runs with it (PR_SET_PDEATHSIG); a second sweep into the same folder
    is refused while the first runs; the restarted sweep resumes the run, which ends with every round once."""
    cfg = config(tmp_path, rounds=300, name="long.toml")
    out = tmp_path / "sw"
    run_dir = out / "long" / "seed0"
    log = open(tmp_path / "sweep.log", "w")  # noqa: SIM115 - the sweep's output, for a failing run
    sweep = subprocess.Popen([sys.executable, "-m", "fedblend.cli.main", "sweep", str(cfg), "--seeds", "0", "--out",
                              str(out), "--no-plots"], env=env(), stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    child = None
    try:
        deadline = time.time() + 120
        while child is None or not (run_dir / "checkpoint.pt").exists():
            assert sweep.poll() is None and time.time() < deadline, "the sweep did not get going"
            child = locked_by(run_dir) or None
            time.sleep(0.1)
        assert main(["sweep", str(cfg), "--seeds", "0", "--out", str(out)]) == 2  # one sweep per folder
        assert f"process {sweep.pid}" in one_error(capsys)
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait(timeout=30)
        t0 = time.time()
        while _alive(child) and time.time() - t0 < 30:
            time.sleep(0.05)
        assert not _alive(child), "the sweep's run outlived it"
        print(f"run {child} stopped {time.time() - t0:.2f}s after kill -9 of its sweep")
    finally:
        kill9(sweep)
        log.close()
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)
    assert "--resume" in (run_dir / "stdout.log").read_text().splitlines()[-1]  # it stopped at its checkpoint
    capsys.readouterr()
    assert main(["sweep", str(cfg), "--seeds", "0", "--out", str(out), "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "[ok] long seed 0 resumed" in text
    rounds = [json.loads(x)["round"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rounds == list(range(1, 301))
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 300


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for its new parent to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_locked_run_directory_is_busy_in_a_sweep_plan(tmp_path):
    from fedblend.cli.sweep import plan

    cfg = config(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from fedblend.rundir import DirLock; "
                               "DirLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)",
                               str(tmp_path / "sw" / "tiny" / "seed0")], env=env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        runs = plan([str(cfg)], [0, 1], [], [], tmp_path / "sw")
        assert [r.action for r in runs] == ["busy", "start"] and f"process {holder.pid}" in runs[0].why
    finally:
        holder.kill()
        holder.wait()
    assert [r.action for r in plan([str(cfg)], [0, 1], [], [], tmp_path / "sw", wait_busy=5)] == ["start", "start"]


def test_force_leaves_nothing_of_the_old_run_and_nothing_else_is_touched(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="tensorboard not installed")
    cfg = config(tmp_path, rounds=3)
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out), "--set", "store=disk", "--set", "log.tensorboard=true",
                 "--set", "partition.num_clients=5", *FAST]) == 0
    assert (out / "clients").is_dir() and (out / "clients.ckpt").is_dir() and (out / "tensorboard").is_dir()
    (out / "notes.txt").write_text("mine")  # the user's file
    (out / "stdout.log").write_text("$ fedblend run ...\n")  # a sweep's log
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.bin").write_text("x")
    (out / "checkpoint.pt.tmp").write_text("half-written")
    (out / "clients.ckpt").rename(out / "old-ckpt")
    (out / "clients.ckpt").symlink_to(outside, target_is_directory=True)  # never followed
    assert main(["run", str(cfg), "--out", str(out), "--force", *FAST]) == 0
    left = sorted(p.name for p in out.iterdir())
    assert left == sorted(["checkpoint.pt", "checkpoint.pt.sha256", "config.toml", "metrics.csv", "metrics.jsonl",
                           "notes.txt", "old-ckpt", "partition.json", "partition.txt", "stdout.log", "summary.json"])
    assert (outside / "keep.bin").read_text() == "x" and (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "partition.json").read_text())["spec"]["num_clients"] == 3


def test_clear_run_removes_owned_entries_only(tmp_path):
    for name in ("config.toml", "summary.json.tmp", "partition.png", "metrics.jsonl", "mine.toml", "summary"):
        (tmp_path / name).write_text("x")
    (tmp_path / "tensorboard" / "sub").mkdir(parents=True)
    removed = {p.name for p in clear_run(tmp_path)}
    assert removed == {"config.toml", "summary.json.tmp", "partition.png", "metrics.jsonl", "tensorboard"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.toml", "summary"]


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".", "a\\\\b", "tab\\tname", "n" * 201])
def test_a_name_cannot_leave_its_folder(tmp_path, capsys, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(config(tmp_path)), "--set", f'name="{name}"', *FAST]) == 2
    assert "name becomes a folder name" in one_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.toml"]  # runs/ not even created


def test_partition_over_a_run_is_refused_unless_force(tmp_path, capsys):
    cfg = config(tmp_path)
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out), *FAST]) == 0
    before = files(out)
    capsys.readouterr()
    assert main(["partition", str(cfg), "--out", str(out), "--set", "partition.alpha=5.0"]) == 2
    assert "holds a run" in one_error(capsys) and files(out) == before
    assert main(["partition", str(cfg), "--out", str(out), "--set", "partition.alpha=5.0", "--force"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["partition.json", "partition.png", "partition.txt"]
    assert json.loads((out / "partition.json").read_text())["spec"]["alpha"] == 5.0
    capsys.readouterr()
    assert main(["run", str(cfg), "--out", str(out), "--resume", *FAST]) != 0  # no run left to resume
    assert main(["partition", str(cfg), "--out", str(out)]) == 0  # an earlier partition's files: replaced


def test_pflib_export_replaces_an_earlier_export_and_refuses_other_folders(tmp_path, capsys):
    from fedblend.data.interop import read_pflib

    cfg = config(tmp_path)
    target = tmp_path / "pfl"
    assert main(["partition", str(cfg), "--set", "partition.num_clients=5", "--export", "pflib", str(target)]) == 0
    assert len(read_pflib(target)) == 5
    assert main(["partition", str(cfg), "--export", "pflib", str(target)]) == 0
    assert sorted(p.name for p in (target / "train").iterdir()) == ["0.npz", "1.npz", "2.npz"]
    assert len(read_pflib(target)) == 3 and json.loads((target / "config.json").read_text())["num_clients"] == 3
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "thesis.tex").write_text("x")
    capsys.readouterr()
    assert main(["partition", str(cfg), "--export", "pflib", str(tmp_path / "other")]) == 2
    assert "not a PFLlib export" in one_error(capsys)
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["thesis.tex"]


def test_tensorboard_export_replaces_earlier_events_and_report_refuses_a_run_dir(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="tensorboard not installed")
    from fedblend.tracking import read_tensorboard

    out = tmp_path / "run"
    assert main(["run", str(config(tmp_path)), "--out", str(out), *FAST]) == 0
    for _ in range(2):
        assert main(["export", "tensorboard", str(out)]) == 0
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert set(read_tensorboard(out / "tensorboard")["acc"]) == {1, 2}
    capsys.readouterr()
    assert main(["report", str(out), "--out", str(out)]) == 2
    assert "is a run directory" in one_error(capsys)


def test_the_lock_is_reentrant_removes_what_it_created_and_reuses_a_stale_file(tmp_path):
    d = tmp_path / "a" / "b"
    with DirLock(d) as outer:
        assert outer.created == [tmp_path / "a", d] and (d / LOCK_NAME).read_text().strip() == str(os.getpid())
        with DirLock(d):  # the same process again (pretrain: its run inside the agent's lock)
            assert locked_by(d) == os.getpid()
        assert (d / LOCK_NAME).exists()  # still held by the outer
    assert not (tmp_path / "a").exists()  # created, left empty: removed
    killed = subprocess.Popen([sys.executable, "-c", "import os, sys; from fedblend.rundir import DirLock; "
                               "DirLock(sys.argv[1]).acquire(); os.kill(os.getpid(), 9)", str(d)], env=env())
    killed.wait(timeout=60)
    assert (d / LOCK_NAME).exists() and locked_by(d) is None  # stale file, free lock
    with DirLock(d):
        with pytest.raises(RunLockedError, match=f"process {os.getpid()}"):
            subprocess_lock(d)
    assert not (d / LOCK_NAME).exists()


def subprocess_lock(d: Path) -> None:
    """Try to take ``d``'s lock in another process; raise its error line here."""
    r = subprocess.run([sys.executable, "-c", "import sys; from fedblend.rundir import DirLock; "
                        "DirLock(sys.argv[1]).acquire()", str(d)], env=env(), capture_output=True, text=True)
    if r.returncode:
        raise RunLockedError(r.stderr.strip().splitlines()[-1])


def test_sibling_runs_started_together_share_the_parent_one_of_them_makes(tmp_path, monkeypatch):
    """Two runs into ``runs/x/a`` and ``runs/x/b`` started at once: both see ``runs/x`` missing, one makes it
    first; the other must go on (not fail with "File exists") and must not count it as its own to remove."""
    parent = tmp_path / "runs" / "x"
    real_mkdir = Path.mkdir

    def raced(self, *args, **kwargs):
        if self == parent and not self.exists():
            real_mkdir(self)  # the sibling run got there first
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", raced)
    with DirLock(parent / "b") as lock:
        assert lock.created == [tmp_path / "runs", parent / "b"]
    assert parent.is_dir() and not (parent / "b").exists()  # the sibling's parent stays; our own folder goes
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(Path, "exists", lambda self: False if self.name == "file" else os.path.exists(self))
    with pytest.raises(Exception, match="cannot create"):  # a file in the way is still an error
        DirLock(tmp_path / "file" / "c").acquire()
