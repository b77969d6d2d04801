"""One run at one instant, as each surface shows it: the poll (and the live header), `babysit status`,
the web page's runs table and the live view (its table and its plain lines) say the same step, s/step,
ETA and the step it counts to, GPU-hours and cap — the one `core.progress.Progress` of the run.

A real supervisor (fake clock and executor, real store, spec, log and GPU file) takes the poll; the
status rows, the web page and the live view read the same store and log at the same instant. The ETA
used to count to the read step in polls but to the end in status, and status showed the cap of a
run.toml edited after the daemon loaded it, not the cap it enforced."""

from __future__ import annotations

import io
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from babysit.core.render import render
from babysit.core.spec.run_toml import load_spec
from babysit.db.store import Store
from babysit.probes.gpu import FileGpuProbe
from babysit.run.context import DaemonContext
from babysit.run.supervisor import RunSupervisor
from babysit.view.runtable import change_line, live_table, status_table
from babysit.view.runview import collect
from babysit.web.data import Site
from babysit.web.pages import runs_fragment
from tests.fakes import FakeClock, FakeExecutor, FakeHostProbe, ManualTimers
from tests.support import run_toml

GIB = 2**30


def run_spec(cap: float) -> str:
    """A one-GPU run with a verdict at step 1000 and a GPU-hour cap of `cap`."""
    return run_toml("r", ["python", "train.py", "--steps", "2000"], log="log.jsonl", gpus=[0], poll=(5, 30),
                    guards={"gpu_hours_cap": cap, "min_free_host_ram_gib": 1},
                    prereg={"question": "q", "metric": "eval_loss", "baseline_step": 500, "read_step": 1000,
                            "bands": [{"label": "HEALTHY", "max": 0.1}]})
# What every surface must say at that instant: step 620 of the 1000 the ETA counts to (the read step,
# before the command's 2000), 2 s a step (each step from its first record), 380 steps x 2 s, one GPU
# for 1300 s, and the cap the daemon loaded (12), whatever run.toml says now (20).
STEP, TARGET, SPS, ETA, GPU_H, CAP = "620", "1000", "2", "12m40s to step 1000", "0.36", "12.0"


@pytest.fixture
def workspace(tmp_path: Path):
    spec_file = tmp_path / "run.toml"
    spec_file.write_text(run_spec(cap=12.0))
    (tmp_path / "babysit.toml").write_text('[[runs]]\nname = "r"\nspec = "run.toml"\n'
                                           'registered_at = "2026-01-01T00:00:00Z"\n')
    gpu_file = tmp_path / "gpus.json"
    gpu_file.write_text(json.dumps({"gpus": [{"index": 0, "util_pct": 95, "util_samples": 5,
                                              "memory_used_bytes": 10 * GIB, "memory_total_bytes": 141 * GIB,
                                              "processes": []}]}))
    clock, host = FakeClock(), FakeHostProbe()
    store = Store.in_dir(tmp_path / ".babysit")
    ctx = DaemonContext(store=store, state_dir=tmp_path / ".babysit", gpu_probe=FileGpuProbe(gpu_file),
                        executors={"local": FakeExecutor(clock, host)}, scale=60.0, clock=clock, host_probe=host,
                        timers=ManualTimers(clock))
    spec = load_spec(spec_file)
    sup = RunSupervisor(ctx, spec, spec.prereg.sha256 if spec.prereg else None)
    yield tmp_path, clock, sup
    store.close()


def named(keys: tuple[str, ...], values: tuple[str, ...] | list[str]) -> dict[str, str]:
    return dict(zip(keys, values, strict=True))


def columns(header: str, line: str) -> dict[str, str]:
    """A table line's cells by their column (cells are two or more spaces apart)."""
    return named(tuple(re.split(r"\s{2,}", header.strip())), re.split(r"\s{2,}", line.strip()))


FIELDS = ("step", "sps", "eta", "gpu_h")


def write_records(log: Path, launched: float) -> None:
    """What a trainer writes: a loss record, then its learning rate 1.5 s into the step, and an eval
    record at every hundredth step, at that step; 2 s a step from the launch (steps 1..620)."""
    with open(log, "w") as f:
        t = launched
        for step in range(1, 621):
            f.write(json.dumps({"step": step, "ts": t, "train_loss": 2.0}) + "\n")
            f.write(json.dumps({"step": step, "ts": t + 1.5, "lr": 3e-4}) + "\n")
            if step % 100 == 0:
                f.write(json.dumps({"step": step, "ts": t + 1.9, "eval_loss": 1.9}) + "\n")
            t += 2.0


def test_poll_status_web_and_the_live_view_agree_on_one_runs_progress(workspace) -> None:
    root, clock, sup = workspace
    sup.start()
    launched = clock.now
    clock.advance(1300.0)  # 620 steps of 2 s, then 60 s into step 621 (its record not written yet)
    write_records(root / "log.jsonl", launched)
    (root / "run.toml").write_text(run_spec(cap=20.0))  # edited after the daemon loaded it
    now = clock.now

    assert sup.polls.now_alone("on-demand")
    (poll,) = sup.ctx.store.polls("r", 5)
    header = render("poll", {"snapshot": poll.snapshot.to_dict()}).text.splitlines()[0]
    shown_by = {"poll": named(FIELDS, re.search(
        r"step (\d+)/\d+ · (\S+) s/step · ETA (.+? to step \d+) · GPU-h ([\d.]+/[\d.]+)", header).groups())}
    assert re.search(rf"step {STEP}/{TARGET} ", header), header

    (row,) = collect(root / "babysit.toml", now=now)
    table = columns(*status_table([row], now).splitlines()[:2])
    shown_by["status"] = {"step": table["STEP"], "sps": table["S/STEP"], "eta": table["ETA"], "gpu_h": table["GPU-H"]}

    html = runs_fragment(Site(root / "babysit.toml").rows(now), now)
    cell = {css: re.search(rf'<td class="{css}">([^<]*)</td>', html).group(1)
            for css in ("step", "sps", "eta", "gpu-hours")}
    shown_by["web"] = {"step": cell["step"], "sps": cell["sps"], "eta": cell["eta"], "gpu_h": cell["gpu-hours"]}

    from rich.console import Console
    console = Console(file=io.StringIO(), width=250, color_system=None)
    console.print(live_table([row], now))
    live = console.file.getvalue().splitlines()
    live_cells = columns(live[0], live[2])
    shown_by["live view"] = {"step": live_cells["STEP"], "sps": live_cells["S/STEP"], "eta": live_cells["ETA"],
                             "gpu_h": live_cells["GPU-H"]}
    plain = change_line(row, now)
    shown_by["live view (plain)"] = named(FIELDS, re.search(
        r"step (\S+) · (\S+) s/step · ETA (.+? to step \d+) · GPU \S+, GPU-h (.+?)(?: · |$)", plain).groups())

    enforced = f"{GPU_H}/{CAP}"
    both = f"{enforced} (run.toml: 20.0)"  # status, the web page and the live view say both caps
    assert shown_by == {
        "poll": {"step": STEP, "sps": SPS, "eta": ETA, "gpu_h": enforced},
        "status": {"step": f"{STEP}/{TARGET}", "sps": SPS, "eta": ETA, "gpu_h": both},
        "web": {"step": f"{STEP}/{TARGET}", "sps": SPS, "eta": ETA, "gpu_h": both},
        "live view": {"step": f"{STEP}/{TARGET}", "sps": SPS, "eta": ETA, "gpu_h": both},
        "live view (plain)": {"step": f"{STEP}/{TARGET}", "sps": SPS, "eta": ETA, "gpu_h": both},
    }
    # and the numbers behind the words are one Progress
    assert row.progress == replace(poll.snapshot.progress, gpu_hours_used=pytest.approx(poll.snapshot.gpu_hours_used))
