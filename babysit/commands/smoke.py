"""`babysit smoke RUN.toml`: try the run's profiles for N steps, keep the first that fits (docs/smoke.md).

The thin shell around `babysit/core/smoke.py` (pure evidence and selection) and `babysit/register/smoke_record.py`
(the record): it applies the exclusive-GPU guard, starts each smoke run through the local executor's
shim (argv only, its own process group, stdout/stderr/exit.json files; SIGKILL to the group at the
timeout or on Ctrl-C, so nothing outlives it), samples NVML and RSS while it runs, asks a subprocess
for the framework's view of the GPU (babysit never imports torch), writes hardware_profile.json and,
when the run is registered, records the selection so that the daemon's attempt 1 uses it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from babysit.core import guards
from babysit.core.classify import ExitFacts, classify_exit
from babysit.core.errors import BadInput, LaunchRefused
from babysit.core.smoke import (
    Sampled,
    candidates,
    drop_eval,
    profile_evidence,
    rlimit_prefix,
    select_profile,
    smoke_argv,
    smoke_env,
    train_evidence,
)
from babysit.core.spec.run_toml import load_spec
from babysit.db.store import Attempt
from babysit.db.url import open_store
from babysit.executors.local import LocalExecutor
from babysit.probes.gpu import open_gpu_probe
from babysit.probes.host import read_host
from babysit.register.smoke_record import GpuInfo, Hardware, build_record, declared_attempt, validate
from babysit.runtime import registry
from babysit.sources import logtail
from babysit.verdict.reading import write_json_atomic

SAMPLE_S = 0.5
_FRAMEWORK_PROBE = (
    "import json, torch\n"
    "ok = torch.cuda.is_available()\n"
    "out = {'version': torch.__version__, 'cuda_available': ok, 'devices': []}\n"
    "for i in range(torch.cuda.device_count() if ok else 0):\n"
    "    p = torch.cuda.get_device_properties(i)\n"
    "    out['devices'].append({'name': p.name, 'total_memory': int(p.total_memory)})\n"
    "print(json.dumps(out))\n"
)


def run(args: argparse.Namespace) -> int:
    spec = load_spec(Path(args.spec), display=args.spec)
    steps = args.steps if args.steps is not None else spec.smoke.steps
    if steps < 1:
        raise BadInput(f"--steps: expected a positive integer, got {steps}")
    if not args.timeout_s > 0:
        raise BadInput(f"--timeout-s: expected a positive number of seconds, got {args.timeout_s}")
    if args.rlimit_as_gib is not None and not args.rlimit_as_gib > 0:
        raise BadInput(f"--rlimit-as-gib: expected a positive number, got {args.rlimit_as_gib}")
    if args.rlimit_as_gib is not None and spec.gpus:
        raise BadInput("--rlimit-as-gib is a CPU test knob: CUDA reserves far more address space than memory, "
                       f"so it would fail every profile of a GPU run (run.gpus = {list(spec.gpus)})")
    out = Path(args.out) if args.out else spec.spec_file.parent / "hardware_profile.json"
    probe = open_gpu_probe(args.gpu_probe) if spec.gpus else None
    smoke_dir = _smoke_dir(args.smoke_dir, spec.name)
    tried: list[Any] = []
    own_pids: set[int] = set()
    first_view = None
    profiles = candidates(spec)
    print(f"smoke: {spec.name}: {len(profiles)} profile(s), {steps} steps each, eval off; files under {smoke_dir}")
    try:
        for i, profile in enumerate(profiles, start=1):
            view = _guard(spec, probe, own_pids, profile.profile)
            first_view = first_view or view
            evidence = _run_one(spec, profile, i, steps, smoke_dir, args, probe, own_pids)
            tried.append(evidence)
            print(f"[{i}/{len(profiles)}] {_line(evidence)}")
            if evidence.outcome == "ok":
                break
        hardware = _hardware(spec, first_view)
    finally:
        if probe is not None:
            probe.close()
    selected = select_profile(tried)
    measured_at = registry.utc_timestamp(_now())
    record = build_record(spec=spec, measured_at=measured_at, hardware=hardware, evidence=tried, selected=selected)
    problems = validate(record)
    if problems:  # a bug in babysit, not in the user's input: say so plainly
        raise AssertionError("hardware_profile record does not match its schema: " + "; ".join(problems))

    write_json_atomic(out, record)
    print(f"wrote {out}")
    print(record["provenance_note"])
    if selected is None:
        print("ERROR: no profile completed its smoke run; nothing selected (see smoke_evidence for each failure)",
              file=sys.stderr)
        print("HINT: declare a smaller fallback profile in [[attempts]] (smaller micro-batch, more backward "
              "chunks, --grad-checkpointing) and run `babysit smoke` again", file=sys.stderr)
        return 1
    print(f"selected: '{selected.profile}' {' '.join(selected.args)}")
    _record_selection(args.registry, spec, out, record, selected)
    return 0


# -- guard ------------------------------------------------------------------------------------------

def _guard(spec: Any, probe: Any, own_pids: set[int], profile: str) -> Any:
    """The daemon's prelaunch check before every smoke run; a refusal ends the smoke with exit 1.

    A previous smoke run's pid can linger in NVML's list for a moment after it exited: wait for those
    (up to 15 s), never for anyone else's.
    """
    if probe is None:
        return None
    deadline = time.monotonic() + 15
    while True:
        view = probe.read(spec.gpus)
        actions = guards.prelaunch(spec.guards, spec.gpus, view)
        refusals = [a for a in actions if a.kind == "refuse"]
        ours = refusals and all(a.incident == "gpu-held" and
                                {h["pid"] for h in a.detail.get("holders", [])} <= own_pids for a in refusals)
        if ours and time.monotonic() < deadline:
            time.sleep(0.5)
            continue
        for action in actions:
            if action.kind == "warn":
                print(f"WARNING: {action.message}", file=sys.stderr)
        if refusals:
            raise LaunchRefused(f"smoke run of profile '{profile}' refused: {refusals[0].message}",
                                hint="free the GPU (or set guards.exclusive_gpu = false) and run `babysit smoke` "
                                     "again")
        return view


# -- one smoke run ----------------------------------------------------------------------------------

class _Sampler:
    """Peaks over probe samples of the run's process tree: NVML memory (per process and device) and RSS."""
    def __init__(self, probe: Any, gpus: tuple[int, ...]) -> None:
        self.probe, self.gpus = probe, gpus
        self.samples = 0
        self.proc_peak: int | None = None
        self.dev_peak: int | None = None
        self.rss_peak: int | None = None

    def sample(self, root: int) -> None:
        host = read_host(root)
        self.samples += 1
        if host.run_rss_bytes is not None:
            self.rss_peak = max(self.rss_peak or 0, host.run_rss_bytes)
        if self.probe is None:
            return
        view = self.probe.read(self.gpus)
        if not view.available:
            return
        procs = [p.used_memory_bytes for g in view.gpus for p in g.processes
                 if p.pid in host.run_pids and p.used_memory_bytes is not None]
        if procs:
            self.proc_peak = max(self.proc_peak or 0, sum(procs))
        used = [g.memory_used_bytes for g in view.gpus if g.memory_used_bytes is not None]
        if used:
            self.dev_peak = max(self.dev_peak or 0, sum(used))

    def result(self) -> Any:
        return Sampled(self.samples, self.proc_peak, self.dev_peak, self.rss_peak)


def _run_one(spec: Any, profile: Any, i: int, steps: int, smoke_dir: Path, args: argparse.Namespace, probe: Any,
             own_pids: set[int]) -> Any:
    label = f"smoke-{i}"
    pdir = smoke_dir / f"{i:02d}-{_slug(profile.profile)}"
    if pdir.exists():  # a reused --smoke-dir: an old log would be read as this run's evidence
        shutil.rmtree(pdir)
    pdir.mkdir(parents=True)
    log, ck = pdir / "train_log.jsonl", pdir / "checkpoints"
    argv, notes = smoke_argv(spec, profile, steps, log, ck, label)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.rlimit_as_gib is not None:
        argv = rlimit_prefix(sys.executable, args.rlimit_as_gib) + argv
    env = smoke_env(spec, os.environ, log, ck, label)
    attempt = Attempt(id=i, run=spec.name, n=i, profile=profile.profile, argv=tuple(argv), executor="local",
                      gpus=len(spec.gpus), attempt_dir=str(pdir / "attempt"), status="launching", pid=None,
                      pid_create_time=None, job_id=None, created_at=time.time(), started_at=None, ended_at=None,
                      exit_code=None, exit_signal=None, outcome=None, detail={})
    executor = LocalExecutor()
    sampler = _Sampler(probe, spec.gpus)
    timed_out = False
    t0 = time.monotonic()
    launched = executor.launch(attempt, argv, env, str(spec.workdir))
    attempt = dataclasses.replace(attempt, pid=launched.pid, pid_create_time=launched.pid_create_time,
                                  status="running")
    try:
        own_pids.add(launched.pid or -1)
        while not executor.wait(attempt, SAMPLE_S):
            if launched.pid is not None:
                sampler.sample(launched.pid)
            if time.monotonic() - t0 > args.timeout_s:
                timed_out = True
                executor.kill(attempt)  # SIGKILL to the group: a killed smoke saves no checkpoint anywhere
                executor.wait(attempt, 30)
                break
    except BaseException:  # Ctrl-C or a bug: the smoke run must not outlive babysit smoke
        executor.kill(attempt)
        raise
    wall = time.monotonic() - t0
    try:
        child = json.loads((pdir / "attempt" / "shim.json").read_text()).get("child_pid")
        if child:
            own_pids.add(int(child))
    except (OSError, ValueError):
        pass
    info = executor.exit_info(attempt)
    assert info is not None
    try:
        records, garbage = logtail.read_all(log)
    except FileNotFoundError:
        records, garbage = [], 0
    train_only = drop_eval(records, garbage)  # before anything else sees the records
    cls = classify_exit(ExitFacts(exit_code=info.exit_code, signal=info.signal, stderr_tail=info.stderr_tail,
                        last_records=list(train_only.records[-16:]), rules=spec.classify, stop_requested=False,
                        nonfinite_metrics=spec.guards.nonfinite_metrics))
    return profile_evidence(profile=profile, argv=argv, cls=cls, timed_out=timed_out, wall_s=wall, steps=steps,
                            train=train_evidence(train_only), sampled=sampler.result(), smoke_dir=str(pdir))


def _line(e: Any) -> str:
    mem = []
    if e.train.max_memory_allocated_gib is not None:
        mem.append(f"max allocated {e.train.max_memory_allocated_gib:.2f} GiB")
    if e.sampled.nvml_process_peak_bytes is not None:
        mem.append(f"NVML {e.sampled.nvml_process_peak_bytes / 2**30:.2f} GiB")
    if e.train.peak_rss_gib is not None:
        mem.append(f"peak RSS {e.train.peak_rss_gib:.2f} GiB")
    step = f", median step {e.train.median_step_time_s:.3g} s" if e.train.median_step_time_s is not None else ""
    return f"{e.profile}: {e.outcome} — {e.summary}" + (f" ({', '.join(mem)}{step})" if mem or step else "")


# -- hardware ---------------------------------------------------------------------------------------

def _hardware(spec: Any, view: Any) -> Any:
    ram = read_host(None).total_ram_bytes
    cpu = _cpu_model()
    if not spec.gpus:
        return Hardware((), cpu, os.cpu_count(), ram)
    version, devices, note = _framework(spec)
    gpus = []
    for k, index in enumerate(spec.gpus):
        reading = view.gpu(index) if view is not None else None
        capacity = devices[k]["total_memory"] if devices is not None and k < len(devices) else None
        gpus.append(GpuInfo(index, reading.name if reading else "?",
                            reading.memory_total_bytes if reading else None, capacity))
    return Hardware(tuple(gpus), cpu, os.cpu_count(), ram, version, note)


def _framework(spec: Any) -> tuple[str | None, list[dict[str, Any]] | None, str | None]:
    """torch's view of the run's GPUs, from a subprocess with the run's env (babysit never imports torch)."""
    first = spec.command[0]
    python = first if Path(first).name.startswith("python") else sys.executable
    env = smoke_env(spec, os.environ, Path(os.devnull), Path(os.devnull), "smoke-framework-probe")
    try:
        res = subprocess.run([python, "-c", _FRAMEWORK_PROBE], cwd=spec.workdir, env=env, capture_output=True,
                             text=True, timeout=300, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, None, f"framework probe failed: {exc}"
    try:
        data = json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return None, None, f"framework probe failed (exit {res.returncode}): {last[:200]}"
    if not data.get("cuda_available"):
        return data.get("version"), None, "torch.cuda.is_available() is False with the run's env"
    return data.get("version"), data.get("devices"), None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


# -- the store --------------------------------------------------------------------------------------

def _record_selection(registry_arg: str | None, spec: Any, out: Path, record: dict[str, Any], selected: Any) -> None:
    """When this RUN.toml is the registered one, record the selection so that the daemon's attempt 1 uses it."""
    reg = registry.load(registry.resolve_registry_path(registry_arg))
    entry = reg.find(spec.name)
    if entry is None:
        print(f"'{spec.name}' is not registered in {reg.path}: only the JSON was written "
              "(`babysit register` it, then run `babysit smoke` again to have attempt 1 use the selection)")
        return
    registered = Path(os.path.realpath(reg.spec_path(entry)))
    if registered != Path(os.path.realpath(spec.spec_file)):
        print(f"WARNING: '{spec.name}' is registered from {registered}, not {spec.spec_file}: selection not "
              "recorded", file=sys.stderr)
        return
    if declared_attempt(spec, selected) is None:
        print(f"WARNING: '{selected.profile}' is a [smoke] candidate, not a declared [[attempts]] profile: the "
              "daemon cannot run it, selection not recorded (declare it in [[attempts]])", file=sys.stderr)
        return
    store = open_store(reg)
    try:
        if store.attempts(spec.name):
            print(f"WARNING: '{spec.name}' already has attempts: the selection only applies to attempt 1, so it "
                  "was not recorded (register a new run name to start over)", file=sys.stderr)
            return
        status, _ = store.run_state(spec.name)
        store.set_run_state(spec.name, status, time.time(), hardware_profile={
            "path": str(Path(os.path.abspath(out))), "profile": selected.profile, "args": list(selected.args),
            "measured_at": record["measured_at"], "selected_at": registry.utc_timestamp(_now())})
    finally:
        store.close()
    print(f"recorded in {reg.state_dir}: attempt 1 of '{spec.name}' will use profile '{selected.profile}'")


def _smoke_dir(arg: str | None, name: str) -> Path:
    if arg:
        path = Path(arg)
        path.mkdir(parents=True, exist_ok=True)
        return path.resolve()
    return Path(tempfile.mkdtemp(prefix=f"babysit-smoke-{name}-"))


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40] or "profile"


def _now() -> Any:
    return datetime.now(timezone.utc)
