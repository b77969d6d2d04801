"""Runs that span nodes, on the CI's 3-node Slurm (`.ci/slurm-up.sh`: n1-n3 on one host).

The reference trainer's DDP (gloo on CPU) runs across 2 nodes under srun + torchrun, babysat by the real
daemon from register to its FINAL verdict. One rank a node, one thread a rank: the box's cores are shared.
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import pytest

from tests.slurm.conftest import REPO, Bench, slurm_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PREREG = {"metric": "eval_chunk_mae", "baseline_step": 10, "read_step": 30,
          "bands": [{"label": "LEARNS", "max": 0.0}], "otherwise": {"label": "FLAT"}}


def trainer_run(bench: Bench, tmp_path: Path, name: str, steps: int, **tables: dict) -> Path:
    """A 2-node run of the reference trainer (tiny recipe), evaluating every 10 steps, saving every 10."""
    command = [sys.executable, "-m", "trainer", "--recipe", "tiny", "--steps", str(steps), "--eval-every", "10",
               "--save-every", "10", "--log", f"outputs/{name}/train_log.jsonl",
               "--checkpoints", f"outputs/{name}/ckpt"]
    env = {"BABYSIT_TRAINER_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "BABYSIT_RDZV_PORT": str(29500 + secrets.randbelow(2000))}
    tables.setdefault("slurm", {"nodes": 2, "time_limit": "00:05:00"})
    tables.setdefault("guards", {"exclusive_gpu": False, "stall_minutes": 90})  # torch + gloo start slowly on busy cores
    return bench.run_toml(name, command, gpus=[0], env=env, **tables)


def test_a_two_node_ddp_run_reaches_its_final_verdict_with_a_poll_row_per_node(bench: Bench,
                                                                              tmp_path: Path) -> None:
    name = f"mn-{secrets.token_hex(3)}"
    trainer_run(bench, tmp_path, name, 40, prereg=PREREG)
    bench.up(timeout=240)
    store = bench.store()
    attempts = store.attempts(name)
    assert [a.outcome for a in attempts] == ["completed"], [(a.outcome, a.detail) for a in attempts]
    attempt = attempts[0]
    job = slurm_job(attempt.job_id or "")
    assert job.get("NumNodes") == "2", job
    assert attempt.gpus == 2
    final = store.final_verdict(name)
    assert final is not None and final.body["status"] == "FINAL" and final.body["label"] == "LEARNS", final
    records = [json.loads(x) for x in (tmp_path / "outputs" / name / "train_log.jsonl").read_text().splitlines()]
    assert records[-1].get("event") == "completed" and records[-1]["step"] == 40
    assert [r["step"] for r in records if "train_loss" in r] == sorted({r["step"] for r in records if "train_loss" in r})
    notes = [p.snapshot.note or "" for p in store.polls(name)]
    assert any(n.endswith("RUNNING on n[1-2]") for n in notes), notes
    adir = Path(attempt.attempt_dir)
    assert sorted(p.name for p in adir.glob("probe-*.jsonl")) == ["probe-n1.jsonl", "probe-n2.jsonl"]
    assert sorted(p.name for p in adir.glob("rank-*.jsonl")) == ["rank-0.jsonl", "rank-1.jsonl"]

    # a poll with one row a node: each node's ranks, step, own pace and free RAM, rendered in the message
    polls = [p.snapshot for p in store.polls(name)]
    rows = next((s.nodes for s in polls if len(s.nodes) == 2 and all(n.seconds_per_step for n in s.nodes)), None)
    assert rows is not None, [s.nodes for s in polls]
    assert [(n.node, n.ranks) for n in rows] == [("n1", (0,)), ("n2", (1,))]
    assert all(n.step and n.available_ram_bytes and n.total_ram_bytes for n in rows), rows
    posted = [json.loads(line) for line in (bench.state_dir / "channel.jsonl").read_text().splitlines()]
    text = "\n".join(m.get("text", "") for m in posted if m.get("kind") == "poll")
    assert "node n1 (rank 0): step " in text and "node n2 (rank 1): step " in text, text[-2000:]
