"""What a user watching sees: `babysit up`'s live table on a real terminal, `status --watch`, the plain
lines when stdout is not a terminal, and `status` telling progress from the log before any poll.

Runs use the torch-free fake trainer (tests/reliability/fake_trainer.py), which logs a step every
`--sleep` seconds, so each test takes seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.scenarios.conftest import PY, Daemon, babysit, store_of
from tests.support import register, run_toml, wait_for

FAKE = Path(__file__).resolve().parents[1] / "reliability" / "fake_trainer.py"
ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-B]|\x1b[=>78]")


def fake_run(root: Path, name: str, *, steps: int, sleep: float = 0.05, command: list[str] | None = None) -> None:
    """Register a fake-trainer run whose first poll comes long after the test is over (60 s accelerated)."""
    argv = command or [PY, str(FAKE), f"outputs/{name}/log.jsonl", "--steps", str(steps), "--sleep", str(sleep)]
    register(root, run_toml(name, argv, log="outputs/{name}/log.jsonl", gpus=[], poll=(60, 60),
                            guards={"min_free_host_ram_gib": 0.1, "stop_grace_seconds": 5}))


class Terminal:
    """A command on a real pseudo-terminal (its controlling tty, `cols` x `rows`), and all it wrote."""

    def __init__(self, argv: list[str], cwd: Path, cols: int = 160, rows: int = 40) -> None:
        env = {**os.environ, "TERM": "xterm-256color"}
        env.pop("NO_COLOR", None)
        pid, fd = pty.fork()
        if pid == 0:  # the child: size its terminal, then become the command
            try:
                fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                os.chdir(cwd)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.raw = bytearray()
        self.eof = False

    def pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.eof and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                data = b""
            if not data:
                self.eof = True
            self.raw += data

    @property
    def text(self) -> str:
        return ANSI.sub(b"", bytes(self.raw)).decode("utf-8", "replace")

    def wait_for(self, what: str, check: Callable[[str], object], timeout: float) -> None:
        """tests.support.wait_for's order, over the terminal's text, read on while waiting (until it closes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.eof:
            if check(self.text):
                return
            self.pump(0.2)
        assert check(self.text), f"timed out after {timeout:g}s waiting for {what}; last seen:\n{self.text[-3000:]}"

    def ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")  # the terminal's line discipline turns it into SIGINT, as a keyboard does

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while not self.eof and time.monotonic() < deadline:
            self.pump(0.5)
        for _ in range(50):
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.1)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"did not exit within {timeout}s:\n{self.text[-3000:]}")


def steps_shown(text: str, run: str, state: str, target: int) -> list[int]:
    return [int(m) for m in re.findall(rf"{run}\s+{state}\s+1/3 default\s+(\d+)/{target}\b", text)]


def test_up_on_a_terminal_redraws_a_live_table_whose_step_advances(workspace: Path) -> None:
    fake_run(workspace, "livefast", steps=160)
    term = Terminal([PY, "-m", "babysit", "up", "--accelerated", "--exit-when-idle",
                     "--registry", str(workspace / "babysit.toml")], workspace)
    assert term.wait(timeout=60) == 0, term.text[-3000:]
    text = term.text
    steps = steps_shown(text, "livefast", "running", 160)
    assert len(set(steps)) >= 3 and steps == sorted(steps), f"the step advances across refreshes: {steps}"
    assert re.search(r"livefast\s+finished\s+1/3 default\s+160/160\s+\S+\s+—\s+cpu\s+—\s+ended completed", text)
    assert b"\x1b[2K" in term.raw and text.count("ATTEMPT") >= 3, "redrawn in place, not scrolled"
    assert text.count("livefast — attempt 1/3 launched") == 1, "a message prints once, above the table"
    assert re.search(r"\d+\.\d+\s+\d+s", text), "s/step and ETA, before any poll"


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux to look at the screen")
def test_messages_and_warnings_print_above_the_table_and_never_tear_it(workspace: Path) -> None:
    fake_run(workspace, "steady", steps=120)
    fake_run(workspace, "boom", steps=0, command=[PY, "-c", "import sys; sys.stderr.write('bad\\n'); sys.exit(3)"])
    sock = f"babysit-test-{os.getpid()}"
    cmd = (f"{PY} -m babysit up --accelerated --exit-when-idle --registry {workspace / 'babysit.toml'}; "
           "echo EXIT=$?; sleep 60")
    subprocess.run(["tmux", "-L", sock, "new-session", "-d", "-x", "150", "-y", "60", "-c", str(workspace), cmd],
                   check=True, env={**os.environ, "TERM": "xterm-256color"})
    try:
        def screen() -> list[str]:
            out = subprocess.run(["tmux", "-L", sock, "capture-pane", "-p"], capture_output=True, text=True)
            return out.stdout.splitlines()

        lines: list[str] = wait_for("the daemon to finish",
                                    lambda: (s := screen()) and any("EXIT=" in x for x in s) and s, 60)
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True)
    assert "EXIT=0" in "\n".join(lines)
    headers = [i for i, x in enumerate(lines) if x.split()[:3] == ["RUN", "STATE", "ATTEMPT"]]
    assert len(headers) == 1, "one table on the screen: every redraw replaced the last\n" + "\n".join(lines)
    crash = [i for i, x in enumerate(lines) if "boom attempt 1 ended: crashed" in x]
    launch = next((i for i, x in enumerate(lines) if "steady — attempt 1/3 launched" in x), None)
    assert len(crash) == 1 and launch is not None, "the crash is shown once\n" + "\n".join(lines)
    assert crash[0] < headers[0] and launch < headers[0], "\n".join(lines)
    assert not any("[warning" in x and "incident" in x for x in lines), "no raw log line beside the message"
    rows = [x for x in lines[headers[0]:] if x.startswith(("steady", "boom"))]
    assert len(rows) == 2 and re.match(r"steady\s+finished\s+1/3 default\s+120/120", rows[1] if "boom" in rows[0]
                                       else rows[0]), "\n".join(lines)
    assert any(re.match(r"boom\s+failed\s+1/3 default\s+.*ended crashed", r) for r in rows), "\n".join(lines)


def test_each_event_is_shown_once_on_the_terminal_a_crash_and_its_incident_as_one_message(workspace: Path) -> None:
    """Issue 25: beside the rendered crash `babysit up` printed the raw log line (`… [warning ] incident
    attempt=1 incident=crashed …`), and the crash twice (an `ended` post and an `incident` post saying the
    same). One message now says the attempt ended, why, and its stderr; daemon.log still has the event."""
    fake_run(workspace, "boom", steps=0, command=[PY, "-c", "import sys; sys.stderr.write('bad\\n'); sys.exit(3)"])
    term = Terminal([PY, "-m", "babysit", "up", "--accelerated", "--exit-when-idle",
                     "--registry", str(workspace / "babysit.toml")], workspace)
    assert term.wait(timeout=60) == 0, term.text[-3000:]
    text = term.text
    assert text.count("boom attempt 1 ended: crashed — crashed (exit 3): bad") == 1, text[-3000:]
    assert "boom attempt 1: crashed" not in text, "no second post for the same crash"
    assert "[warning" not in text and "incident=crashed" not in text, text[-3000:]
    assert "last stderr lines:" in text
    logged = [json.loads(x) for x in (workspace / ".babysit" / "daemon.log").read_text().splitlines()]
    assert any(e.get("event") == "incident" and e.get("incident") == "crashed" for e in logged), "still logged"
    (incident,) = store_of(workspace).incidents("boom")
    assert incident.kind == "crashed" and incident.attempt == 1


def test_status_watch_on_a_terminal_follows_the_run_and_ctrl_c_ends_it_cleanly(workspace: Path) -> None:
    fake_run(workspace, "watched", steps=100000, sleep=0.05)
    daemon = Daemon(workspace, "--no-view")
    try:
        store = store_of(workspace)
        wait_for("progress", lambda: (store.run_state("watched")[1].get("step") or 0) >= 5, 60)
        term = Terminal([PY, "-m", "babysit", "status", "--watch", "--interval", "0.5",
                         "--registry", str(workspace / "babysit.toml")], workspace)
        term.wait_for("three refreshes", lambda t: len(set(steps_shown(t, "watched", "running", 100000))) >= 3, 30)
        term.ctrl_c()
        assert term.wait(timeout=20) == 0, term.text[-2000:]
        assert "Traceback" not in term.text and "interrupted" not in term.text
        steps = steps_shown(term.text, "watched", "running", 100000)
        assert steps == sorted(steps)
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)


def test_without_a_terminal_watching_prints_a_line_per_change_not_per_refresh(workspace: Path) -> None:
    fake_run(workspace, "piped", steps=60, sleep=0.05)
    daemon = Daemon(workspace, "--exit-when-idle")
    watcher = subprocess.Popen([PY, "-m", "babysit", "status", "--watch", "--interval", "0.25",
                                "--registry", str(workspace / "babysit.toml")], cwd=workspace,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert daemon.wait(timeout=60) == 0
        time.sleep(1.5)  # six more looks at a run that is over: nothing new to say
        watcher.send_signal(signal.SIGINT)
        out, err = watcher.communicate(timeout=20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            watcher.kill()
    assert watcher.returncode == 0, err
    lines = [x for x in out.splitlines() if "piped:" in x]
    assert all(x.startswith("  ·· ") for x in lines) and "\x1b[" not in out, "plain text, no terminal codes"
    running = [int(m) for x in lines for m in re.findall(r"running · attempt 1/3 default · step (\d+)/60", x)]
    assert len(running) >= 2 and running == sorted(set(running)), f"a line when the step moved: {lines}"
    assert sum("finished" in x for x in lines) == 1 and "finished" in lines[-1], lines
    up_out, _ = daemon.output()  # `babysit up` on a pipe prints the same plain lines
    assert re.search(r"·· \d\d:\d\d:\d\d piped: running · attempt 1/3 default · step \d+/60", up_out), up_out


def test_status_tells_step_pace_and_eta_from_the_log_before_the_first_poll(workspace: Path) -> None:
    fake_run(workspace, "nopoll", steps=2000, sleep=0.02)
    daemon = Daemon(workspace)
    try:
        store = store_of(workspace)
        wait_for("progress", lambda: (store.run_state("nopoll")[1].get("step") or 0) >= 40, 60)
        res = babysit("status", "nopoll", "--json", "--registry", str(workspace / "babysit.toml"), cwd=workspace)
        row = json.loads(res.stdout)
        assert row["last_poll_at"] is None and not store.polls("nopoll"), "no poll yet"
        assert row["step"] >= 40
        assert row["seconds_per_step"] == pytest.approx(0.02, rel=0.5), "the pace, from the log's own timestamps"
        assert row["eta_seconds"] == pytest.approx((2000 - row["step"]) * row["seconds_per_step"])
        assert row["target_step"] == 2000, "to the command's --steps (no [prereg] read step)"
        table = babysit("status", "--registry", str(workspace / "babysit.toml"), cwd=workspace).stdout
        line = next(x for x in table.splitlines() if x.startswith("nopoll"))
        assert re.search(r"running\s+1/3 default\s+\d+/2000\s+0\.\d+\s+(\d+m)?\d+s to step 2000", line), table
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
