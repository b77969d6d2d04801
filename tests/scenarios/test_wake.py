"""A control request wakes the daemon at once: no tick has to come round to find it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from babysit.runtime import wake
from tests.scenarios.conftest import PY, babysit, store_of, tiny_run
from tests.support import register, wait_for

# A daemon whose tick comes round once an hour: only the wake can make it see the abort in time.
HOURLY_TICK = """
import sys
from pathlib import Path
from babysit.service.daemon import Daemon
from babysit.channels.notify import ConsoleChannel
from babysit.probes.gpu import open_gpu_probe
from babysit.runtime import registry
reg = Path(sys.argv[1])
state = registry.load(reg).state_dir
Daemon(reg, gpu_probe=open_gpu_probe("none"), channel=ConsoleChannel(state, sys.stdout), accelerated=True,
       exit_when_idle=True, tick_seconds=3600).run()
"""


def test_abort_reaches_a_daemon_whose_tick_is_an_hour_away(workspace: Path) -> None:
    spec = tiny_run(workspace, "woken", steps=100_000)
    register(workspace, spec)
    daemon = subprocess.Popen([PY, "-c", HOURLY_TICK, str(workspace / "babysit.toml")], cwd=workspace,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        store = store_of(workspace)
        wait_for("the run to start", lambda: store.run_state("woken")[1].get("step") or (
            store.attempts("woken") and store.attempts("woken")[0].status == "running"), 60)
        assert wake.daemon_pid(workspace / ".babysit") == daemon.pid
        aborted = babysit("abort", "woken", "--registry", str(workspace / "babysit.toml"), cwd=workspace)
        assert aborted.returncode == 0 and "stopping" in aborted.stdout, aborted.stdout + aborted.stderr
        assert daemon.wait(timeout=90) == 0, daemon.stderr.read() if daemon.stderr else ""
    finally:
        if daemon.poll() is None:
            daemon.kill()
    (attempt,) = store.attempts("woken")
    assert attempt.outcome == "stopped"


def test_no_daemon_no_signal(tmp_path: Path) -> None:
    """A stale pid in daemon.lock (no daemon holds the lock) is never signalled."""
    state = tmp_path / ".babysit"
    state.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (state / "daemon.lock").write_text(str(sleeper.pid))
        assert wake.daemon_pid(state) is None and wake.wake(state) is False
        time.sleep(0.2)
        assert sleeper.poll() is None, "the stranger holding a recycled pid was left alone"
    finally:
        sleeper.kill()
