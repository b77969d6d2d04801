"""A daemon's whole read path under a burst (issue 31): `babysit up --exit-when-idle --accelerated` babysits
a trainer that prints N lines and a final `step N: … val loss X` line, then exits; or writes an N-record
JSONL log at once. Measured on the daemon process itself (its own getrusage, all threads): peak RSS,
CPU seconds, lines per CPU-second; and checked: every line counted (records = lines matched) and the
FINAL verdict reading X, the value of the last line.

  python bench/log_drain.py                        # 2,000,000 printed lines (nanoGPT's), ~1 min here
  python bench/log_drain.py --kind jsonl --lines 10000000   # a 10,000,000-record JSONL log (~700 MB in /tmp)
  python bench/log_drain.py --lines 300000         # quicker

The trainer's stdout goes to a file (the executor's capture), so the trainer is never slowed by the
reading: its own wall time is reported beside the daemon's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit

REPO = Path(__file__).resolve().parents[1]
BASELINE, FINAL = 4.0, 2.3456

STDOUT_TRAINER = r"""
import sys, time
n = int(sys.argv[1]); t0 = time.perf_counter()
w = sys.stdout.write
w("step 0: train loss 4.0000, val loss 4.0000\n")
for i in range(1, n + 1):
    w(f"iter {i}: loss {3 + (i % 1000) / 1000:.4f}, time 1.00ms, mfu 1.20%\n")
w(f"step {n}: train loss 2.5000, val loss 2.3456\n")
sys.stdout.flush()
print(f"trainer seconds {time.perf_counter() - t0:.3f}", file=sys.stderr)
"""

JSONL_TRAINER = r"""
import shutil, sys, time
t0 = time.perf_counter()
shutil.copyfile(sys.argv[1], sys.argv[2])  # the whole log at once: the daemon meets it as one backlog
print(f"trainer seconds {time.perf_counter() - t0:.3f}", file=sys.stderr)
"""

# The daemon, with its own resource usage written at its exit (all its threads; not its children).
WRAPPER = r"""
import json, os, resource, sys
from babysit.cli import main
code = main(sys.argv[1:])
r = resource.getrusage(resource.RUSAGE_SELF)
with open(os.environ["BENCH_RUSAGE"], "w") as f:
    json.dump({"user_s": r.ru_utime, "system_s": r.ru_stime, "max_rss_kib": r.ru_maxrss, "code": code}, f)
sys.exit(code)
"""

PREREG = """
[prereg]
question = "Does val loss fall over the run?"
metric = "val_loss"
baseline_step = 0
read_step = {read_step}
[[prereg.bands]]
label = "IMPROVES"
max = 0.0
[prereg.otherwise]
label = "FLAT-OR-WORSE"
"""


def write_jsonl(path: Path, n: int) -> None:
    """n records (train loss every step, eval_loss at 0 and n), written in 1 MiB blocks."""
    with open(path, "w") as f:
        f.write(f'{{"step":0,"ts":1700000000.0,"val_loss":{BASELINE}}}\n')
        buf = []
        for i in range(1, n + 1):
            buf.append(f'{{"step":{i},"ts":{1700000000 + i * 0.001:.3f},"train_loss":{3 + (i % 1000) / 1000:.4f}}}\n')
            if len(buf) >= 20000:
                f.write("".join(buf))
                buf.clear()
        f.write("".join(buf))
        f.write(f'{{"step":{n},"ts":{1700000000 + n * 0.001 + 1:.3f},"val_loss":{FINAL}}}\n')


def spec_text(kind: str, n: int, work: Path, prereg: bool = True) -> str:
    if kind == "stdout":
        cmd = [sys.executable, "-c", STDOUT_TRAINER, str(n)]
        run_log, source = "", """[source]
kind = "stdout"
[[source.patterns]]
regex = 'iter (?P<step>\\d+): loss (?P<train_loss>[-+.\\w]+), time (?P<ms>[\\d.]+)ms'
[[source.patterns]]
regex = 'step (?P<step>\\d+): train loss [-+.\\w]+, val loss (?P<val_loss>[-+.\\w]+)'
"""
    else:
        src = work / "prebuilt.jsonl"
        write_jsonl(src, n)
        cmd = [sys.executable, "-c", JSONL_TRAINER, str(src), str(work / "out" / "log.jsonl")]
        run_log, source = 'log = "out/log.jsonl"', ""
    return f"""[run]
name = "drain"
command = {json.dumps(cmd)}
total_steps = {n}
{run_log}

[guards]
min_free_host_ram_gib = 0.1
stop_grace_seconds = 10

{source}
{PREREG.format(read_step=n) if prereg else ""}"""


def measure(kind: str, n: int, work: Path, prereg: bool = True) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.environ.get("BENCH_CODE", str(REPO))}  # BENCH_CODE: the code before
    spec = work / "run.toml"
    spec.write_text(spec_text(kind, n, work, prereg))
    (work / "out").mkdir(exist_ok=True)
    reg = work / "babysit.toml"
    res = subprocess.run([sys.executable, "-m", "babysit", "register", str(spec), "--accelerated", "--registry",
                          str(reg)], cwd=work, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    usage = work / "rusage.json"
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", WRAPPER, "up", "--accelerated", "--exit-when-idle", "--no-view",
                           "--gpu-probe", "none", "--registry", str(reg)], cwd=work,
                          env={**env, "BENCH_RUSAGE": str(usage)}, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(usage.read_text())
    sys.path.insert(0, str(REPO))
    from babysit.db.store import Store

    store = Store.in_dir(work / ".babysit")
    try:
        final = store.final_verdict("drain")
        facts = store.run_state("drain")[1]
        (attempt,) = store.attempts("drain")
    finally:
        store.close()
    body = final.body if final else {}
    lines_read = facts["source"]["lines"] if kind == "stdout" else facts["tail"]["records"]
    records = facts["source"]["records"] if kind == "stdout" else facts["tail"]["records"]
    trainer_log = next((p for p in (work / ".babysit" / "runs" / "drain").glob("attempt-*/stderr.log")), None)
    trainer_s = None
    if trainer_log is not None:
        for line in trainer_log.read_text().splitlines():
            if line.startswith("trainer seconds"):
                trainer_s = float(line.split()[-1])
    cpu = r["user_s"] + r["system_s"]
    return {"kind": kind, "lines_written": n + 2, "lines_read": lines_read, "records": records,
            "verdict_status": body.get("status"), "verdict_delta": body.get("delta"),
            "verdict_reads_last_line": (body.get("status") == "FINAL" and body.get("delta") is not None
                                        and abs(body["delta"] - (FINAL - BASELINE)) < 1e-9) if prereg else None,
            "outcome": attempt.outcome, "daemon_wall_s": wall, "daemon_cpu_s": cpu, "user_s": r["user_s"],
            "system_s": r["system_s"], "peak_rss_mb": r["max_rss_kib"] / 1024,
            "lines_per_cpu_s": (n + 2) / cpu if cpu else None, "trainer_s": trainer_s}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=("stdout", "jsonl"), default="stdout")
    p.add_argument("--lines", type=int, default=2_000_000, help="lines (records) before the final one")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the workspace goes (deleted after)")
    p.add_argument("--no-prereg", action="store_true",
                   help="no [prereg]: the reading alone, without the FINAL verdict's chart (matplotlib: ~48 MB)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="babysit-drain-", dir=args.dir))
    try:
        got = measure(args.kind, args.lines, work, prereg=not args.no_prereg)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [[got["kind"], f"{got['lines_written']:,}", f"{got['lines_read']:,}", f"{got['records']:,}",
             "no prereg" if got["verdict_reads_last_line"] is None else
             f"{got['verdict_status']} ({'reads' if got['verdict_reads_last_line'] else 'MISSES'} the last line)",
             f"{got['peak_rss_mb']:.0f} MB", f"{got['daemon_cpu_s']:.1f} s",
             f"{got['lines_per_cpu_s']:,.0f}", f"{got['daemon_wall_s']:.1f} s",
             f"{got['trainer_s']:.2f} s" if got["trainer_s"] is not None else "?"]]
    emit("log drain (daemon, whole read path)", ["source", "lines written", "lines read", "records",
         "verdict", "daemon peak RSS", "daemon CPU", "lines / CPU-s", "daemon wall", "trainer wall"], rows, got,
         args.json, ["the daemon's own getrusage (all its threads, not the trainer's): peak RSS is ru_maxrss"])
    return 0 if got["verdict_reads_last_line"] is not False and got["records"] == got["lines_written"] else 1


if __name__ == "__main__":
    sys.exit(main())
