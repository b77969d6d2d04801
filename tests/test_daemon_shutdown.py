"""The daemon's shutdown never hangs on a job that is still running: a job that schedules or cancels a
timer while the daemon stops (a guard round syncing its jobs, an exit cancelling its run's timers)
finishes, and shutdown returns. Run in a child process: a hung shutdown would hang the interpreter's
exit too (the job threads are not daemon threads)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import os, sys, threading, time
from pathlib import Path
from babysit.service.daemon import Daemon
from babysit.channels.notify import ConsoleChannel
from babysit.probes.gpu import NullGpuProbe

root = Path(sys.argv[1])
d = Daemon(root / "babysit.toml", gpu_probe=NullGpuProbe(), channel=ConsoleChannel(root / ".babysit", None))
d.start()
started, go = threading.Event(), threading.Event()

def job():
    started.set()
    go.wait(10)
    d.ctx.timers.call_at("later", time.time() + 3600, lambda: None)  # scheduled while the daemon stops
    d.ctx.timers.cancel("later")
    print("job done", flush=True)

d.ctx.timers.call_at("probe", time.time(), job)
assert started.wait(10)
stopper = threading.Thread(target=d.shutdown, daemon=True)
stopper.start()
time.sleep(0.5)  # the shutdown is under way while the job still runs
go.set()
stopper.join(20)
print("shutdown hung" if stopper.is_alive() else "shutdown done", flush=True)
os._exit(1 if stopper.is_alive() else 0)
"""


def test_shutdown_waits_for_a_job_that_schedules_a_timer_meanwhile(tmp_path: Path) -> None:
    (tmp_path / "babysit.toml").write_text('[daemon]\nstate_dir = ".babysit"\n')
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    said = [line for line in done.stdout.splitlines() if line in ("job done", "shutdown done", "shutdown hung")]
    assert said == ["job done", "shutdown done"]  # the job finished before the daemon was down
