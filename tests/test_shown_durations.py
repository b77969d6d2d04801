"""What a user reads as elapsed time is real time, --accelerated or not: the accelerated clock scales
only the declared minutes of the thresholds (the stall limit, the poll cadence), never a shown duration.

Three seconds after a launch under --accelerated the poll said "(3m00s since launch)"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from babysit.core import guards
from babysit.core.render import render
from babysit.core.spec.run_toml import GuardsSpec, load_spec
from babysit.db.store import Store
from babysit.probes.gpu import FileGpuProbe
from babysit.run.context import DaemonContext
from babysit.run.supervisor import RunSupervisor
from tests.fakes import FakeClock, FakeExecutor, FakeHostProbe, ManualTimers
from tests.support import run_toml

SPEC = run_toml("r", ["python", "train.py", "--steps", "1000"], log="log.jsonl", gpus=[], poll=(1, 1),
                guards={"exclusive_gpu": False, "min_free_host_ram_gib": 1, "stall_minutes": 20})


@pytest.fixture(params=[60.0, 1.0], ids=["real", "accelerated"])
def supervisor(tmp_path: Path, request):
    (tmp_path / "r.toml").write_text(SPEC)
    (tmp_path / "gpus.json").write_text(json.dumps({"gpus": []}))
    clock, host = FakeClock(), FakeHostProbe()
    store = Store.in_dir(tmp_path / ".babysit")
    ctx = DaemonContext(store=store, state_dir=tmp_path / ".babysit", gpu_probe=FileGpuProbe(tmp_path / "gpus.json"),
                        executors={"local": FakeExecutor(clock, host)}, scale=request.param, clock=clock,
                        host_probe=host, timers=ManualTimers(clock))
    yield RunSupervisor(ctx, load_spec(tmp_path / "r.toml"), None), clock, request.param
    store.close()


def test_a_poll_says_the_real_seconds_since_launch_and_the_real_stall_limit(supervisor) -> None:
    sup, clock, minute = supervisor
    sup.start()
    clock.advance(3.0)
    assert sup.polls.now_alone("on-demand")
    (poll,) = sup.ctx.store.polls("r", 1)
    assert poll.snapshot.seconds_since_launch == pytest.approx(3.0)
    assert poll.snapshot.stall_seconds == pytest.approx(20 * minute)
    text = render("poll", {"snapshot": poll.snapshot.to_dict()}).text  # 3 s is under half of 20 declared minutes either way
    assert "waiting for the first record" in text and "(3s since launch; start-up is normal)" in text
    clock.advance(9.0)  # 12 s: past half the accelerated stall limit, nowhere near the real one
    assert sup.polls.now_alone("on-demand")
    text = render("poll", {"snapshot": sup.ctx.store.polls("r", 1)[0].snapshot.to_dict()}).text
    if minute == 1.0:
        assert "no record in" in text and "yet, 12s after launch" in text and "stops the run at 20s" in text
    else:
        assert "(12s since launch; start-up is normal)" in text


def test_the_stall_guard_says_real_time_and_its_declared_limit_under_accelerated() -> None:
    facts = dict(gpus=(), view=None, run_pids=frozenset(), gpu_hours_used=0.0, gpu_hours_projected_at_end=None,
                 process_alive=True, available_ram_bytes=None)
    (stop,) = guards.live(GuardsSpec(stall_minutes=20), guards.LiveFacts(
        **facts, seconds_since_last_record=25.0, minute_seconds=1.0))
    assert stop.incident == "stalled"
    assert "no output for 25s (limit stall_minutes = 20: 20s under --accelerated)" in stop.message
    assert not guards.live(GuardsSpec(stall_minutes=20), guards.LiveFacts(**facts, seconds_since_last_record=25.0))
    (stop,) = guards.live(GuardsSpec(stall_minutes=20), guards.LiveFacts(**facts, seconds_since_last_record=1230.0))
    assert "no output for 20m30s (limit 20 min)" in stop.message
