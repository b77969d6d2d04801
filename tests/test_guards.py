"""Guard decisions as tables: every branch of prelaunch, live and starvation, over plain readings."""

from __future__ import annotations

from dataclasses import replace

import pytest

from babysit.core.fmt import hours
from babysit.core.guards import (
    Action,
    LiveFacts,
    foreign_holders,
    live,
    low_util_flag,
    prelaunch,
    track_sightings,
)
from babysit.core.readings import GpuProcess, GpuReading, GpuView
from babysit.core.spec.run_toml import GuardsSpec

GIB = 2**30
POLICY = GpuProcess(4242, "policy_server", 61 * GIB)
TRAINER = GpuProcess(100, "python -m trainer", 70 * GIB)
HIDDEN = GpuProcess(9999, "? (no such pid here: exited, or another PID namespace)", None, visible=False)
EXITING = GpuProcess(100, "python -m trainer", 70 * GIB, zombie=True)
GONE = GpuProcess(101, "? (no such pid here: exited, or another PID namespace)", 70 * GIB, visible=False)


def gpu(index=0, procs=(), faults=(), known=True, util=97.0) -> GpuReading:
    return GpuReading(index, "NVIDIA H200", f"GPU-{index}", util, 10, 1 * GIB, 141 * GIB, tuple(procs),
                      tuple(faults), processes_known=known)


def view(*gpus: GpuReading) -> GpuView:
    return GpuView(True, None, tuple(gpus))


NO_DRIVER = GpuView(False, "no NVIDIA driver here — install the NVIDIA driver", ())


def kinds(actions) -> list[tuple[str, str]]:
    return [(a.kind, a.incident) for a in actions]


@pytest.mark.parametrize(("guards", "gpus", "v", "expected"), [
    pytest.param(GuardsSpec(), [], NO_DRIVER, [], id="cpu-run-needs-no-gpu"),
    pytest.param(GuardsSpec(), [0], view(gpu(0)), [], id="free-gpu-launches"),
    pytest.param(GuardsSpec(), [0], NO_DRIVER, [("refuse", "gpu-unseen")], id="unavailable-view-refuses"),
    pytest.param(GuardsSpec(), [0, 3], view(gpu(0)), [("refuse", "gpu-unseen")], id="missing-index-refuses"),
    pytest.param(GuardsSpec(), [0], view(gpu(0, [POLICY])), [("refuse", "gpu-held")], id="held-gpu-refuses"),
    pytest.param(GuardsSpec(exclusive_gpu=False), [0], view(gpu(0, [POLICY])), [("warn", "gpu-held")],
                 id="non-exclusive-only-warns"),
    pytest.param(GuardsSpec(), [0], view(gpu(0, faults=["device lost"])), [("refuse", "gpu-fault")],
                 id="faulty-gpu-refuses"),
    pytest.param(GuardsSpec(), [0], view(gpu(0, known=False)), [("refuse", "gpu-unseen")],
                 id="unlistable-processes-refuse-when-exclusive"),
    pytest.param(GuardsSpec(exclusive_gpu=False), [0], view(gpu(0, known=False)), [],
                 id="unlistable-processes-fine-when-shared"),
    pytest.param(GuardsSpec(), [1], view(gpu(0, [POLICY]), gpu(1)), [], id="holder-on-other-gpu-ignored"),
])
def test_prelaunch(guards, gpus, v, expected):
    assert kinds(prelaunch(guards, gpus, v)) == expected


def test_prelaunch_refusal_names_pid_process_and_memory():
    (action,) = prelaunch(GuardsSpec(), [0], view(gpu(0, [POLICY])))
    assert "pid 4242" in action.message and "policy_server" in action.message and "61.00 GiB" in action.message
    assert action.detail["holders"] == [{"gpu": 0, "pid": 4242, "name": "policy_server",
                                         "used_memory_bytes": 61 * GIB}]


def test_prelaunch_unavailable_keeps_the_probe_reason():
    (action,) = prelaunch(GuardsSpec(), [0], NO_DRIVER)
    assert "install the NVIDIA driver" in action.message


def test_prelaunch_ignores_the_runs_exited_attempt_and_zombies():
    """An OOM'd attempt's pid NVML still lists while the retry starts is not a holder."""
    assert prelaunch(GuardsSpec(), [0], view(gpu(0, [GONE])), past_run_pids=frozenset({101})) == ()
    assert prelaunch(GuardsSpec(), [0], view(gpu(0, [EXITING]))) == ()


def test_prelaunch_invisible_pid_explains_the_namespace():
    (action,) = prelaunch(GuardsSpec(), [0], view(gpu(0, [HIDDEN])))
    assert "--pid=host" in action.message


@pytest.mark.parametrize(("run_pids", "gpus", "expected_pids"), [
    (frozenset({100}), [0], [4242]),
    (frozenset({100, 4242}), [0], []),
    (frozenset(), [0], [100, 4242]),
    (frozenset(), [5], []),
])
def test_foreign_holders(run_pids, gpus, expected_pids):
    v = view(gpu(0, [TRAINER, POLICY]))
    assert [h.pid for h in foreign_holders(v, gpus, run_pids)] == expected_pids


def test_foreign_holders_of_an_unavailable_view_is_empty_not_an_error():
    assert foreign_holders(NO_DRIVER, [0], frozenset()) == ()


def facts(**changes) -> LiveFacts:
    base = dict(gpus=(0,), view=view(gpu(0, [TRAINER])), run_pids=frozenset({100}), gpu_hours_used=1.0,
                gpu_hours_projected_at_end=5.0, seconds_since_last_record=30.0, process_alive=True,
                available_ram_bytes=64 * GIB, already_warned=frozenset(),
                sightings={(0, 4242): 2, (0, 9999): 3})
    base.update(changes)
    return LiveFacts(**base)


G = GuardsSpec(gpu_hours_cap=12.0, min_free_host_ram_gib=8, stall_minutes=20)


@pytest.mark.parametrize(("guards", "f", "expected"), [
    pytest.param(G, facts(), [], id="healthy-run-no-action"),
    pytest.param(G, facts(view=view(gpu(0, [TRAINER, POLICY]))), [("stop", "gpu-held")], id="foreign-process-stops"),
    pytest.param(GuardsSpec(exclusive_gpu=False), facts(view=view(gpu(0, [TRAINER, POLICY]))),
                 [("warn", "gpu-held")], id="foreign-process-warns-when-shared"),
    pytest.param(G, facts(view=view(gpu(0, [TRAINER]))), [], id="own-process-is-not-foreign"),
    pytest.param(G, facts(view=view(gpu(0, [TRAINER, POLICY])), sightings={(0, 4242): 1}),
                 [("confirm", "gpu-held")], id="first-sighting-is-read-again-not-acted-on"),
    pytest.param(G, facts(view=view(gpu(0, [EXITING])), run_pids=frozenset()), [],
                 id="exiting-zombie-trainer-is-not-foreign"),
    pytest.param(G, facts(view=view(gpu(0, [GONE])), run_pids=frozenset(), past_run_pids=frozenset({101}),
                          sightings={(0, 101): 5}), [], id="a-pid-that-was-the-runs-is-never-foreign"),
    pytest.param(G, facts(view=view(gpu(0, [HIDDEN])), sightings={(0, 9999): 2}), [("confirm", "gpu-held")],
                 id="gone-pid-needs-a-third-read"),
    pytest.param(G, facts(view=view(gpu(0, [HIDDEN]))), [("stop", "gpu-held")],
                 id="invisible-pid-that-stays-stops"),
    pytest.param(G, facts(view=view(gpu(0, faults=["device lost"]))), [("stop", "gpu-fault")], id="lost-device-stops"),
    pytest.param(G, facts(view=view(gpu(0, faults=["xid 79"]))), [("stop", "gpu-fault")], id="machine-xid-stops"),
    pytest.param(G, facts(view=view(gpu(0, faults=["xid 63"]))), [("incident", "gpu-fault")],
                 id="machine-xid-without-stop-is-incident"),
    pytest.param(G, facts(view=view(gpu(0, faults=["xid 31"]))), [("incident", "gpu-app-error")],
                 id="trainer-xid-blames-the-trainer"),
    pytest.param(G, facts(view=view(gpu(1))), [("warn", "gpu-unseen")], id="gpu-vanished-warns"),
    pytest.param(G, facts(view=NO_DRIVER), [("warn", "gpu-unseen")], id="blind-guard-warns-never-silent"),
    pytest.param(G, facts(view=view(gpu(0, known=False))), [("warn", "gpu-unseen")], id="unlistable-warns"),
    pytest.param(G, facts(view=None), [], id="gpu-not-read-this-check"),
    pytest.param(G, facts(gpus=(), view=NO_DRIVER), [], id="cpu-run-no-gpu-checks"),
    pytest.param(G, facts(gpu_hours_used=12.0), [("stop", "gpu-hours-cap")], id="cap-reached-stops"),
    pytest.param(G, facts(gpu_hours_used=13.0, gpu_hours_projected_at_end=20.0), [("stop", "gpu-hours-cap")],
                 id="cap-stop-supersedes-warnings"),
    pytest.param(G, facts(gpu_hours_used=9.6), [("warn", "gpu-hours-cap")], id="eighty-percent-warns"),
    pytest.param(G, facts(gpu_hours_used=9.5), [], id="under-eighty-percent-quiet"),
    pytest.param(G, facts(gpu_hours_projected_at_end=12.5), [("warn", "gpu-hours-cap")], id="projection-warns"),
    pytest.param(G, facts(gpu_hours_projected_at_end=None), [], id="no-projection-yet"),
    pytest.param(GuardsSpec(gpu_hours_cap=None), facts(gpu_hours_used=1e6), [], id="no-cap-no-hours-check"),
    pytest.param(G, facts(seconds_since_last_record=1200.0), [("stop", "stalled")], id="stall-stops"),
    pytest.param(G, facts(seconds_since_last_record=1199.0), [], id="just-under-stall"),
    pytest.param(G, facts(seconds_since_last_record=5000.0, process_alive=False), [], id="dead-process-not-stalled"),
    pytest.param(G, facts(seconds_since_last_record=None), [], id="unknown-age-no-stall"),
    pytest.param(G, facts(available_ram_bytes=7 * GIB), [("incident", "host-memory-pressure")], id="low-ram"),
    pytest.param(G, facts(available_ram_bytes=None), [], id="ram-not-measured"),
    pytest.param(GuardsSpec(min_free_host_ram_gib=0), facts(available_ram_bytes=0), [], id="ram-floor-off"),
])
def test_live(guards, f, expected):
    assert kinds(live(guards, f)) == expected


@pytest.mark.parametrize(("f", "key"), [
    (facts(gpu_hours_used=9.6), "gpu-hours-80"),
    (facts(gpu_hours_projected_at_end=12.5), "gpu-hours-projection"),
    (facts(available_ram_bytes=GIB), "host-memory-pressure"),
    (facts(view=view(gpu(0, faults=["xid 63"]))), "gpu-fault:0:xid 63"),
    (facts(view=view(gpu(0, faults=["xid 13"]))), "gpu-app-error:0:xid 13"),
    (facts(view=NO_DRIVER), "gpu-unseen"),
])
def test_warnings_are_raised_once_per_attempt(f, key):
    (action,) = live(G, f)
    assert action.key == key
    again = LiveFacts(**{**f.__dict__, "already_warned": frozenset({key})})
    assert live(G, again) == ()


def test_stops_repeat_even_when_warned():
    f = facts(gpu_hours_used=12.0, already_warned=frozenset({"gpu-hours-cap"}))
    assert kinds(live(G, f)) == [("stop", "gpu-hours-cap")]


def test_stops_come_before_warnings():
    f = facts(available_ram_bytes=GIB, seconds_since_last_record=3600.0)
    assert kinds(live(G, f)) == [("stop", "stalled"), ("incident", "host-memory-pressure")]


def test_both_hour_warnings_can_fire_together():
    f = facts(gpu_hours_used=10.0, gpu_hours_projected_at_end=14.0)
    assert [a.key for a in live(G, f)] == ["gpu-hours-80", "gpu-hours-projection"]


def test_live_holder_message_names_the_holder():
    (action,) = live(G, facts(view=view(gpu(0, [TRAINER, POLICY]))))
    assert "pid 4242" in action.message and "policy_server" in action.message
    assert action.detail["run_pids"] == [100]


def test_action_detail_is_frozen_and_key_defaults_to_incident():
    action = Action("warn", "gpu-held", "m", {"a": 1})
    assert action.key == "gpu-held"
    with pytest.raises(TypeError):
        action.detail["a"] = 2  # type: ignore[index]


@pytest.mark.parametrize(("util", "advanced", "threshold", "wait", "expected"), [
    (30.0, True, 50, 0.6, "input-starvation"),  # the trainer says it waits on its input
    (49.9, True, 50, 0.2, "input-starvation"),
    (38.0, True, 50, 0.009, "gpu-util-low"),  # small batches: the trainer waits on data 0.9 %
    (38.0, True, 50, None, "gpu-util-low"),  # no evidence either way: no prescription
    (50.0, True, 50, 0.9, None),
    (97.0, True, 50, 0.9, None),
    (30.0, False, 50, 0.9, None),  # no progress: a stall, not starvation
    (None, True, 50, 0.9, None),  # not measured is no evidence either way
    (0.0, True, 0, 0.9, None),
])
def test_low_util_flag_needs_evidence_for_starvation(util, advanced, threshold, wait, expected):
    assert low_util_flag(util, advanced, threshold, wait) == expected


def test_sightings_count_consecutive_reads_and_reset_when_gone():
    first = track_sightings({}, foreign_holders(view(gpu(0, [POLICY])), [0], frozenset()))
    assert first == {(0, 4242): 1}
    assert track_sightings(first, foreign_holders(view(gpu(0, [POLICY])), [0], frozenset())) == {(0, 4242): 2}
    assert track_sightings(first, ()) == {}


@pytest.mark.parametrize(("x", "text"), [(0.006, "0.006"), (0.0123, "0.012"), (0.42, "0.42"), (3.14159, "3.14"),
                                         (12.0, "12.0"), (0, "0")])
def test_hours_keep_enough_digits_to_compare_with_the_cap(x, text):
    assert hours(x) == text


def test_cap_stop_says_what_it_does_once():
    small = GuardsSpec(gpu_hours_cap=0.006)
    (stop,) = [a for a in live(small, facts(gpu_hours_used=0.0061)) if a.kind == "stop"]
    assert stop.message == "GPU-hours 0.0061 reached the cap 0.006 — stopping the run"


# -- a job across nodes: every node's GPUs judged, the node named ------------------------------------------


def on(node: str, reading: GpuReading) -> GpuReading:
    return replace(reading, node=node)


ACROSS = view(on("n1", gpu(0, [TRAINER])), on("n2", gpu(0, [POLICY])))


def test_a_foreign_holder_on_the_second_node_stops_the_run_naming_that_node():
    """GPU 0 of each node is the run's GPU 0: the holder on n2's is seen, counted apart from n1's, and the
    stop says where."""
    first = track_sightings({}, foreign_holders(ACROSS, [0], frozenset({100})))
    assert first == {(0, 4242, "n2"): 1}
    assert kinds(live(G, facts(view=ACROSS, sightings=first))) == [("confirm", "gpu-held")]
    (stop,) = live(G, facts(view=ACROSS, sightings=track_sightings(first, foreign_holders(ACROSS, [0],
                                                                                          frozenset({100})))))
    assert (stop.kind, stop.incident) == ("stop", "gpu-held")
    assert stop.message.startswith("GPU 0 on n2: pid 4242 (policy_server") and stop.detail["nodes"] == ["n2"]
    assert stop.detail["holders"][0]["node"] == "n2"


def test_the_same_pid_on_two_nodes_is_two_processes():
    both = view(on("n1", gpu(0, [POLICY])), on("n2", gpu(0, [POLICY])))
    assert track_sightings({(0, 4242, "n1"): 1}, foreign_holders(both, [0], frozenset())) == {
        (0, 4242, "n1"): 2, (0, 4242, "n2"): 1}


def test_a_machine_xid_on_the_second_node_is_the_machines_fault_there():
    """Xid 79 on n2's GPU: a gpu-fault stop whose text, detail and evidence name n2; the same Xid on n1 is
    another GPU (its own key), and a GPU missing on one node is said for that node."""
    faulty = view(on("n1", gpu(0, [TRAINER])), on("n2", gpu(0, faults=["xid 79"])))
    (stop,) = live(G, facts(view=faulty))
    assert (stop.kind, stop.incident) == ("stop", "gpu-fault")
    assert stop.message.startswith("GPU 0 on n2: Xid 79") and "healthy node" in stop.message
    assert stop.detail["node"] == "n2" and stop.detail["evidence"][0]["node"] == "n2"
    assert stop.detail["evidence"][0]["side"] == "machine"
    warned = live(G, facts(view=view(on("n1", gpu(0, faults=["xid 63"])), on("n2", gpu(0, faults=["xid 63"])))))
    assert [a.key for a in warned] == ["gpu-fault:0@n1:xid 63", "gpu-fault:0@n2:xid 63"]
    (gone,) = live(G, facts(view=view(on("n1", gpu(0, [TRAINER])), on("n2", gpu(1)))))
    assert gone.message.startswith("GPU 0 on n2 is no longer visible") and gone.key == "gpu-unseen:0@n2"


def test_a_stop_for_a_machine_fault_on_a_node_classifies_naming_it():
    from babysit.core.classify import ExitFacts, classify_exit

    (stop,) = live(G, facts(view=view(on("n1", gpu(0)), on("n2", gpu(0, faults=["xid 79"])))))
    cls = classify_exit(ExitFacts(exit_code=143, signal=None, stderr_tail="", last_records=[], stop_requested=True,
                                  stop_reason="gpu-fault", gpu_evidence=list(stop.detail["evidence"])))
    assert cls.outcome == "gpu-fault" and cls.detail["fault_nodes"] == ["n2"]
    assert "the machine's fault, on n2" in cls.summary
