"""`gpusched logs`, the companion of `submit` for jobs agents run: how many lines it shows (on stderr), the last
N lines, and following the output until the job is final (Ctrl-C exits 130). The API is a fake that serves a
log growing as the real one does: its size, and the last `tail` bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from libs.cli import logs
from libs.cli.client import ApiError
from libs.cli.main import build_parser, main


class FakeApi:
    """A job's log in steps: each `job()` call moves to the next step (its state and output so far)."""

    def __init__(self, steps: list[tuple[str, str]], node: str = "n1") -> None:
        self.steps, self.step, self.node = steps, 0, node
        self.tails: list[int] = []

    def job(self, job_id: str) -> dict[str, Any]:
        self.step = min(self.step + 1, len(self.steps) - 1)
        state = self.steps[self.step][0]
        return {"id": job_id, "state": state, "exit_code": 0 if state == "succeeded" else None}

    def logs(self, job_id: str, tail: int = 65536) -> dict[str, Any]:
        self.tails.append(tail)
        data = self.steps[self.step][1].encode()
        if not data:
            raise ApiError(404, "no_logs", f"no node agent holds logs of job {job_id}")
        return {"node": self.node, "bytes": len(data), "log": data[max(len(data) - tail, 0):].decode()}


def run(api: FakeApi, monkeypatch: pytest.MonkeyPatch, *argv: str) -> None:
    monkeypatch.setattr(logs, "Client", lambda: api)
    monkeypatch.setattr(logs, "POLL_S", 0.0)
    main(["logs", *argv])


LOG = "".join(f"line {i}\n" for i in range(1, 201))


def test_it_says_how_many_lines_it_shows_and_from_how_much_of_the_log(monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run(FakeApi([("running", LOG)]), monkeypatch, "j1")
    out, err = capsys.readouterr()
    assert out == LOG
    assert err.strip() == "-- 200 lines (whole log, 1.7 KiB, node n1) --"


def test_a_window_that_cuts_a_line_leaves_it_out_and_says_how_much_it_read(monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    run(FakeApi([("running", LOG)]), monkeypatch, "j1", "--bytes", "100")
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"line {i}" for i in range(190, 201)]
    assert err.strip() == "-- 11 lines (last 100 B of 1.7 KiB, node n1) --"


def test_tail_shows_the_last_n_lines_widening_the_window_as_needed(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi([("running", LOG)])
    run(api, monkeypatch, "j1", "--tail", "3")
    out, err = capsys.readouterr()
    assert out == "line 198\nline 199\nline 200\n"
    assert err.startswith("-- 3 lines (whole log")
    run(api, monkeypatch, "j1", "--tail", "150", "--bytes", "64")
    out, _ = capsys.readouterr()
    assert out.splitlines() == [f"line {i}" for i in range(51, 201)]
    assert api.tails == [logs.WINDOW, 64, 256, 1024, 4096]  # widened until it held 150 lines


def test_json_holds_the_lines_shown_and_their_count(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run(FakeApi([("running", LOG)]), monkeypatch, "j1", "--tail", "2", "--json")
    assert json.loads(capsys.readouterr().out) == {"node": "n1", "bytes": len(LOG), "log": "line 199\nline 200\n",
                                                   "lines": 2}


def test_follow_prints_new_output_until_the_job_is_final(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    steps = [("pending", ""), ("pending", ""), ("running", "a\n"), ("running", "a\nb\n"), ("running", "a\nb\n"),
             ("succeeded", "a\nb\nc\n")]
    run(FakeApi(steps), monkeypatch, "j1", "-f")
    out, err = capsys.readouterr()
    assert out == "a\nb\nc\n"
    assert "no output yet" in err
    assert err.strip().splitlines()[-1] == "-- job j1 succeeded, exit code 0 --"


def test_follow_starts_with_the_lines_there_are_and_a_new_node_starts_a_new_log(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi([("running", "a\nb\n"), ("running", "a\nb\nc\n"), ("succeeded", "x\n")])
    real_job = api.job

    def moves(job_id: str) -> dict[str, Any]:
        answer = real_job(job_id)
        if answer["state"] == "succeeded":
            api.node = "n2"
        return answer

    monkeypatch.setattr(api, "job", moves)
    run(api, monkeypatch, "j1", "--follow")
    out, err = capsys.readouterr()
    assert out == "a\nb\nc\nx\n"
    assert "-- 2 lines (whole log" in err and "runs again, on node n2" in err and "succeeded" in err


def test_ctrl_c_while_following_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeApi([("running", "a\n")])

    def interrupted(job_id: str) -> dict[str, Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "job", interrupted)
    with pytest.raises(SystemExit) as exit_:
        run(api, monkeypatch, "j1", "-f")
    assert exit_.value.code == 130


def test_follow_and_json_together_are_refused(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        run(FakeApi([("running", "a\n")]), monkeypatch, "j1", "-f", "--json")
    assert exit_.value.code == 1 and "choose one" in capsys.readouterr().err


def test_the_logs_parser_has_tail_in_lines_and_follow() -> None:
    args = build_parser().parse_args(["logs", "j1", "--tail", "5", "-f"])
    assert (args.job, args.tail, args.follow, args.bytes) == ("j1", 5, True, logs.WINDOW)
