"""A workspace with history, built through babysit's own doors: `babysit register` (in-process) for the
registry, the Store's methods for what a daemon would have recorded, and a train log on disk. Fast: no
trainer and no daemon, for the page, SVG, metrics and server tests (the browser tests with a live daemon
are in test_browser_live.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from babysit.cli import main
from babysit.core.snapshot import Snapshot
from babysit.db.store import Store
from tests.support import TRAIN_LOG, run_toml

RUN = "drift_web"
HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
HOSTILE_PROFILE = '<b onmouseover="window.pwned=3">bold</b>'

RUN_TOML = run_toml(  # HTML in the profile's name and the question: the page must show it as text
    RUN, ["python", "-m", "trainer", "--recipe", "tiny"], log=TRAIN_LOG, gpus=[0], guards={"gpu_hours_cap": 2.0},
    retry={"max_attempts": 2, "on": ["diverged"]},
    attempts={HOSTILE_PROFILE: ["--lr-scale", "4"], "stable-lr": ["--lr-scale", "0.5"]},
    prereg={"question": "Does <eval> error climb after step 50? & why", "metric": "eval_chunk_mae", "baseline_step": 50,
            "read_step": 150, "train_metric": "train_chunk_mae", "references": {"drift_ref": 0.04},
            "bands": [{"label": "HEALTHY", "max": 0.005}, {"label": "SAME-DRIFT", "min": "0.5 * drift_ref"}],
            "otherwise": {"label": "AMBIGUOUS"}})

AMENDMENT = '''title = "scale <calibration>"
rationale = "declared before the baseline"
scale = "2.5"
combine = "agree"
'''


def write_log(path: Path, evals: dict[int, float], *, last_step: int, t0: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"step": 0, "ts": t0, "event": "start"}]
    for step in range(1, last_step + 1):
        lines.append({"step": step, "ts": t0 + step * 0.5, "train_loss": 1.0 / step})
        if step in evals:
            lines.append({"step": step, "ts": t0 + step * 0.5, "eval_chunk_mae": evals[step],
                          "train_chunk_mae": evals[step] / 2})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def build(root: Path, *, final: bool = True, chart: Path | None = None) -> Path:
    """A registered run with two attempts (a diverged one, an incident, a retry), an amendment, a verdict
    read, polls; and a run the registry does not list whose name is HTML. Returns the registry path. The
    FINAL verdict's row names its chart where a daemon draws it (`chart`: where another drew it)."""
    registry = root / "babysit.toml"
    spec = root / f"{RUN}.toml"
    spec.write_text(RUN_TOML)
    assert main(["register", str(spec), "--registry", str(registry)]) == 0
    t0 = time.time() - 600
    evals = {50: 0.19, 100: 0.2, 150: 0.25} if final else {50: 0.19, 100: 0.2}
    write_log(root / "outputs" / RUN / "train_log.jsonl", evals, last_step=150 if final else 120, t0=t0)
    (root / "amend.toml").write_text(AMENDMENT)
    store = Store.in_dir(root / ".babysit")
    try:
        store.add_amendment(RUN, 'scale <calibration>', AMENDMENT, "2026-12-01T10:00:00Z", 20)
        first = store.begin_attempt(RUN, 1, HOSTILE_PROFILE, ["python", "-m", "trainer", "--lr-scale", "4"],
                                    "local", 1, str(root / ".babysit" / "a1"), t0)
        store.mark_running(first.id, started_at=t0, pid=None)
        store.mark_ended(first.id, ended_at=t0 + 30, outcome="diverged", exit_code=3,
                         detail={"reason": "loss is NaN at step 60"})
        store.add_incident(RUN, 1, t0 + 30, "diverged", {"step": 60})
        store.enqueue(RUN, "incident", {"run": RUN, "attempt": 1, "incident": "diverged",
                                        "message": "attempt 1 diverged: <b>NaN</b> loss at step 60"}, t0 + 30)
        store.add_incident(RUN, 1, t0 + 31, "retrying", {"next": 2})
        second = store.begin_attempt(RUN, 2, "stable-lr", ["python", "-m", "trainer", "--lr-scale", "0.5"],
                                     "local", 1, str(root / ".babysit" / "a2"), t0 + 32)
        store.mark_running(second.id, started_at=t0 + 32, pid=None)
        store.add_poll(RUN, 2, t0 + 100, "poll", Snapshot.from_dict({"step": 100, "gpus": [{"index": 0, "util_pct": 87.0}]}))
        if final:
            store.mark_ended(second.id, ended_at=t0 + 110, outcome="completed", exit_code=0)
            store.set_run_state(RUN, "finished", t0 + 110)
            store.save_verdict(RUN, {"run": RUN, "status": "FINAL", "at_step": 150, "label": "SAME-DRIFT",
                                     "delta": 0.06, "interpretation": "the <climb> reproduces"}, t0 + 110, final=True,
                               chart_path=str(chart or root / ".babysit" / "verdicts" / f"{RUN}.png"))
        else:
            store.set_run_state(RUN, "running", t0 + 40, step=120)
            store.save_verdict(RUN, {"run": RUN, "status": "PROVISIONAL", "at_step": 100, "label": "AMBIGUOUS",
                                     "delta": 0.01}, t0 + 60, final=False)
        store.set_run_state(HOSTILE, "failed", t0, ended="crashed")
        hostile = store.begin_attempt(HOSTILE, 1, HOSTILE_PROFILE, ["x"], "local", 0, "/tmp/x", t0)
        store.mark_ended(hostile.id, ended_at=t0 + 5, outcome="crashed", exit_code=1)
        store.add_incident(HOSTILE, 1, t0 + 5, "crashed", {"message": HOSTILE})
        store.enqueue(RUN, "poll", {"run": RUN}, t0)
        failed = store.enqueue(RUN, "text", {"run": RUN}, t0)
        store.mark_retry(failed, "slack said: ratelimited", t0 + 50)
    finally:
        store.close()
    return registry
