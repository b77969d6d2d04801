"""The stack dump of a stalled run, taken with py-spy before anything is killed: where each of its
processes was stuck, or, when no dump can be taken, why (in words the incident shows)."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
import time
from pathlib import Path


def stack_dump(pids: frozenset[int], timeout_s: float = 20.0) -> dict[str, str]:
    """A stack dump of every process of the run, taken before anything is killed: pid -> py-spy's text.

    py-spy is a dependency, but it can still fail (ptrace denied, a process it cannot read); then
    "note" says why, in words the incident's channel message shows, so nobody goes looking for a dump
    that was never taken. The dumps run side by side under one deadline: the guard waits at most
    `timeout_s`, however many processes the run has.

    A stopped process (SIGSTOP, a debugger's stop: /proc state T or t) is read without suspending it
    (`--nonblocking`): py-spy's suspend fails on it ("Failed to suspend process"), and it is the very
    rank a hung job waits for. Its text then starts with STOPPED_MARK, so the reader knows.
    """
    beside = Path(sysconfig.get_path("scripts")) / "py-spy"  # the daemon's own environment, PATH or not
    exe = str(beside) if beside.is_file() else shutil.which("py-spy")
    if exe is None:
        return {"note": "no stack dump: py-spy is not installed (it is a babysit dependency: reinstall babysit "
                        "with `pip install -e .`)"}
    running: dict[int, subprocess.Popen[str]] = {}
    failed: dict[int, str] = {}
    stopped = {pid for pid in sorted(pids)[:16] if proc_state(pid) in ("T", "t")}
    for pid in sorted(pids)[:16]:
        nonblocking = ["--nonblocking"] if pid in stopped else []
        try:
            running[pid] = subprocess.Popen([exe, "dump", *nonblocking, "--pid", str(pid)],
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            stdin=subprocess.DEVNULL, text=True)
        except OSError as exc:
            failed[pid] = f"py-spy could not start ({exc.strerror or exc})"
    deadline = time.monotonic() + timeout_s
    out: dict[str, str] = {}
    for pid, proc in running.items():
        try:
            stdout, stderr = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failed[pid] = f"py-spy took longer than {timeout_s:g} s"
            continue
        if proc.returncode == 0 and stdout.strip():
            out[str(pid)] = (STOPPED_MARK if pid in stopped else "") + stdout[-8000:]
        else:
            failed[pid] = failure_reason(stderr or stdout)
    if failed:
        reasons: dict[str, list[str]] = {}
        for pid, why in failed.items():
            reasons.setdefault(why, []).append(str(pid))
        said = "; ".join(f"pid {', '.join(p)}: {why}" for why, p in reasons.items())
        out["note"] = ("no stack dump" if not out else "no stack dump for some processes") + f" — {said}"
    elif not out:
        out["note"] = "no stack dump: babysit found no process of the run to dump"
    return out


STOPPED_MARK = "(process stopped: state T, SIGSTOP or a debugger; read without suspending it)\n"


def proc_state(pid: int) -> str | None:
    """The process's state letter from /proc/PID/stat (R, S, D, T, t, Z, …); None when unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat[stat.rfind(")") + 1:].split()  # the command name may hold spaces and parentheses
    return rest[0] if rest else None


def failure_reason(text: str) -> str:
    """py-spy's error in a line that says what to do about it."""
    low = text.lower()
    if "permission denied" in low or "operation not permitted" in low or "ptrace" in low:
        return ("ptrace denied — py-spy needs CAP_SYS_PTRACE or kernel.yama.ptrace_scope = 0 "
                "(containers: --cap-add SYS_PTRACE), or babysit running as the trainer's user")
    if "no such process" in low:
        return "the process exited before py-spy read it"
    if "failed to find python version" in low:
        return "py-spy could not read it as a Python process (not Python, or an interpreter py-spy cannot parse)"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "no output")
    return f"py-spy failed: {first[:160]}"
