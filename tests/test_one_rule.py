"""The rules the guards and the poll both apply, each written once (core/guards.py, core/progress.py):
who is a foreign GPU holder, when host RAM is under the floor, and the sentence for a GPU-hours
projection past the cap. For the same readings the guard's action and the poll's flag agree."""

from __future__ import annotations

import pytest

from babysit.core import guards
from babysit.core.readings import GpuProcess, GpuReading, GpuView, HostReading
from babysit.core.render import flag_line
from babysit.core.snapshot import build_snapshot
from babysit.core.spec.run_toml import GuardsSpec

GIB = 2**30
OURS = GpuProcess(100, "python -m trainer", 70 * GIB)
PROCS = [OURS, GpuProcess(4242, "policy_server", GIB), GpuProcess(7, "exited", GIB, zombie=True),
         GpuProcess(300, "our old attempt", GIB)]


def reading(procs) -> GpuView:
    return GpuView(True, None, (GpuReading(0, "H200", "GPU-0", 97.0, 5, GIB, 141 * GIB, tuple(procs), ()),))


def facts(**kw) -> guards.LiveFacts:
    base = dict(gpus=(0,), view=reading([OURS]), run_pids=frozenset({100}), gpu_hours_used=1.0,
                gpu_hours_projected_at_end=None, seconds_since_last_record=1.0, process_alive=True,
                available_ram_bytes=64 * GIB)
    return guards.LiveFacts(**{**base, **kw})


@pytest.mark.parametrize("procs", [PROCS[:1], PROCS[:2], PROCS[:3], PROCS, [PROCS[2], PROCS[3]]])
def test_the_guards_and_the_poll_name_the_same_foreign_holders(procs):
    run_pids, past = frozenset({100}), frozenset({300})
    guard = {h.pid for h in guards.foreign_holders(reading(procs), (0,), run_pids | past)}
    snap = build_snapshot(run="r", attempt=1, at=0.0, kind="periodic", gpus=(0,), view=reading(procs),
                          run_pids=run_pids | past)
    poll = {h.pid for h in snap.gpus[0].held_by_foreign or ()}
    assert guard == poll
    assert ("gpu-held" in snap.flags) == bool(guard)


@pytest.mark.parametrize(("available_gib", "floor_gib"), [(7.99, 8), (8, 8), (64, 8), (0.5, 0), (1, 0.5)])
def test_the_guard_and_the_poll_agree_on_the_ram_floor(available_gib, floor_gib):
    available = int(available_gib * GIB)
    incident = [a for a in guards.live(GuardsSpec(min_free_host_ram_gib=floor_gib), facts(available_ram_bytes=available))
                if a.incident == "host-memory-pressure"]
    snap = build_snapshot(run="r", attempt=1, at=0.0, kind="periodic", min_free_host_ram_gib=floor_gib,
                          host=HostReading(available, 128 * GIB, GIB, 1.0, frozenset({100})))
    assert bool(incident) == ("host-memory-pressure" in snap.flags) == (available < floor_gib * GIB)


def test_a_projection_past_the_cap_is_one_sentence_in_the_guard_and_the_poll():
    (warn,) = [a for a in guards.live(GuardsSpec(gpu_hours_cap=12.0), facts(gpu_hours_projected_at_end=20.0))
               if a.key == "gpu-hours-projection"]
    snap = build_snapshot(run="r", attempt=1, at=0.0, kind="periodic", step=100, seconds_per_step=36.0,
                          end_step=2100, gpu_hours_used=1.0, gpu_hours_cap=12.0, n_gpus=1)
    assert snap.gpu_hours_projected == pytest.approx(21.0)
    sentence = "GPU-hours projected to the end {} exceed the cap 12.0 (used 1.00): the run will be stopped at the cap"
    assert warn.message == sentence.format("20.0")
    assert flag_line("gpu-hours-projection", snap) == "⚠️ " + sentence.format("21.0")
