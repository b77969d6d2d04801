"""Runs that span nodes, on the CI's 6-node Slurm (`.ci/slurm-up.sh`: n1-n6 on one host).

The reference trainer's DDP (gloo on CPU) runs across 2 nodes under srun + torchrun, babysat by the real
daemon from register to its FINAL verdict. One rank a node, one thread a rank: the box's cores are shared.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.slurm.conftest import REPO, Bench, slurm_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PREREG = {"metric": "eval_chunk_mae", "baseline_step": 10, "read_step": 30,
          "bands": [{"label": "LEARNS", "max": 0.0}], "otherwise": {"label": "FLAT"}}


def trainer_run(bench: Bench, tmp_path: Path, name: str, steps: int, *extra: str, env: dict | None = None,
                **tables: dict) -> Path:
    """A 2-node run of the reference trainer (tiny recipe), evaluating every 10 steps, saving every 10."""
    command = [sys.executable, "-m", "trainer", "--recipe", "tiny", "--steps", str(steps), "--eval-every", "10",
               "--save-every", "10", "--log", f"outputs/{name}/train_log.jsonl",
               "--checkpoints", f"outputs/{name}/ckpt", *extra]
    env = {"BABYSIT_TRAINER_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "BABYSIT_RDZV_PORT": str(29500 + secrets.randbelow(2000)), **(env or {})}
    # pinned to n1 and n2 (queued while another test holds them): the tests name the nodes
    tables.setdefault("slurm", {"nodes": 2, "time_limit": "00:05:00", "sbatch_options": ["--nodelist=n[1-2]"]})
    tables.setdefault("guards", {"exclusive_gpu": False, "stall_minutes": 90})  # torch + gloo start slowly on busy cores
    return bench.run_toml(name, command, gpus=[0], env=env, **tables)


def test_a_two_node_ddp_run_reaches_its_final_verdict_with_a_poll_row_per_node_and_its_straggler_named(
        bench: Bench, tmp_path: Path) -> None:
    """One 2-node run serves three checks: it reaches its FINAL verdict with a poll row a node; n2's ranks
    sleep 0.3 s before each step (--inject-delay-node n2), so n1 waits for it in every all-reduce and one
    `straggler` incident names n2, however many guard rounds see it; a RAM floor no node meets is an
    incident naming the node with the least free RAM, and the run goes on."""
    name = f"mn-{secrets.token_hex(3)}"
    trainer_run(bench, tmp_path, name, 40, "--inject-step-delay", "0.3", "--inject-delay-node", "n2", prereg=PREREG,
                guards={"exclusive_gpu": False, "stall_minutes": 90, "min_free_host_ram_gib": 100000})
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
    assert [n.node for n in rows] == ["n1", "n2"] and sorted(r for n in rows for r in n.ranks) == [0, 1]
    assert all(n.step and n.available_ram_bytes and n.total_ram_bytes for n in rows), rows
    assert all(n.gpus == 1 and n.gpu_util_pct == 95 for n in rows), rows  # each sidecar's own GPU (simulated)
    posted = [json.loads(line) for line in (bench.state_dir / "channel.jsonl").read_text().splitlines()]
    text = "\n".join(m.get("text", "") for m in posted if m.get("kind") == "poll")
    for row in rows:  # which rank lands on which node is torchrun's rendezvous's choice
        assert f"node {row.node} (rank {row.ranks[0]}): step " in text, text[-2000:]
    assert "s/step · GPU util 95 % · free RAM " in text, text[-2000:]

    said = [i for i in store.incidents(name) if i.kind == "straggler"]
    assert len(said) == 1, said
    incidents = [m["text"] for m in posted if m.get("kind") == "incident" and "straggler" in m.get("text", "")]
    assert len(incidents) == 1 and "straggler: node n2 takes " in incidents[0], incidents
    # the RAM floor (set past any node's RAM) reads the nodes' sidecars: the lowest node is named
    pressure = [i for i in store.incidents(name) if i.kind == "host-memory-pressure"]
    assert pressure and pressure[0].body.get("node") in ("n1", "n2"), [i.body for i in pressure]


def records(tmp_path: Path, name: str) -> list[dict]:
    path = tmp_path / "outputs" / name / "train_log.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def slurmd_pid(node: str) -> int:
    return int(Path(f"/run/slurm/slurmd-{node}.pid").read_text())


def restart_slurmd(node: str) -> None:
    """Bring a node whose slurmd a test killed back (ReturnToService=2: it is idle once it registers; its
    orphaned job steps are killed when it does)."""
    pidfile = Path(f"/run/slurm/slurmd-{node}.pid")
    alive = pidfile.exists() and Path(f"/proc/{pidfile.read_text().strip()}").exists()
    if not alive:
        subprocess.run(["slurmd", "-N", node], check=True, timeout=30,
                       env={**os.environ, "PATH": os.environ["PATH"] + ":/usr/sbin:/sbin"})
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True).stdout.strip()
        if state == "idle":
            return
        if state.startswith(("down", "drain")):
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True)
        time.sleep(1)


def test_a_lost_node_is_the_machines_fault_and_the_run_resumes_without_it(bench: Bench, tmp_path: Path) -> None:
    """The job's second node's slurmd killed mid-run (n5, in the "faults" partition no other test uses):
    Slurm ends the job NODE_FAIL; babysit calls it the machine's fault (never the trainer's), resubmits
    once with --exclude=n5 from the latest checkpoint, and the run completes on n4 and n6. n5 is
    quarantined for every later run until `babysit node release n5`. The first attempt steps slowly (it
    must outlive Slurm's 10 s to call n5 lost), the second at full speed."""
    name = f"lost-{secrets.token_hex(3)}"
    trainer_run(bench, tmp_path, name, 120,  # on n4-n6: no other test's nodes
                attempts=[{"profile": "slow", "args": ["--inject-step-delay", "0.5"]}, {"profile": "fast"}],
                retry={"max_attempts": 1, "on": ["node-lost"], "resume": "latest-checkpoint"},
                slurm={"nodes": 2, "partition": "faults", "time_limit": "00:05:00"})
    daemon = bench.start_up()
    try:
        bench.until("step 15 (a checkpoint at step 10)",
                    lambda: any(r.get("step", 0) >= 15 and "train_loss" in r for r in records(tmp_path, name)),
                    timeout=150)
        first = bench.store().attempts(name)[0]
        assert slurm_job(first.job_id or "").get("NodeList") == "n[4-5]"
        os.kill(slurmd_pid("n5"), signal.SIGKILL)
        assert daemon.wait(timeout=300) == 0, bench.daemon_logs()[-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        restart_slurmd("n5")
    attempts = bench.store().attempts(name)
    assert [a.outcome for a in attempts] == ["node-lost", "completed"], [(a.outcome, a.detail) for a in attempts]
    lost, again = attempts
    assert lost.detail.get("state") == "NODE_FAIL" and lost.detail.get("lost_nodes") == ["n5"], lost.detail
    assert lost.detail["summary"].startswith("node lost, the machine's fault: Slurm lost n5")
    assert "--exclude=n5" in (Path(again.attempt_dir) / "job.sbatch").read_text()
    assert slurm_job(again.job_id or "").get("NodeList") == "n[4,6]"
    assert list(again.argv[-2:]) == ["--resume", "latest"]
    starts = [r for r in records(tmp_path, name) if r.get("event") == "start"]
    assert len(starts) == 2, starts
    assert starts[1]["config"]["resumed_from_step"] >= 10 and starts[1]["config"]["world_size"] == 2, starts
    assert records(tmp_path, name)[-1].get("event") == "completed"
    assert bench.store().run_state(name)[0] == "finished"
    kinds = [i.kind for i in bench.store().incidents(name)]
    assert "crashed" not in kinds and "node-quarantined" in kinds, kinds
    listed = bench.babysit("node", "list").stdout  # every later run of this registry is kept off n5
    assert listed.startswith("n5: quarantined ") and f"of run {name}" in listed, listed


def test_a_stopped_rank_on_node_2_gives_every_ranks_stack_from_every_node_and_is_named(bench: Bench,
                                                                                       tmp_path: Path) -> None:
    """Rank 1 (on n2) SIGSTOPped mid-run: rank 0 waits in the all-reduce, no record comes, the stall guard
    fires; before anything is killed babysit dumps both ranks' Python stacks from both nodes (py-spy
    through `srun --overlap`) and names the stopped rank and its node. The run keeps its flight records
    where TORCH_NCCL_DEBUG_INFO_TEMP_FILE says (gloo writes none: each rank's file is put there as an NCCL
    rank's dump would be); each node gathers its ranks' into the attempt's stacks/ folder."""
    name = f"hang-{secrets.token_hex(3)}"
    local = tmp_path / "node-local"  # one host here; on a cluster, each node's own disk
    local.mkdir()
    trainer_run(bench, tmp_path, name, 400, "--inject-step-delay", "0.1",
                env={"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{local}/nccl_trace_rank_"},
                guards={"exclusive_gpu": False, "stall_minutes": 25, "stop_grace_seconds": 5})
    daemon = bench.start_up()
    rank_log = Path()
    try:
        bench.until("step 5", lambda: any(r.get("step", 0) >= 5 and "train_loss" in r
                                          for r in records(tmp_path, name)), timeout=150)
        attempt = bench.store().attempts(name)[0]
        # the rank on n2 (torchrun's rendezvous decides which rank lands where)
        rank_log = next(p for p in Path(attempt.attempt_dir).glob("rank-*.jsonl")
                        if json.loads(p.read_text().splitlines()[-1])["node"] == "n2")
        beat = json.loads(rank_log.read_text().splitlines()[-1])
        status = bench.until("status naming the nodes", lambda: "RUNNING on n[1-2]" in (
            out := bench.babysit("status").stdout) and out)
        assert f"{name}: Slurm job {attempt.job_id} RUNNING on n[1-2]" in status, status
        for rank in (0, 1):  # PyTorch's format: a pickle of plain data, rank 1 a collective behind
            entries = [{"collective_seq_id": seq, "profiling_name": "nccl:all_reduce", "process_group": ("0", ""),
                        "input_sizes": [[4]], "state": "completed"} for seq in range(1, 8 - rank)]
            (local / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps({"version": "2.4", "entries": entries}))
        os.kill(beat["pid"], signal.SIGSTOP)
        assert daemon.wait(timeout=200) == 0, bench.daemon_logs()[-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        if rank_log.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(json.loads(rank_log.read_text().splitlines()[-1])["pid"], signal.SIGCONT)
    stalled = [i for i in bench.store().incidents(name) if i.kind == "stalled"]
    assert stalled, [i.kind for i in bench.store().incidents(name)]
    body = stalled[0].body
    stacks = body.get("stacks") or body.get("detail", {}).get("stacks")
    assert stacks, body
    keys = sorted(k for k in stacks if " rank " in k)
    other = 1 - beat["rank"]
    assert [k.split(" pid ")[0] for k in keys] == [f"n1 rank {other}", f"n2 rank {beat['rank']}"], stacks.keys()
    assert "train.py" in stacks[keys[0]] and "train.py" in stacks[keys[1]], stacks
    assert stacks[keys[1]].startswith("(process stopped")
    assert stacks["stalled"].startswith(f"rank {beat['rank']} on n2 (pid {beat['pid']})"), stacks["stalled"]
    gathered = Path(attempt.attempt_dir) / "stacks"
    for node, rank in (("n1", other), ("n2", beat["rank"])):
        assert (gathered / f"nccl_trace_rank_{rank}").read_bytes() == (local / f"nccl_trace_rank_{rank}").read_bytes()
        assert (f"{node} rank {rank}: {gathered}/nccl_trace_rank_{rank} (from {node}:{local}/nccl_trace_rank_{rank}"
                in stacks["flight_records"]), stacks["flight_records"]
    last = max(r["ts"] for r in records(tmp_path, name) if "train_loss" in r)
    print(f"stacks taken {stalled[0].at - last:.1f} s after the last record (stall limit 25 s)")


def test_a_time_limited_job_is_warned_checkpointed_and_chained_to_completion(bench: Bench, tmp_path: Path) -> None:
    """A 1-minute job with a 45 s warning: Slurm signals the batch shell (--signal=B:URG@45), the trainer
    checkpoints and exits 10, babysit continues the run in a new job from the checkpoint, and again, until
    the run completes: one run, one history, one verdict. Slurm sends the warning on its own periodic
    check, so its moment varies by tens of seconds: 300 steps of 0.1 s outlast the first link (200
    steps once finished in one job, unwarned)."""
    name = f"tl-{secrets.token_hex(3)}"
    command = [sys.executable, "-m", "trainer", "--recipe", "tiny", "--steps", "300", "--eval-every", "0",
               "--save-every", "0", "--inject-step-delay", "0.1", "--log", f"outputs/{name}/train_log.jsonl",
               "--checkpoints", f"outputs/{name}/ckpt"]
    bench.run_toml(name, command, gpus=[0], env={"BABYSIT_TRAINER_CACHE": str(tmp_path / "cache"),
                                                  "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
                   guards={"exclusive_gpu": False, "stall_minutes": 90},
                   retry={"max_attempts": 1, "resume": "latest-checkpoint"},
                   slurm={"time_limit": "00:01:00", "time_limit_warning_seconds": 45})
    bench.up(timeout=600)
    attempts = bench.store().attempts(name)
    outcomes = [a.outcome for a in attempts]
    assert len(attempts) >= 2 and outcomes[-1] == "completed", [(a.outcome, a.detail) for a in attempts]
    assert set(outcomes[:-1]) == {"time-limit"}, outcomes
    for link in attempts[:-1]:
        assert json.loads((Path(link.attempt_dir) / "timelimit.json").read_text())["signal"] == "TERM"
        assert "--signal=B:URG@45" in (Path(link.attempt_dir) / "job.sbatch").read_text()
    assert all(list(a.argv[-2:]) == ["--resume", "latest"] for a in attempts[1:])
    log = records(tmp_path, name)
    starts = [r["config"]["resumed_from_step"] for r in log if r.get("event") == "start"]
    assert len(starts) == len(attempts) and starts[0] is None, starts
    assert starts[1] > 0 and starts[1:] == sorted(set(starts[1:])), starts  # each link further than the last
    assert log[-1].get("event") == "completed" and log[-1]["step"] == 300
    assert bench.store().run_state(name)[0] == "finished"
