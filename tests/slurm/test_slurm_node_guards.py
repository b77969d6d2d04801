"""The GPU guards see every node of a job across nodes, on the CI's Slurm (`.ci/slurm-up.sh`: n1-n6 on one host).

Each node's probe sidecar reads its own simulated GPUs (`BABYSIT_GPU_PROBE=file:…/gpus-{host}.json`: the
sidecar puts its node's name in the path), so node n2 can show what n1 does not. The job is the stand-in
trainer on the first node with a sidecar on both (`torchrun = false`): seconds, no torch.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest

from babysit.executors.slurm_nodes import quarantined
from tests.slurm.conftest import Bench, jobscript, slurm_job

pytestmark = pytest.mark.slurm

CLEAN = {"gpus": [{"index": 0, "name": "Simulated H200", "util_pct": 95, "processes": []}]}


def two_node_run(bench: Bench, tmp_path: Path, name: str, n2_gpus: dict, command: list[str] | None = None) -> None:
    """A run on n1 and n2 whose sidecars read `<name>-n1.json` (a clean GPU) and `<name>-n2.json`."""
    (tmp_path / f"{name}-n1.json").write_text(json.dumps(CLEAN))
    (tmp_path / f"{name}-n2.json").write_text(json.dumps(n2_gpus))
    bench.run_toml(name, command or jobscript("term", str(tmp_path / f"{name}.signals")), gpus=[0],
                   env={"BABYSIT_GPU_PROBE": f"file:{tmp_path}/{name}-{{host}}.json"},
                   guards={"stop_grace_seconds": 20},
                   slurm={"nodes": 2, "torchrun": False, "time_limit": "00:05:00",
                          "sbatch_options": ["--nodelist=n[1-2]"]})


def test_a_foreign_holder_or_a_machine_xid_on_node_2_stops_the_run_naming_n2(bench: Bench, tmp_path: Path) -> None:
    """n2's GPU 0 holds a process that is not the job's: the run stops as on one box (gpu-held, never
    retried) and says "on n2". Another run's n2 GPU reports Xid 79: the machine's fault, on n2, which
    the attempt's evidence and classification carry for the resubmission to leave out. A third run's n2
    GPU reports Xid 79 as its trainer dies (exit 3): the machine's fault too, never the trainer's crash,
    whether a guard saw the Xid first or the exit read it in the sidecars' last records."""
    intruder = subprocess.Popen(["sleep", "300"])  # a real process on the node's host: not the job's
    held, xid, dies = (f"{kind}-{secrets.token_hex(3)}" for kind in ("held", "xid", "dies"))
    try:
        two_node_run(bench, tmp_path, held, {"gpus": [{"index": 0, "util_pct": 90, "processes": [
            {"pid": intruder.pid, "name": "intruder", "used_memory_bytes": 2**30}]}]})
        two_node_run(bench, tmp_path, xid, {"gpus": [{"index": 0, "util_pct": 90, "processes": [],
                                                      "faults": ["xid 79"]}]})
        fallen = tmp_path / "fallen.json"
        fallen.write_text(json.dumps({"gpus": [{"index": 0, "util_pct": 0, "processes": [], "faults": ["xid 79"]}]}))
        two_node_run(bench, tmp_path, dies, CLEAN, ["bash", "-c", f"sleep 3; cp {fallen} {tmp_path}/{dies}-n2.json; "
                                                             "echo 'NCCL error: unhandled system error' >&2; exit 3"])
        bench.up(timeout=240)
    finally:
        intruder.kill()
        intruder.wait()
    store = bench.store()

    (attempt,) = store.attempts(held)
    assert attempt.outcome == "stopped" and attempt.detail.get("stopped_by") == "gpu-held", attempt.detail
    assert slurm_job(attempt.job_id or "").get("NodeList") == "n[1-2]"
    (incident,) = [i for i in store.incidents(held) if i.kind == "gpu-held"]
    assert incident.body["nodes"] == ["n2"] and incident.body["holders"][0]["node"] == "n2", incident.body
    posted = [json.loads(line) for line in (bench.state_dir / "channel.jsonl").read_text().splitlines()]
    said = [m.get("text", "") for m in posted if m.get("kind") == "incident"]
    assert any(f"GPU 0 on n2: pid {intruder.pid} (intruder" in t and "stopping the run" in t for t in said), said

    (attempt,) = store.attempts(xid)
    assert attempt.outcome == "gpu-fault", attempt.detail
    assert attempt.detail["fault_nodes"] == ["n2"] and "the machine's fault, on n2" in attempt.detail["summary"]
    assert [(e["node"], e["xid"], e["side"]) for e in attempt.detail["gpu_evidence"]] == [("n2", 79, "machine")]
    assert any("GPU 0 on n2: Xid 79" in t for t in said), said
    # n2 is quarantined, as a lost node is: every later submission leaves it out (its GPU is not, by UUID)
    assert list(quarantined(bench.state_dir)) == ["n2"], quarantined(bench.state_dir)
    assert "Xid 79" in quarantined(bench.state_dir)["n2"]["reason"]
    kinds = [i.kind for i in store.incidents(xid)]
    assert "node-quarantined" in kinds and "gpu-quarantined" not in kinds, kinds

    (attempt,) = store.attempts(dies)
    assert attempt.outcome == "gpu-fault" and attempt.detail["fault_nodes"] == ["n2"], attempt.detail
    assert [(e["node"], e["xid"]) for e in attempt.detail["gpu_evidence"]] == [("n2", 79)]
    assert "the machine's" in attempt.detail["summary"] and " on n2" in attempt.detail["summary"], attempt.detail
