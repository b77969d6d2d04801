"""A hung collective through the real daemon: a two-rank gloo job under torchrun in which rank 1 skips an
all-reduce stalls; babysit's stall guard dumps every rank's stack, asks the ranks for their flight records
through the dump pipe it set up at launch, and the stalled incident names rank 1 as the one that never
entered the collective — the trainer's bug, its GPUs (none here) showing no fault."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.scenarios.conftest import PY, Daemon, store_of
from tests.support import TRAIN_LOG, register, run_toml

HANG = Path(__file__).resolve().parents[1] / "fixtures" / "nccl" / "gloo_hang.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_hung_collective_is_stopped_with_every_ranks_stack_and_the_missing_rank_named(workspace: Path) -> None:
    pytest.importorskip("torch.distributed")
    command = [PY, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), str(HANG)]
    register(workspace, run_toml("hang", command, log=TRAIN_LOG, env={"SKIP_STEP": "3", "OMP_NUM_THREADS": "1"},
                                 guards={"stall_minutes": 30, "stop_grace_seconds": 15, "min_free_host_ram_gib": 0}))
    daemon = Daemon(workspace, "--exit-when-idle", "--gpu-probe", "none")
    assert daemon.wait(timeout=360) == 0, daemon.output()
    store = store_of(workspace)
    (attempt,) = store.attempts("hang")
    assert attempt.outcome == "stalled"
    (stalled,) = [i for i in store.incidents("hang") if i.kind == "stalled"]
    dumps = [pid for pid, text in stalled.body["stacks"].items() if pid != "note" and "main (gloo_hang.py" in text]
    assert len(dumps) == 2, stalled.body["stacks"]  # every rank's stack (beside the shim's and torchrun's)
    hang = stalled.body["collective"]
    assert (hang["source"], hang["missing_ranks"], hang["verdict"]) == ("flight-recorder", [1], "trainer"), hang
    assert hang["ranks"]["0"]["in_collective"] and not hang["ranks"]["1"]["in_collective"]
    messages = [json.loads(x) for x in (workspace / ".babysit" / "channel.jsonl").read_text().splitlines()]
    (text,) = [m["text"] for m in messages if m["kind"] == "incident" and ": stalled — " in m["text"]]
    assert "hung collective (flight-recorder): rank 1 never entered gloo:all_reduce #3 that the others wait in" in text
