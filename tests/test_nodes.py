"""core/nodes.py: a job across nodes, one row a node, from the sidecars' records and the ranks' beats."""

from __future__ import annotations

from babysit.core.nodes import NodeRow, node_line, node_rows, stacks_by_rank, straggler
from babysit.core.render import render
from babysit.core.snapshot import Snapshot, build_snapshot

GIB = 2**30


def probe(node: str, free_gib: float) -> dict:
    return {"host": node, "ts": 100.0, "host_mem": {"available_ram_bytes": int(free_gib * GIB),
                                                   "total_ram_bytes": 32 * GIB}}


def beats(node: str, steps: range, every: float, start: float = 0.0) -> list[dict]:
    return [{"node": node, "step": s, "ts": start + i * every} for i, s in enumerate(steps)]


def test_each_node_has_its_own_ranks_step_pace_and_free_ram() -> None:
    rows = node_rows([probe("n2", 3.0), probe("n1", 20.0)],
                     {0: beats("n1", range(1, 11), 0.5), 1: beats("n1", range(1, 11), 0.5),
                      2: beats("n2", range(1, 9), 2.0)}, now=20.0)
    assert [r.node for r in rows] == ["n1", "n2"]
    n1, n2 = rows
    assert (n1.ranks, n1.step, n1.seconds_per_step) == ((0, 1), 10, 0.5)
    assert (n2.ranks, n2.step, n2.seconds_per_step) == ((2,), 8, 2.0)
    assert n2.available_ram_bytes == 3 * GIB and n2.quiet_seconds == 6.0
    assert n1.gpus == 0 and n1.gpu_util_pct is None  # a CPU job's sidecar lists no GPU: its row says none


def test_a_node_row_says_its_own_gpu_util_from_its_sidecar() -> None:
    """Each node's GPUs as its sidecar read them: the mean of those measured, "—" where none was."""
    records = [{**probe("n1", 20.0), "gpu": {"available": True, "gpus": [{"util_pct": 90}, {"util_pct": 96}]}},
               {**probe("n2", 20.0), "gpu": {"available": True, "gpus": [{"util_pct": None}]}}]
    n1, n2 = node_rows(records, {0: beats("n1", range(1, 5), 1.0), 1: beats("n2", range(1, 5), 1.0)}, now=4.0)
    assert (n1.gpus, n1.gpu_util_pct, n2.gpus, n2.gpu_util_pct) == (2, 93.0, 1, None)
    assert node_line(n1) == "node n1 (rank 0): step 4 · 1 s/step · GPU util 93 % · free RAM 20.0 GiB"
    assert node_line(n2) == "node n2 (rank 1): step 4 · 1 s/step · GPU util — · free RAM 20.0 GiB"
    assert NodeRow.from_dict(n1.to_dict()) == n1


def test_a_node_nothing_speaks_for_is_not_measured_never_borrowed() -> None:
    rows = node_rows([probe("n1", 20.0), probe("n2", 20.0)], {0: beats("n1", range(1, 5), 1.0)}, now=5.0)
    assert rows[1] == NodeRow("n2", available_ram_bytes=20 * GIB, total_ram_bytes=32 * GIB)
    assert node_line(rows[1]) == "node n2: step — · — s/step · free RAM 20.0 GiB"
    one_beat = node_rows([], {3: beats("n3", range(7, 8), 1.0)}, now=1.0)
    assert one_beat[0].step == 7 and one_beat[0].seconds_per_step is None  # a pace needs two beats


def test_a_node_slowest_rank_sets_its_step_and_a_quiet_node_says_so() -> None:
    rows = node_rows([], {0: beats("n1", range(1, 21), 0.5), 1: beats("n1", range(1, 13), 0.5)}, now=30.0)
    assert rows[0].step == 12 and rows[0].quiet_seconds == 24.5
    assert node_line(rows[0]) == "node n1 (ranks 0, 1): step 12 · 0.5 s/step · free RAM — · no step for 24s"


def test_a_poll_lists_every_node_and_a_node_under_the_ram_floor_flags_the_run() -> None:
    rows = node_rows([probe("n1", 20.0), probe("n2", 0.5)],
                     {0: beats("n1", range(1, 5), 1.0), 1: beats("n2", range(1, 5), 1.0)}, now=4.0)
    snap = build_snapshot(run="r", attempt=1, at=4.0, kind="periodic", step=4, min_free_host_ram_gib=1.0,
                          nodes=rows)
    assert "host-memory-pressure" in snap.flags
    again = Snapshot.from_dict(snap.to_dict())
    assert again.nodes == rows
    text = render("poll", {"snapshot": snap.to_dict()}).text
    assert "node n1 (rank 0): step 4 · 1 s/step · free RAM 20.0 GiB" in text
    assert "node n2 (rank 1): step 4 · 1 s/step · free RAM 0.5 GiB" in text
    one_box = build_snapshot(run="r", attempt=1, at=4.0, kind="periodic", step=4)
    assert "nodes" not in one_box.to_dict()  # a one-box poll is stored as before


def node_dump(node: str, *procs: tuple[int, int, str]) -> dict:
    return {"node": node, "note": None,
            "procs": [{"pid": pid, "rank": rank, "state": state, "stack": f"Thread {pid}\n  train (train.py:1)"}
                      for pid, rank, state in procs]}


def test_every_ranks_stack_from_every_node_and_the_stopped_rank_named() -> None:
    stacks = stacks_by_rank([node_dump("n2", (20, 1, "T")), node_dump("n1", (10, 0, "S"))], {0: 7, 1: 7})
    assert [k for k in stacks if " rank " in k] == ["n1 rank 0 pid 10", "n2 rank 1 pid 20"]
    assert stacks["stalled"] == "rank 1 on n2 (pid 20): its process is stopped (state T: SIGSTOP or a debugger)"
    assert "note" not in stacks


def test_without_a_stopped_process_the_rank_behind_is_named_and_a_silent_node_noted() -> None:
    stacks = stacks_by_rank([node_dump("n1", (10, 0, "S"), (11, 1, "S")), node_dump("n2", (20, 2, "S")),
                             {"node": "n3", "procs": [], "note": "no rank of job 9 on n3"}], {0: 12, 1: 12, 2: 11})
    assert stacks["stalled"] == "rank 2 on n2 (pid 20): last finished step 11, the others reached 12"
    assert stacks["note"] == "n3: no rank of job 9 on n3"
    level = stacks_by_rank([node_dump("n1", (10, 0, "S")), node_dump("n2", (20, 1, "S"))], {0: 5, 1: 5})
    assert "stalled" not in level  # nothing tells them apart: no rank is named
    assert stacks_by_rank([], {})["note"] == "no stack dump: no rank of the job found on any node"


def test_a_node_slow_to_join_the_all_reduce_is_a_straggler_and_an_even_job_has_none() -> None:
    def rows(ready_n2: float, beats_n: int = 12) -> tuple[NodeRow, ...]:
        def seq(node: str, ready: float) -> list[dict]:
            return [{**b, "ready_s": ready} for b in beats(node, range(1, beats_n + 1), 0.4)]
        return node_rows([], {0: seq("n1", 0.01), 1: seq("n2", ready_n2)}, now=5.0)

    said = straggler(rows(0.3), beats_seen=12)
    assert said is not None and said.startswith("straggler: node n2 takes 0.3 s a step before it joins")
    assert "they wait for it 72% of each 0.4 s step" in said
    assert straggler(rows(0.02), beats_seen=12) is None  # 2x slower, but 2.5% of a step: noise
    assert straggler(rows(0.3), beats_seen=5) is None  # too few steps to say
    assert straggler(rows(0.3)[:1], beats_seen=12) is None  # one node: nobody waits


def test_the_ram_floor_reads_the_lowest_node_and_names_it() -> None:
    from babysit.core.guards import LiveFacts, live
    from babysit.core.nodes import lowest_ram
    from babysit.core.spec.run_toml import GuardsSpec

    rows = node_rows([probe("n1", 20.0), probe("n2", 0.5), probe("n3", 9.0)], {}, now=1.0)
    ram, node = lowest_ram(rows)
    assert (ram, node) == (int(0.5 * GIB), "n2")
    assert lowest_ram(node_rows([], {0: beats("n1", range(1, 3), 1.0)}, now=2.0)) == (None, None)  # not measured
    facts = LiveFacts(gpus=(), view=None, run_pids=frozenset(), gpu_hours_used=0.0, gpu_hours_projected_at_end=None,
                      seconds_since_last_record=1.0, process_alive=True, available_ram_bytes=ram, ram_node=node)
    [action] = [a for a in live(GuardsSpec(min_free_host_ram_gib=1.0), facts) if a.incident == "host-memory-pressure"]
    assert "host RAM available 0.50 GiB on node n2 < 1 GiB floor" in action.message
    assert action.detail["node"] == "n2"


def test_a_one_node_job_keeps_its_row_out_of_the_poll_text() -> None:
    rows = node_rows([probe("n1", 20.0)], {}, now=1.0)
    snap = build_snapshot(run="r", attempt=1, at=1.0, kind="periodic", step=4, nodes=rows)
    assert Snapshot.from_dict(snap.to_dict()).nodes == rows
    assert "node n1" not in render("poll", {"snapshot": snap.to_dict()}).text


def test_the_flight_records_gathered_on_each_node_are_named_in_the_stall() -> None:
    n1 = {**node_dump("n1", (10, 0, "S")), "flight_records": [
        {"rank": 0, "from": "/local/nccl_trace_rank_0", "to": "/att/stacks/nccl_trace_rank_0", "bytes": 812}]}
    n2 = {**node_dump("n2", (20, 1, "T")),
          "flight_missing": ["rank 1: flight recorder on, but no dump at /local/nccl_trace_rank_1 since it started"]}
    stacks = stacks_by_rank([n2, n1], {0: 7, 1: 7})
    assert stacks["flight_records"] == (
        "n1 rank 0: /att/stacks/nccl_trace_rank_0 (from n1:/local/nccl_trace_rank_0, 812 B); "
        "n2 rank 1: flight recorder on, but no dump at /local/nccl_trace_rank_1 since it started")
    text = render("incident", {"run": "r", "attempt": 1, "incident": "stalled", "message": "no record",
                               "detail": {"stacks": stacks}}).text
    assert "py-spy dump of pid n1 rank 0 pid 10 (2 process(es) dumped):" in text  # the words are no dump
    assert "stalled: rank 1 on n2 (pid 20)" in text
    assert "NCCL flight records gathered from the nodes:\n  n1 rank 0: /att/stacks/nccl_trace_rank_0" in text


def test_slurms_node_lists_expand_to_names_and_an_unreadable_one_to_none() -> None:
    from babysit.core.nodes import hostnames

    assert hostnames("n[1-3,5]") == ("n1", "n2", "n3", "n5")
    assert hostnames("gpu[08-10],cpu1") == ("gpu08", "gpu09", "gpu10", "cpu1")
    assert hostnames("node17") == ("node17",) and hostnames(None) == () and hostnames("") == ()
    assert hostnames("rack[1-2]-n[1-2]") == ()  # two brackets in a name: unknown, never a wrong list
