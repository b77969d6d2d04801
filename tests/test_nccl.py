"""A hung collective explained (babysit/run/nccl.py): a real two-rank gloo job (torchrun, CPU) in which rank 1
skips an all-reduce; every rank's stack is taken with py-spy, then the flight records (torch's own
`_dump_fr_trace`, PyTorch's format, asked for through the dump pipe babysit writes) name rank 1 as the
one that never entered the collective; without records the stacks name it."""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from babysit.core.render import render
from babysit.probes.host import process_tree
from babysit.run import nccl
from babysit.run.stackdump import STOPPED_MARK, stack_dump

HANG = Path(__file__).parent / "fixtures" / "nccl" / "gloo_hang.py"


def test_the_flight_recorder_is_turned_on_unless_the_user_set_it(tmp_path: Path) -> None:
    env = nccl.flight_recorder_env({}, tmp_path)
    assert env == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000",
                   "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                   "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "nccl_trace_rank_"),
                   "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "nccl_pipe_rank_")}
    mine = nccl.flight_recorder_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, tmp_path)
    assert set(mine) == {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"}


def entry(seq: int, op: str = "nccl:all_reduce", sizes=((4,),)) -> dict:
    return {"record_id": seq, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": op, "input_sizes": [list(s) for s in sizes],
            "state": "scheduled", "is_p2p": False, "frames": []}


def record(*entries: dict) -> dict:
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}},
            "pg_status": {}, "entries": list(entries)}


def test_the_rank_behind_never_entered_the_collective_and_mismatches_are_seen() -> None:
    found = nccl.behind({0: record(entry(1), entry(2)), 1: record(entry(1)), 2: record(entry(1), entry(2))})
    assert found["missing"] == {1: {"pg": "0", "last_seq": 1, "waited_seq": 2, "op": "nccl:all_reduce"}}
    assert found["groups"]["0"]["ranks"] == {0: 2, 1: 1, 2: 2}
    mixed = nccl.behind({0: record(entry(1), entry(2)), 1: record(entry(1), entry(2, "nccl:broadcast"))})
    assert mixed["missing"] == {} and mixed["mismatches"] == [
        {"pg": "0", "seq": 2, "ops": {0: "nccl:all_reduce", 1: "nccl:broadcast"}}]


def test_a_record_is_read_as_plain_data_only(tmp_path: Path) -> None:
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(record(entry(1))))
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(record(entry(1), entry(2))))
    (tmp_path / "nccl_trace_rank_2").write_bytes(pickle.dumps(Path("/etc/passwd")))  # a class: refused
    records, bad = nccl.read_records(tmp_path)
    assert sorted(records) == [0, 1] and len(bad) == 1 and "refusing pathlib" in bad[0]


# -- the real job ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_all(proc: subprocess.Popen, pids: frozenset[int]) -> None:
    """torchrun starts each rank in a session of its own: every rank seen is killed, not torchrun's group
    alone (a killpg left the ranks running, a stopped one among them)."""
    for pid in pids | process_tree(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    """The gloo job, hung: rank 0 waits in all-reduce #3 that rank 1 skipped. Yields (attempt dir, pids)."""
    pytest.importorskip("torch.distributed")
    adir = tmp_path_factory.mktemp("attempt")
    log = adir / "train_log.jsonl"
    env = {**os.environ, **nccl.flight_recorder_env({}, adir), "BABYSIT_LOG": str(log), "SKIP_STEP": "3",
           "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    pids: frozenset[int] = frozenset()
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(HANG)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 2):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            time.sleep(0.2)
        assert log.exists(), "the job never logged"
        time.sleep(2.0)  # rank 0 now waits in all-reduce #3
        assert len(log.read_text().splitlines()) == 2
        pids = process_tree(proc.pid)
        yield adir, pids
    finally:
        _kill_all(proc, pids)


def test_a_hung_collective_names_the_rank_that_never_entered_it_from_the_flight_records(hung) -> None:
    adir, pids = hung
    started = time.monotonic()
    stacks = stack_dump(pids)
    hang = nccl.explain_stall(stacks, adir, (), None)
    took = time.monotonic() - started
    assert hang is not None, stacks
    ranks = hang["ranks"]
    assert set(ranks) == {"0", "1"}
    assert ranks["0"]["in_collective"] and ranks["0"]["top"].startswith("all_reduce (")  # py-spy's stack
    assert not ranks["1"]["in_collective"]
    assert hang["source"] == "flight-recorder" and hang["records"] == [0, 1]
    assert hang["missing_ranks"] == [1]
    assert hang["groups"]["0"]["ranks"] == {0: 3, 1: 2}  # rank 0 entered #3, rank 1 stopped at #2
    assert hang["verdict"] == "trainer"
    assert hang["summary"].startswith("rank 1 never entered gloo:all_reduce #3 that the others wait in")
    assert "PyTorch's analyser" in hang["analyser"] or hang["analyser"]  # its text, or why it failed
    assert took < 30  # every rank's stack and the records well inside the 30 s target
    text = render("incident", {"run": "r", "attempt": 1, "incident": "stalled", "message": "no new log record",
                               "detail": {"stacks": stacks, "collective": hang}}).text
    assert "hung collective (flight-recorder): rank 1 never entered" in text


def test_without_flight_records_the_stacks_name_the_rank(hung, tmp_path: Path) -> None:
    _, pids = hung
    hang = nccl.explain_stall(stack_dump(pids), tmp_path, (), None)  # a dir with no records in it
    assert hang is not None and hang["source"] == "stacks"
    assert (hang["waiting_ranks"], hang["missing_ranks"], hang["verdict"]) == ([0], [1], "trainer")
    assert hang["summary"].startswith("rank 0 wait in a collective, rank 1 never entered it (stacks: ")


def test_a_missing_rank_on_a_faulty_gpu_is_the_machines_fault(hung, tmp_path: Path) -> None:
    _, pids = hung
    evidence = [{"gpu": 6, "kind": "xid", "code": 79, "side": "machine"}]
    hang = nccl.explain_stall(stack_dump(pids), tmp_path, (5, 6), evidence)  # LOCAL_RANK 1 runs on GPU 6
    assert hang is not None and hang["ranks"]["1"]["gpu"] == 6
    assert hang["verdict"] == "gpu-fault" and "GPU 6 of rank 1 shows a machine-side fault" in hang["summary"]


def test_no_evidence_is_said(tmp_path: Path) -> None:
    stacks = {"1": "Process 1: python\nThread 1 (active)\n    all_reduce (c10d.py:1)",
              "2": "Process 2: python\nThread 2 (active)\n    all_reduce (c10d.py:1)"}
    fake_env = {1: (0, 0), 2: (1, 1)}
    original = nccl.rank_of
    nccl.rank_of = lambda pid: fake_env.get(pid)  # these pids are no processes of this box
    try:
        hang = nccl.explain_stall(stacks, tmp_path, (), None)
    finally:
        nccl.rank_of = original
    assert hang is not None and hang["verdict"] == "unknown" and hang["summary"].startswith("no evidence")
    assert json.dumps(hang)  # it goes into the incident's JSON


def test_a_sigstopped_rank_has_its_stack_read_and_is_named_as_the_one_the_others_wait_for(tmp_path: Path) -> None:
    """SIGSTOP of rank 1 in a two-rank gloo job that never skips a collective: py-spy's suspend fails on a
    stopped process, so its stack is read without suspending it; it answers no dump request, and it may
    have been stopped inside the all-reduce (its stack then looks like rank 0's): its state names it."""
    pytest.importorskip("torch.distributed")
    log = tmp_path / "train_log.jsonl"
    env = {**os.environ, **nccl.flight_recorder_env({}, tmp_path), "BABYSIT_LOG": str(log),
           "SKIP_STEP": str(10**9), "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    pids: frozenset[int] = frozenset()
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(HANG)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 2):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            time.sleep(0.2)
        pids = process_tree(proc.pid)
        (rank1,) = [p for p in pids if (nccl.rank_of(p) or (None,))[0] == 1]
        os.kill(rank1, signal.SIGSTOP)
        time.sleep(1.0)
        stacks = stack_dump(pids)
        hang = nccl.explain_stall(stacks, tmp_path, (0, 1), None, wait_s=30.0)  # ends when rank 0 answers
    finally:
        _kill_all(proc, pids)
    assert stacks[str(rank1)].startswith(STOPPED_MARK) and "main (" in stacks[str(rank1)], stacks
    assert "note" not in stacks, stacks["note"]
    assert hang is not None and set(hang["ranks"]) == {"0", "1"}
    assert hang["ranks"]["1"]["stopped"] and not hang["ranks"]["0"]["stopped"]
    assert (hang["stopped_ranks"], hang["missing_ranks"], hang["verdict"]) == ([1], [1], "stopped")
    assert hang["records"] == [0] and hang["no_record"] == [1], "rank 0 answered the dump pipe; rank 1, stopped, cannot"
    assert hang["summary"].startswith("rank 1 is stopped (process state T: SIGSTOP or a debugger) and the others "
                                      "wait for it"), hang["summary"]
