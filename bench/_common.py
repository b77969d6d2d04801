"""Shared helpers of the babysit benchmarks: the machine in words, timing, /proc readings, workspaces,
process cleanup, and the one output format (a markdown row on stdout, JSON with --json PATH).

Every figure a bench prints is paired with the naive way measured in the same run, because the
machines these run on are shared and noisy: a ratio survives noise that an absolute number does not.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# -- the machine ------------------------------------------------------------------------------------

def machine() -> str:
    """e.g. "AMD EPYC 7B13, 2 cores, 24 GiB, no GPU (no NVML: ...)" — what the figures were taken on."""
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = os.sysconf("SC_PHYS_PAGES") * PAGE / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {ram:.0f} GiB, {gpu_name() or 'no GPU'}; python {platform.python_version()}"


def gpu_name() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) if n else None
            driver = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
    if name is None:
        return None
    text = name.decode() if isinstance(name, bytes) else str(name)
    drv = driver.decode() if isinstance(driver, bytes) else str(driver)
    return f"{n}x {text} (driver {drv})"


def nvml_or_reason() -> tuple[Any, str | None]:
    """(pynvml, None) when NVML works here, else (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "not measured (no NVML: nvidia-ml-py is not installed)"
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return None, "not measured (no NVML: no GPU)"
    except pynvml.NVMLError as exc:
        return None, f"not measured (no NVML: {exc})"
    return pynvml, None


def today() -> str:
    return dt.date.today().isoformat()


# -- timing -----------------------------------------------------------------------------------------

def time_calls(fn: Callable[[], Any], n: int, *, setup: Callable[[], Any] | None = None) -> list[float]:
    """Seconds of each of n calls of fn (setup, if given, runs before each call, untimed)."""
    out = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(n):
            if setup is not None:
                setup()
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    finally:
        if gc_was:
            gc.enable()
    return out


def summary(samples: Sequence[float]) -> dict[str, float]:
    """Median, p10 and p90 of a list of seconds, in µs."""
    s = sorted(samples)
    if not s:
        return {"n": 0}

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))] * 1e6

    return {"n": len(s), "median_us": statistics.median(s) * 1e6, "p10_us": q(0.10), "p90_us": q(0.90)}


def fmt_us(us: float | None) -> str:
    if us is None:
        return "—"
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} µs"


# -- /proc ------------------------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (not its children), from /proc/PID/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def cpu_seconds_precise(pid: int) -> float:
    """CPU time of every living thread of the process, in ns resolution (/proc/PID/task/*/schedstat).

    /proc/PID/stat counts in clock ticks (10 ms): a daemon that spends 30 ms in a minute reads as 0.00,
    0.01, 0.02 or 0.03 s. schedstat's first field is the thread's time on the CPU in nanoseconds; a
    thread that has ended is not counted (the daemon's threads live as long as it does). Falls back
    to `cpu_seconds` where schedstat is missing.
    """
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
        for tid in tids:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return cpu_seconds(pid)
    return total / 1e9


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


# -- workspaces -------------------------------------------------------------------------------------

def write_registry(root: Path, runs: Iterable[str], *, guard_interval_seconds: float = 30.0) -> Path:
    """babysit.toml naming `<name>.toml` for each run, as `babysit register` would (no prereg)."""
    lines = ["[daemon]", 'state_dir = ".babysit"', f"guard_interval_seconds = {guard_interval_seconds}", ""]
    for name in runs:
        lines += ["[[runs]]", f'name = "{name}"', f'spec = "{name}.toml"',
                  'registered_at = "2025-01-01T00:00:00Z"', ""]
    path = root / "babysit.toml"
    path.write_text("\n".join(lines))
    return path


def write_run(root: Path, name: str, command: Sequence[str], *, log: str | None = None, gpus: str = "[]",
              extra: str = "") -> Path:
    log = log or f"logs/{name}.jsonl"
    path = root / f"{name}.toml"
    path.write_text(f"""[run]
name = "{name}"
command = {json.dumps(list(command))}
log = "{log}"
gpus = {gpus}

[guards]
min_free_host_ram_gib = 0.1
stop_grace_seconds = 5
{extra}
""")
    return path


def write_gpu_file(path: Path, processes: Sequence[dict[str, Any]] = (), *, n: int = 1) -> None:
    """The FileGpuProbe's JSON, written atomically (a reader never sees half a file)."""
    data = {"available": True, "gpus": [
        {"index": i, "name": "Simulated H200", "uuid": f"GPU-sim-{i}", "util_pct": 95, "util_samples": 5,
         "memory_used_bytes": 10 * 2**30, "memory_total_bytes": 141 * 2**30,
         "processes": [p for p in processes if p.get("gpu", 0) == i]} for i in range(n)]}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class Daemon:
    """The real `babysit up` as a subprocess, killed (with its own process group) on stop()."""

    def __init__(self, root: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "babysit", "up", "--registry", str(root / "babysit.toml"), *args],
            cwd=root, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
            stderr=open(root / "daemon.stderr", "ab"),  # noqa: SIM115 - the child owns it
            start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def kill_runs(root: Path) -> int:
    """SIGKILL the process group of every attempt recorded in the workspace's store; how many.

    Raw SQL, not babysit's Store: a store written by the code before (`--before`) is read as it is."""
    import sqlite3

    db = root / ".babysit" / "state.db"
    if not db.exists():
        return 0
    con = sqlite3.connect(db, timeout=30)
    try:
        pids = [pid for (pid,) in con.execute("SELECT pid FROM attempts WHERE pid IS NOT NULL")]
    finally:
        con.close()
    killed = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
            killed += 1
    return killed


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


# -- the code before ---------------------------------------------------------------------------------

def run_before(before: str, script: str, argv: Sequence[str]) -> list[dict[str, Any]]:
    """Run BEFORE/bench/SCRIPT — an export of the code before a change (bench/export_before.sh) — with
    BEFORE first on PYTHONPATH, so its daemon, shims and benches are that code; its JSON `results`
    (or the whole JSON as one result), each tagged `code: before`."""
    import tempfile

    before = str(Path(before).resolve())  # it runs in BEFORE: a relative path would name BEFORE/BEFORE
    out = Path(tempfile.mkdtemp(prefix="babysit-before-")) / "before.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (before, os.environ.get("PYTHONPATH")) if x)}
    subprocess.run([sys.executable, str(Path(before) / "bench" / script), *argv, "--json", str(out)], env=env,
                   check=True, stdout=subprocess.DEVNULL, cwd=before)
    data = json.loads(out.read_text())
    return [{**r, "code": "before"} for r in data.get("results", [data])]


# -- output -----------------------------------------------------------------------------------------

def emit(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]], data: dict[str, Any],
         json_path: str | None, notes: Sequence[str] = ()) -> None:
    """Print a markdown table (header + rows) and the notes; write `data` as JSON to json_path."""
    print(f"\n### {title}\n")
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join(" --- " for _ in headers) + "|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    for note in notes:
        print(f"\n- {note}")
    data = {"bench": title, "date": today(), "machine": machine(), "argv": sys.argv, **data}
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(data, indent=2, default=str) + "\n")
        print(f"\n(JSON: {json_path})")


def log_line(step: int, ts: float, *, eval_every: int = 0) -> bytes:
    """One realistic train-log record (a train record; an eval record every `eval_every` steps)."""
    rec: dict[str, Any] = {"step": step, "ts": round(ts, 3), "train_loss": round(2.5 / (1 + step / 1000), 6),
                           "lr": 3e-4, "grad_norm": 0.8731, "tokens_per_s": 412345.6}
    if eval_every and step % eval_every == 0:
        rec = {"step": step, "ts": round(ts, 3), "eval_loss": round(2.6 / (1 + step / 1000), 6)}
    return (json.dumps(rec, separators=(",", ":")) + "\n").encode()


def write_log(path: Path, records: int, *, eval_every: int = 100, start: int = 0) -> int:
    """Append `records` records to path quickly (1 MiB buffered writes); returns bytes written."""
    t0 = 1.7e9
    total = 0
    buf = bytearray()
    with open(path, "ab") as f:
        for step in range(start, start + records):
            buf += log_line(step, t0 + step * 0.5, eval_every=eval_every)
            if len(buf) > 2**20:
                f.write(buf)
                total += len(buf)
                buf.clear()
        f.write(buf)
        total += len(buf)
    return total


def spawn_tree(children: int) -> subprocess.Popen:
    """A run-like process tree: a python parent (the shim's role) with `children` sleeping children, in a
    session of its own; `end_tree` ends all of it. The children hold none of the bench's output (a pipe
    into `| grep` would wait for them)."""
    code = ("import subprocess,time,sys\n"
            f"ps=[subprocess.Popen(['sleep','600'],stdout=subprocess.DEVNULL) for _ in range({children})]\n"
            "print('up',flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    proc.stdout.readline()
    return proc


def end_tree(tree: subprocess.Popen) -> None:
    """The whole tree of `spawn_tree` killed (its session), not only its root, and the root reaped."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(tree.pid, signal.SIGKILL)
    tree.wait()


def code_args(p: Any) -> None:
    """The flags of a bench that measures this code and, with --before DIR, DIR's in a child of itself
    (bench/gpu_read_parts.py, bench/poll_snapshot.py): --before, --stand-in, the child's --code, --json."""
    p.add_argument("--before", metavar="DIR", help="also time the code in DIR (bench/export_before.sh), in a child")
    p.add_argument("--stand-in", action="store_true", help="the tests' NVML stand-in even where NVML works")
    p.add_argument("--code", metavar="DIR", help=argparse.SUPPRESS)  # the child's: DIR's babysit is measured
    p.add_argument("--json", metavar="PATH")


def measured_code(args: Any) -> str | None:
    """The code a `code_args` bench measures first on sys.path (the child's DIR, else this tree; the tests'
    NVML stand-in is always this tree's), and whether NVML is there: None, or why the stand-in is read
    (`args.stand_in` set then)."""
    if args.code:
        sys.path.insert(0, args.code)
        sys.path.append(str(REPO))
    else:
        sys.path.insert(0, str(REPO))
    nv, why = (None, "the stand-in was asked for") if args.stand_in else nvml_or_reason()
    if nv is None:
        args.stand_in = True
    return why if args.stand_in else None


def naive_parse(path: Path) -> int:
    """What a shell-script babysitter does each poll: read the whole log and json-parse every line."""
    import json

    n = 0
    with open(path, "rb") as f:
        for line in f:
            try:
                json.loads(line)
                n += 1
            except ValueError:
                pass
    return n
