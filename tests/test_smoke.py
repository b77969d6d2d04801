"""`babysit smoke`: real trainer subprocesses, a real allocator failure, eval blindness, the GPU guard,
bad input, and the daemon's attempt 1 after a smoke on a registered run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from types import MappingProxyType

import psutil
import pytest

from babysit.core import smoke
from babysit.core.reading.log_records import LogRecord
from babysit.core.spec.run_toml import AttemptProfile, load_spec
from babysit.db.store import Store
from babysit.register import smoke_record
from tests.scenarios.conftest import tiny_run
from trainer.recipe import RECIPES_DIR

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
BIG_ALLOC = 12288000000  # 1,000,000 x 3 x 64 x 64 uint8 images: what the oversized profile asks for


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trainer-cache")


def babysit(*args: str, cwd: Path, cache: Path, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    full = {**os.environ, "BABYSIT_TRAINER_CACHE": str(cache), **(env or {})}
    full.pop("BABYSIT_REGISTRY", None)
    return subprocess.run([PY, "-m", "babysit", *args], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=timeout)


def write_run(root: Path, name: str = "smk", *, gpus: str = "[]", smoke_table: str = "",
              attempts: str | None = None, steps: int | None = None) -> Path:
    """A run on the tiny recipe with 64x64x3 images, so one profile can ask for 12 GB in one tensor."""
    tiny = (RECIPES_DIR / "tiny.toml").read_text()
    (root / "big.toml").write_text(tiny.replace("image_size = 12", "image_size = 64").replace("channels = 1",
                                                                                              "channels = 3"))
    if attempts is None:
        attempts = """
[[attempts]]
profile = "micro-1m"
args = ["--micro-batch-size", "1000000"]

[[attempts]]
profile = "batch-8"
args = ["--batch-size", "8"]
"""
    return tiny_run(root, name, recipe="big.toml", gpus=gpus, steps=steps, filename="run.toml",
                    extra="[retry]\nmax_attempts = 2", attempts=attempts + "\n" + smoke_table)


# -- the real thing on CPU ------------------------------------------------------------------------------

def test_oversized_profile_fails_in_the_allocator_and_the_first_fitting_profile_is_selected(tmp_path, cache):
    spec = write_run(tmp_path)
    out = tmp_path / "hw.json"
    res = babysit("smoke", str(spec), "--steps", "3", "--rlimit-as-gib", "3", "--out", str(out),
                  "--smoke-dir", str(tmp_path / "smoke"), "--registry", str(tmp_path / "babysit.toml"),
                  cwd=tmp_path, cache=cache)
    assert res.returncode == 0, res.stdout + res.stderr
    record = json.loads(out.read_text())
    assert smoke_record.validate(record) == []
    big, fits = record["smoke_evidence"]
    assert (big["profile"], big["outcome"], big["exit_code"]) == ("micro-1m", "oom", 12)
    assert big["failed_alloc_bytes"] == BIG_ALLOC  # parsed from the allocator's own message
    assert any("you tried to allocate 12288000000 bytes" in line for line in big["stderr_tail"])
    assert (fits["profile"], fits["outcome"], fits["last_train_step"]) == ("batch-8", "ok", 3)
    assert fits["peak_memory"]["log_peak_rss_gib"] > 0 and fits["peak_memory"]["sampled_rss_peak_bytes"] > 0
    assert fits["median_step_time_s"] > 0
    assert "--eval-every" in fits["argv"] and fits["argv"][-4:] == ["--steps", "3", "--eval-every", "0"]
    assert str(tmp_path / "smoke") in " ".join(fits["argv"])  # its own log, never the run's
    assert not (tmp_path / "outputs").exists()
    chosen = record["selected_full_training_profile"]
    assert (chosen["profile"], chosen["args"], chosen["declared_attempt"]) == ("batch-8", ["--batch-size", "8"], 2)
    assert record["hardware"]["kind"] == "cpu" and record["hardware"]["cpu"]["ram_bytes"] > 0
    assert "attempt 1 uses the smoke-validated profile 'batch-8'; attempt 2 uses 'batch-8'" in record["retry_semantics"]
    assert record["provenance_note"].startswith("No eval result was available when this hardware profile was "
                                                "selected: smoke runs ran with eval off and 0 eval records")
    assert "not registered" in res.stdout


def test_eval_records_in_a_smoke_log_are_counted_dropped_and_noted(tmp_path, cache):
    spec = write_run(tmp_path, attempts='[[attempts]]\nprofile = "batch-8"\nargs = ["--batch-size", "8"]\n',
                     smoke_table='[smoke]\nargs = ["--steps", "{steps}", "--eval-every", "1"]\n')
    res = babysit("smoke", str(spec), "--steps", "3", "--registry", str(tmp_path / "babysit.toml"),
                  cwd=tmp_path, cache=cache)
    assert res.returncode == 0, res.stdout + res.stderr
    record = json.loads((tmp_path / "hardware_profile.json").read_text())  # default --out: next to run.toml
    assert smoke_record.validate(record) == []
    (only,) = record["smoke_evidence"]
    assert only["eval_records_ignored"] == 3
    assert "does NOT turn eval off and 3 eval records found in their logs were ignored" in record["provenance_note"]
    smoke_log = Path(only["smoke_dir"]) / "train_log.jsonl"
    assert sum('"eval_chunk_mae"' in line for line in smoke_log.read_text().splitlines()) == 3
    assert "eval" not in json.dumps(record["selected_full_training_profile"])


def test_drop_eval_is_the_only_door_and_its_output_has_no_place_for_eval_values():
    def rec(step: int, **metrics: float) -> LogRecord:
        return LogRecord(step, 1000.0 + step, MappingProxyType(metrics))

    sentinel = 987654.321
    records = [rec(1, train_loss=1.0, step_time_s=0.2, peak_rss_gib=0.5),
               rec(1, eval_chunk_mae=sentinel, train_chunk_mae=sentinel, **{"eval/reach_v1": sentinel}),
               rec(2, train_loss=0.9, step_time_s=0.4, peak_rss_gib=0.7, max_memory_allocated_gib=3.0),
               LogRecord(3, 1003.0, MappingProxyType({}), fields=MappingProxyType({"eval_note": "x"})),
               rec(3, train_loss=0.8, step_time_s=0.3)]
    kept = smoke.drop_eval(records, garbage_lines=2)
    assert kept.eval_records_dropped == 2 and len(kept.records) == 3
    assert not any(smoke.is_eval_record(r) for r in kept.records)
    evidence = smoke.train_evidence(kept)
    assert evidence == smoke.TrainEvidence(train_records=3, eval_records_dropped=2, garbage_lines=2, last_step=3,
                                           max_memory_allocated_gib=3.0, peak_rss_gib=0.7, median_step_time_s=0.3)
    assert {f.name for f in fields(smoke.TrainEvidence)} == {
        "train_records", "eval_records_dropped", "garbage_lines", "last_step", "max_memory_allocated_gib",
        "peak_rss_gib", "median_step_time_s"}  # a count is the only eval-derived field
    assert str(sentinel) not in repr(evidence)


def test_smoke_killed_at_its_timeout_leaves_no_process_and_is_not_selectable(tmp_path, cache):
    spec = write_run(tmp_path, attempts='[[attempts]]\nprofile = "long"\nargs = ["--batch-size", "8"]\n')
    # 12 s: the trainer must get past importing torch and write its log before the kill, on a loaded CPU too
    res = babysit("smoke", str(spec), "--steps", "1000000", "--timeout-s", "12", "--registry",
                  str(tmp_path / "babysit.toml"), "--smoke-dir", str(tmp_path / "smoke"), cwd=tmp_path, cache=cache)
    assert res.returncode == 1, res.stdout + res.stderr
    record = json.loads((tmp_path / "hardware_profile.json").read_text())
    assert smoke_record.validate(record) == []
    (only,) = record["smoke_evidence"]
    assert only["outcome"] == "timeout" and only["signal"] == 9
    assert record["selected_full_training_profile"] is None
    shim = json.loads((tmp_path / "smoke" / "01-long" / "attempt" / "shim.json").read_text())
    for pid in (shim["pid"], shim.get("child_pid")):
        assert pid is None or not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    logs = list((tmp_path / "smoke" / "01-long").rglob("*.jsonl"))
    assert logs and not any('"event": "stopped"' in p.read_text() for p in logs)  # SIGKILL: no graceful stop


# -- refusals and bad input --------------------------------------------------------------------------

def test_gpu_held_by_a_foreign_process_refuses_the_smoke_with_exit_1(tmp_path, cache):
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"gpus": [{"index": 0, "name": "Simulated H200", "memory_total_bytes": 150 * 2**30,
                                          "memory_used_bytes": 2**30, "processes": [
                                              {"pid": 4242, "name": "policy_server", "used_memory_bytes": 2**30}]}]}))
    spec = write_run(tmp_path, gpus="[0]")
    res = babysit("smoke", str(spec), "--smoke-dir", str(tmp_path / "smoke"), "--registry",
                  str(tmp_path / "babysit.toml"), cwd=tmp_path, cache=cache,
                  env={"BABYSIT_GPU_PROBE": f"file:{gpus}"})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "ERROR: smoke run of profile 'micro-1m' refused: GPU 0: pid 4242 (policy_server, 1.00 GiB)" in res.stderr
    assert not (tmp_path / "hardware_profile.json").exists()
    assert not list((tmp_path / "smoke").glob("*"))  # nothing was started


def test_gpu_run_records_nvml_and_framework_view_of_the_run_gpus(tmp_path, cache):
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"gpus": [{"index": 0, "name": "Simulated H200", "memory_total_bytes": 150 * 2**30,
                                          "memory_used_bytes": 5 * 2**20, "processes": []}]}))
    spec = write_run(tmp_path, gpus="[0]", attempts='[[attempts]]\nprofile = "b8"\nargs = ["--batch-size", "8"]\n')
    res = babysit("smoke", str(spec), "--steps", "2", "--registry", str(tmp_path / "babysit.toml"), cwd=tmp_path,
                  cache=cache, env={"BABYSIT_GPU_PROBE": f"file:{gpus}"})
    assert res.returncode == 0, res.stdout + res.stderr
    record = json.loads((tmp_path / "hardware_profile.json").read_text())
    assert smoke_record.validate(record) == []
    hw = record["hardware"]
    assert hw["kind"] == "gpu" and hw["gpus"][0]["name"] == "Simulated H200"
    assert hw["gpus"][0]["nvml_total_bytes"] == 150 * 2**30
    assert hw["summary"].startswith("GPU 0 Simulated H200 153600 MiB reported total; ")
    # the framework's view comes from a torch subprocess with CUDA_VISIBLE_DEVICES=0; CPU torch here says no CUDA
    assert hw["framework"]["version"] and "is_available() is False" in hw["framework"]["note"]
    assert record["smoke_evidence"][0]["peak_memory"]["nvml_device_peak_bytes"] == 5 * 2**20


@pytest.mark.parametrize("case", ["missing file", "unknown key", "zero steps", "log not in the command"])
def test_bad_input_exits_2(tmp_path, cache, case):
    spec = write_run(tmp_path)
    extra: list[str] = []
    if case == "missing file":
        spec = tmp_path / "nope.toml"
    elif case == "unknown key":
        spec.write_text(spec.read_text() + "\n[smoke]\nstepz = 3\n")
    elif case == "zero steps":
        extra = ["--steps", "0"]
    else:
        text = spec.read_text()
        assert '"--log", "outputs/smk/train_log.jsonl", ' in text
        spec.write_text(text.replace('"--log", "outputs/smk/train_log.jsonl", ', ""))
    res = babysit("smoke", str(spec), *extra, "--registry", str(tmp_path / "babysit.toml"), cwd=tmp_path,
                  cache=cache)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith("ERROR: ") and "Traceback" not in res.stderr
    assert not (tmp_path / "hardware_profile.json").exists()


# -- the daemon uses the selection -------------------------------------------------------------------

def test_after_a_smoke_on_a_registered_run_the_daemon_launches_attempt_1_with_the_selected_profile(tmp_path, cache):
    spec = write_run(tmp_path, steps=5)
    reg = str(tmp_path / "babysit.toml")
    assert babysit("register", str(spec), "--accelerated", "--registry", reg, cwd=tmp_path, cache=cache).returncode == 0
    res = babysit("smoke", str(spec), "--steps", "3", "--rlimit-as-gib", "3", "--registry", reg, cwd=tmp_path,
                  cache=cache)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "attempt 1 of 'smk' will use profile 'batch-8'" in res.stdout
    status = json.loads(babysit("status", "smk", "--json", "--registry", reg, cwd=tmp_path, cache=cache).stdout)
    assert status["hardware_profile"]["profile"] == "batch-8"
    measured_at = json.loads((tmp_path / "hardware_profile.json").read_text())["measured_at"]

    up = babysit("up", "--accelerated", "--exit-when-idle", "--registry", reg, cwd=tmp_path, cache=cache,
                 timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    store = Store.in_dir(tmp_path / ".babysit")
    try:
        first = store.attempt("smk", 1)
        launch = next(m for m in store.messages("smk") if m.kind == "launch")
    finally:
        store.close()
    assert first.profile == "batch-8" and first.outcome == "completed"
    assert list(first.argv[-2:]) == ["--batch-size", "8"] and "1000000" not in first.argv
    assert launch.payload["selected_by"] == f"smoke run {measured_at} (hardware_profile.json)"
    assert (tmp_path / "outputs" / "smk" / "train_log.jsonl").exists()  # the real run wrote the real log


# -- pure pieces -------------------------------------------------------------------------------------

def test_selection_applies_to_attempt_1_only_and_only_to_an_unedited_declared_profile(tmp_path):
    spec = load_spec(write_run(tmp_path))
    facts = {"hardware_profile": {"profile": "batch-8", "args": ["--batch-size", "8"], "path": "/x/hw.json",
                                  "measured_at": "2026-01-01T00:00:00Z"}}
    assert smoke.selected_profile(spec, facts) == AttemptProfile("batch-8", ("--batch-size", "8"))
    one, by = smoke.attempt_spec(spec, 1, facts)
    assert one.profile_for(1).profile == "batch-8" and by == "smoke run 2026-01-01T00:00:00Z (hw.json)"
    assert smoke.attempt_spec(spec, 2, facts) == (spec, None)
    edited = {"hardware_profile": {**facts["hardware_profile"], "args": ["--batch-size", "16"]}}
    assert smoke.selected_profile(spec, edited) is None
    assert smoke.selected_profile(spec, {}) is None
    assert smoke.attempt_spec(spec, 1, {"hardware_profile": {"profile": "gone"}}) == (spec, None)


def test_validator_rejects_what_the_schema_forbids():
    assert smoke_record.validate({}) and "schema_version: missing" in smoke_record.validate({})
    bad = {"schema_version": "1", "smoke_evidence": [{"outcome": "fine"}], "extra": 1}
    problems = smoke_record.validate(bad)
    assert "schema_version: expected integer, got str" in problems
    assert "extra: not in the schema" in problems
    assert any(p.startswith("smoke_evidence[0].outcome: expected one of") for p in problems)
    assert "smoke_evidence[0].profile: missing" in problems


def test_docs_table_lists_every_schema_row():
    text = (REPO / "docs" / "smoke.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", text, re.M))
    assert documented == {path for path, *_ in smoke_record.SCHEMA}
