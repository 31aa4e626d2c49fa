#!/usr/bin/env python3
"""The README's first five minutes, as a new user lives them: the run command of "## Run it" in the
background, with nothing of the platform set in the environment, then every command of the block after it,
in order, then Ctrl-C and a check that nothing the run command started is left running.

The commands are read from README.md itself, so the README and this check cannot drift apart. In the
steps, `<id>` stands for the id the first `submit` printed. After the steps, every job a `submit` step
made must end well (`gpusched wait` on each): a reader who waits on any of them gets an answer. A failing
step is named with its output and the platform's; the exit code is non-zero.

    .venv/bin/python scripts/readme_smoke.py [--readme README.md] [--timeout 120]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# What a new user's shell has none of: the CLI must find the local platform by itself.
CLEARED = ("NATS_URL", "REDIS_URL", "GPUSCHED_")
STEP_TIMEOUT_S = 60.0
STARTUP_TIMEOUT_S = 120.0


class SmokeFailure(Exception):
    pass


@dataclass
class Step:
    command: str
    rc: int | None = None
    seconds: float = 0.0
    output: str = ""


def section_blocks(readme: str, heading: str = "## Run it") -> list[list[str]]:
    """The ```bash blocks of one section, each as its command lines (comments and blank lines dropped)."""
    start = readme.index(heading)
    end = readme.find("\n## ", start + len(heading))
    body = readme[start:end if end >= 0 else len(readme)]
    blocks = re.findall(r"```bash\n(.*?)```", body, flags=re.S)
    return [[c for c in (_strip_comment(line) for line in block.splitlines()) if c] for block in blocks]


def _strip_comment(line: str) -> str:
    """A shell comment starts at a `#` that follows whitespace (or opens the line)."""
    return re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()


def user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED)}
    env["COLUMNS"] = "80"  # the README's tables, as an 80-column terminal shows them
    return env


def run_step(command: str, env: dict[str, str]) -> Step:
    step, started = Step(command), time.monotonic()
    try:
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=STEP_TIMEOUT_S)
        step.rc, step.output = done.returncode, (done.stdout + done.stderr)
    except subprocess.TimeoutExpired as err:
        step.output = f"{_text(err.stdout)}{_text(err.stderr)}\n(no result after {STEP_TIMEOUT_S:g}s)"
    step.seconds = time.monotonic() - started
    return step


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def session_processes(sid: int) -> list[str]:
    """Every live process of the session the run command was started in (it and all it spawned)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces, so split after its closing paren.
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{stat.parent.name}: {cmdline.strip()}")
    return found


def tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def wait_for_platform(proc: subprocess.Popen[bytes], endpoints: Path, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if endpoints.exists():
            return
        if proc.poll() is not None:
            raise SmokeFailure(f"the run command exited with code {proc.returncode} before the platform was up:\n"
                               f"{tail(log)}")
        time.sleep(0.5)
    raise SmokeFailure(f"the platform was not up after {timeout:g}s ({endpoints} never appeared):\n{tail(log)}")


def stop(proc: subprocess.Popen[bytes], log: Path) -> list[str]:
    """Ctrl-C as a terminal sends it (SIGINT to the whole foreground group); what is left after 30 s."""
    with contextlib.suppress(ProcessLookupError):  # the group may be gone already (a run command that failed)
        os.killpg(proc.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    left = session_processes(proc.pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = session_processes(proc.pid)
    return left


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--timeout", type=float, default=STARTUP_TIMEOUT_S, help="seconds for the platform to start")
    args = parser.parse_args()
    blocks = section_blocks(args.readme.read_text())
    if len(blocks) < 2 or len(blocks[0]) != 1:
        print("readme smoke: '## Run it' must open with a block holding the run command, then the first steps",
              file=sys.stderr)
        return 2
    run_command, steps = blocks[0][0], blocks[1]
    env = user_env()
    endpoints = ROOT / ".data" / "endpoints.json"
    endpoints.unlink(missing_ok=True)  # a file left by an earlier run would say "up" too early
    log = Path(tempfile.mkstemp(prefix="gpusched-readme-up-", suffix=".log")[1])
    print(f"readme smoke: {run_command}  (output: {log})", flush=True)
    started = time.monotonic()
    with open(log, "wb") as out:
        # A session of its own, as a terminal gives it: SIGINT reaches the whole group, and every process it
        # started can be found afterwards by its session id.
        proc = subprocess.Popen(["bash", "-c", run_command], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    results: list[Step] = []
    failure: str | None = None
    try:
        wait_for_platform(proc, endpoints, log, args.timeout)
        print(f"  up after {time.monotonic() - started:.0f}s", flush=True)
        job_id: str | None = None
        submitted: list[str] = []  # every job a step submitted, in order
        for command in steps:
            if "<id>" in command:
                if job_id is None:
                    raise SmokeFailure(f"step `{command}` needs <id>, but no step before it printed a job id")
                command = command.replace("<id>", shlex.quote(job_id))
            step = run_step(command, env)
            results.append(step)
            print(f"  [{'ok' if step.rc == 0 else 'FAILED'}] {step.command}  ({step.seconds:.1f}s)", flush=True)
            if step.rc != 0:
                raise SmokeFailure(f"step `{step.command}` failed (exit {step.rc}); its output:\n{step.output}\n"
                                   f"--- the platform's output (last lines):\n{tail(log)}")
            if " submit " in f" {command} ":
                found = UUID.search(step.output)
                submitted += [found.group(0)] if found else []
                job_id = job_id or (found.group(0) if found else None)
        for job in submitted:  # a job that never ends (no runtime: the simulated executor runs it for ever)
            step = run_step(f".venv/bin/gpusched wait {job}", env)
            results.append(step)
            print(f"  [{'ok' if step.rc == 0 else 'FAILED'}] {step.command}  ({step.seconds:.1f}s: every job the "
                  "README submits ends)", flush=True)
            if step.rc != 0:
                raise SmokeFailure(f"job {job}, which the README submits, did not succeed: `{step.command}` exited "
                                   f"{step.rc}; its output:\n{step.output}\n--- the platform's output (last lines):\n"
                                   f"{tail(log)}")
    except SmokeFailure as err:
        failure = str(err)
    finally:
        left = stop(proc, log)
    if left:
        failure = (f"{failure}\nand " if failure else "") + ("after Ctrl-C these processes of the run command were "
                                                             "still running:\n  " + "\n  ".join(left))
    for line in left:  # never leave them to the next run
        pid = int(line.split(":", 1)[0])
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if failure is None and proc.returncode not in (0, -signal.SIGINT, 128 + signal.SIGINT):
        failure = f"the run command exited with code {proc.returncode} on Ctrl-C:\n{tail(log)}"
    if failure is not None:
        print(f"readme smoke FAILED: {failure}", file=sys.stderr)
        return 1
    print(f"readme smoke: ok, {len(results)} steps, the platform stopped cleanly on Ctrl-C, nothing left running "
          f"({time.monotonic() - started:.0f}s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
