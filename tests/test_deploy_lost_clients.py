"""A deployed run that lost clients says so (issue #50): its status is "finished-degraded" (not "finished"), its
summary names the clients, rounds and reasons and over how many clients the headline was measured, the result line
and ``fedblend report`` show it; a ServerApp that stops says why in ``fedblend deploy``'s one error line (not a
proxy hint); the deployment's work folder keeps only its logs after a complete run.

In-process (a grid that answers in this process, tests/test_flower.py's) for the summary and the reasons; real
processes (a SuperLink and 2 SuperNodes on loopback, one SuperNode killed with SIGKILL after round 1) for the end
to end check. Skipped with a reason where the Flower extra or the real data is missing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower extra is not installed (pip install 'fedblend[flower]')")

from fedblend.config import load_config  # noqa: E402
from fedblend.experiment import DEGRADED  # noqa: E402
from fedblend.flower import apps, deploy  # noqa: E402
from fedblend.flower.backend import FlowerRunError  # noqa: E402
from tests.test_flower import (  # noqa: E402
    FMNIST_TINY,
    PushPullGrid,
    _children,
    _logs,
    flower_run,
    run_config,
    tiny_cfg,
)

pytestmark = pytest.mark.usefixtures("one_thread")


class NodeDiesInRound2(PushPullGrid):
    """Node 101 stops answering from round 2 on and never comes back (both of the Grid's paths)."""

    def _check(self, messages) -> None:
        if max([int(m.metadata.group_id or 0) for m in messages] + [0]) >= 1:
            self.down.add(101)

    def send_and_receive(self, messages, *, timeout=None):
        self._check(messages)
        return super().send_and_receive(messages, timeout=timeout)

    def push_messages(self, messages):
        self._check(messages)
        return super().push_messages(messages)


def _nodes(tmp: Path, n: int = 2) -> dict[int, dict]:
    return {100 + k: {"partition-id": k, "num-partitions": n, "state-dir": str(tmp / f"node-{k}")} for k in range(n)}


def _degraded_run(tmp: Path) -> dict:
    cfg = tiny_cfg("fedavg", "rounds=3")
    grid = NodeDiesInRound2(run_config(cfg), _nodes(tmp))
    flower_run(cfg, tmp, grid=grid)
    return json.loads((tmp / "out" / "summary.json").read_text())


class TestLostClientsInTheSummary:
    def test_a_run_that_lost_clients_is_finished_degraded_with_what_it_lost(self, tmp_path):
        s = _degraded_run(tmp_path)
        assert s["status"] == DEGRADED != "finished"
        lost = s["clients_lost"]
        assert lost["clients"] == [1, 3]  # node 1 serves clients 1 and 3 (c % 2 == 1)
        assert lost["rounds"] == [2, 3] and lost["dropped"] == {"2": [1, 3], "3": [1, 3]}
        assert lost["eval_missing"] == {"2": 2, "3": 2}
        assert any("no answer" in r or "no live node" in r for r in lost["reasons"])
        head = lost["headline_evaluated"]
        assert head == {"round": s["best_round"], "evaluated": 2 if s["best_round"] > 1 else 4, "of": 4}

    def test_the_headline_is_stated_over_the_clients_evaluated(self, tmp_path):
        s = _degraded_run(tmp_path)
        h = s["clients_lost"]["headline_evaluated"]
        assert (f"the headline accuracy {s['best_accuracy']:.4f} (round {s['best_round']}) is over the "
                f"{h['evaluated']} of {h['of']} clients evaluated") in s["degraded"]
        assert "client(s) [1, 3] did not answer" in s["degraded"]

    def test_a_run_that_lost_nothing_is_finished_without_a_lost_section(self, tmp_path):
        cfg = tiny_cfg("fedavg", "rounds=2")
        flower_run(cfg, tmp_path)
        s = json.loads((tmp_path / "out" / "summary.json").read_text())
        assert s["status"] == "finished" and "clients_lost" not in s and "degraded" not in s


class TestLostClientsShown:
    def test_the_result_line_carries_the_status_and_stderr_says_why(self, tmp_path, capsys):
        from fedblend.cli.args import result_line

        s = _degraded_run(tmp_path)
        result_line(s, ["method", "best_accuracy"])
        out, err = capsys.readouterr()
        assert json.loads(out)["status"] == DEGRADED
        assert "status is 'finished-degraded'" in err and "did not answer" in err

    def test_a_finished_run_s_result_line_is_unchanged(self, capsys):
        from fedblend.cli.args import result_line

        result_line({"status": "finished", "method": "fedavg", "best_accuracy": 0.5}, ["method", "best_accuracy"])
        out, err = capsys.readouterr()
        assert json.loads(out) == {"method": "fedavg", "best_accuracy": 0.5} and err == ""

    def test_report_leaves_it_out_of_the_table_and_says_why(self, tmp_path):
        from fedblend.results.report import report

        _degraded_run(tmp_path)
        text = report([tmp_path / "out"], tmp_path / "rep", plots=False)
        assert f"not in the table (clients lost): {tmp_path / 'out'} ({DEGRADED}" in text
        assert "did not answer" in text
        assert json.loads((tmp_path / "rep" / "table.json").read_text()) == []


class TestTheServerAppSaysWhyItStopped:
    def test_too_few_answers_write_the_reason_to_the_error_file(self, tmp_path):
        cfg = tiny_cfg("fedavg", "rounds=3")
        grid = NodeDiesInRound2(run_config(cfg), _nodes(tmp_path))
        rc = run_config(cfg, out=str(tmp_path / "out"), **{"num-nodes": 2, "timeout": 2, "min-clients": 4,
                                                            "poll": 0.01, "error-file": str(tmp_path / "err.txt")})
        with pytest.raises(FlowerRunError):
            apps.serve(grid, rc, echo=False)
        text = (tmp_path / "err.txt").read_text()
        assert text.startswith("FlowerRunError: round 2: 2 of 4 clients answered, fewer than min_clients=4")

    def test_deploy_s_error_line_leads_with_the_reason_not_the_proxy(self, tmp_path, monkeypatch):
        monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
        (tmp_path / deploy.ERROR_FILE).write_text("FlowerRunError: round 2: 1 of 2 clients answered\n")
        (tmp_path / "supernode-1.log").write_text("killed\n")
        msg = deploy._failure(1, ["supernode-1"], tmp_path, None)
        assert msg.index("the ServerApp stopped: FlowerRunError: round 2: 1 of 2 clients answered") < msg.index(
            "supernode-1 exited early")
        assert "proxy" not in msg and "\n" not in msg

    def test_the_marked_stderr_line_is_the_reason_without_an_error_file(self, tmp_path):
        (tmp_path / "flwr-run.log").write_text(f"x\n{apps.ERROR_MARK}DataError: no such folder /d\nTraceback\n")
        assert "the ServerApp stopped: DataError: no such folder /d" in deploy._failure(1, [], tmp_path, None)


class TestWorkFolder:
    def test_a_complete_run_keeps_only_the_logs(self, tmp_path):
        work = tmp_path / ".out.flower"
        for d in ("node-0/key", "node-1/key", "app", "flwr-home"):
            (work / d).mkdir(parents=True)
            (work / d / "f").write_bytes(b"x" * 1000)
        for f in ("superlink.db", "superlink.log", "supernode-0.log", "flwr-run.log"):
            (work / f).write_text("y")
        deploy.clean_work(work)
        assert sorted(p.name for p in work.iterdir()) == ["flwr-run.log", "superlink.log", "supernode-0.log"]
        assert deploy.work_note(work) == f"Flower logs and work files in {work} (0.0 MB)"

    def test_the_work_folder_is_beside_out(self, tmp_path):
        assert deploy.work_dir(tmp_path / "runs" / "x") == tmp_path / "runs" / ".x.flower"


def _kill_node_after_round_1(node: int):
    """A progress callback that SIGKILLs SuperNode ``node`` (this process's child, in its own process group) when
    round 1's row arrives."""
    def on_row(row, _sim):
        if row["round"] != 1:
            return
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if stat[1] == str(os.getpid()) and "flower-supernode" in cmd and f"partition-id={node} " in cmd:
                os.killpg(int(d.name), signal.SIGKILL)
                on_row.killed = True
    on_row.killed = False
    return on_row


class TestSuperNodeKilledDuringDeploy:
    def test_the_run_ends_finished_degraded_and_the_work_folder_keeps_its_logs(self, tmp_path, real_data_dir,
                                                                              flwr_bin):
        """``fedblend deploy``'s own path (deploy_local): 2 SuperNodes, node 1 killed (SIGKILL) once round 1 is
        recorded; with a 20 s answer timeout rounds 2 and 3 go on without client 1, and the run ends
        "finished-degraded" saying so."""
        cfg = load_config(None, [*FMNIST_TINY, "rounds=3"])
        killer = _kill_node_after_round_1(1)
        out = tmp_path / "flw"
        s = deploy.deploy_local(cfg, out, nodes=2, data_dir=real_data_dir, timeout=20, run_timeout=600,
                                progress=killer)
        work = deploy.work_dir(out)
        assert killer.killed, _logs(work)
        assert s["status"] == DEGRADED, _logs(work)
        assert s["clients_lost"]["clients"] == [1] and 2 in s["clients_lost"]["rounds"]
        assert s["clients_lost"]["headline_evaluated"]["of"] == 3
        assert json.loads((out / "summary.json").read_text())["status"] == DEGRADED
        assert (work / "supernode-1.log").exists() and not list(work.glob("node-*"))
        assert _children() == []

    def test_with_min_clients_the_error_line_gives_the_server_s_reason(self, tmp_path, real_data_dir, flwr_bin,
                                                                       monkeypatch):
        """``--min-clients 3`` of 3 and SuperNode 1 killed after round 1, with a proxy variable set: the run stops
        in round 2 and ``fedblend deploy``'s one error line gives the ServerApp's reason first, not a proxy hint;
        the ServerApp's stderr line reached ``flwr run --stream``'s log too."""
        monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
        cfg = load_config(None, [*FMNIST_TINY, "rounds=3"])
        killer = _kill_node_after_round_1(1)
        out = tmp_path / "flw"
        with pytest.raises(deploy.DeployError) as err:
            deploy.deploy_local(cfg, out, nodes=2, data_dir=real_data_dir, timeout=20, run_timeout=600,
                                min_clients=3, progress=killer)
        work = deploy.work_dir(out)
        msg = str(err.value)
        assert killer.killed and "\n" not in msg, _logs(work)
        assert "the ServerApp stopped: FlowerRunError: round 2: 2 of 3 clients answered, fewer than min_clients=3" \
            in msg, msg
        assert "proxy" not in msg.split("the ServerApp stopped")[1] and "supernode-1 exited early" in msg
        assert apps.ERROR_MARK + "FlowerRunError" in (work / "flwr-run.log").read_text(), _logs(work)
        assert list(work.glob("node-*"))  # a failed run keeps the nodes' states (its --resume needs them)
        assert _children() == []
