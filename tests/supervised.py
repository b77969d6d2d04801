"""One run under a real `RunSupervisor` in process, its attempt's stdout given: the daemon's read of a run's
log, with the store, the GPU file probe and the supervisor real, and the clock, executor, host and timers
the fakes of tests/fakes.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from babysit.core.spec.run_toml import load_spec
from babysit.db.store import Store
from babysit.probes.gpu import FileGpuProbe
from babysit.run.context import DaemonContext
from babysit.run.supervisor import RunSupervisor
from tests.fakes import FakeClock, FakeExecutor, FakeHostProbe, ManualTimers


@contextmanager
def supervised_run(root: Path, run_toml: str, stdout: str) -> Iterator[tuple[RunSupervisor, FakeClock]]:
    """The run `r` of `run_toml` started under `root`, its first attempt's stdout.log holding `stdout`."""
    (root / "r.toml").write_text(run_toml)
    (root / "gpus.json").write_text('{"gpus": []}')
    clock, host = FakeClock(), FakeHostProbe()
    store = Store.in_dir(root / ".babysit")
    ctx = DaemonContext(store=store, state_dir=root / ".babysit", gpu_probe=FileGpuProbe(root / "gpus.json"),
                        executors={"local": FakeExecutor(clock, host)}, scale=60.0, clock=clock, host_probe=host,
                        timers=ManualTimers(clock))
    try:
        sup = RunSupervisor(ctx, load_spec(root / "r.toml"), None)
        sup.start()
        attempt = root / ".babysit" / "runs" / "r" / "attempt-1"
        attempt.mkdir(parents=True, exist_ok=True)
        (attempt / "stdout.log").write_text(stdout)
        (attempt / "stderr.log").write_text("")
        yield sup, clock
    finally:
        ctx.reads.close()
        store.close()
