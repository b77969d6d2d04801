"""One poison value never blocks a state directory: a log value no chart, float or JSON can take, or a
verdict file that cannot be written, costs at most that run's verdict (an incident says why), never
the daemon, its start-up or another run. Real `babysit up --accelerated --exit-when-idle` daemons, the
fast scripted trainer, a real store."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from babysit.cli import main
from babysit.db.store import Store
from tests.reliability.harness import Daemons
from tests.reliability.test_security import FAKE_TRAINER
from tests.support import run_toml

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HUGE_INT = 10**400  # valid JSON, no float can hold it

PREREG = {"metric": "eval_mae", "baseline_step": 5, "read_step": 10, "references": {"ref": 0.01},
          "bands": [{"label": "HEALTHY", "max": 0.3}, {"label": "SAME-DRIFT", "min": "0.5 * ref"}],
          "otherwise": {"label": "AMBIGUOUS"}}


def evals(**by_step: object) -> str:
    """Eval records as a trainer might write them, values verbatim (`NaN`, `10**400` as a number)."""
    return "".join(f'{{"step": {step[1:]}, "ts": 1.0, "eval_mae": {value}}}\n' for step, value in by_step.items())


def scripted_run(root: Path, name: str, lines: str) -> None:
    """A registered run of the fake trainer: 12 train steps, then `lines` copied into its log as written."""
    (root / f"{name}.lines").write_text(lines)
    cmd = [sys.executable, str(FAKE_TRAINER), f"outputs/{name}/log.jsonl", "--steps", "12", "--sleep", "0.02",
           "--append-lines", f"{name}.lines"]
    spec = root / f"{name}.toml"
    spec.write_text(run_toml(name, cmd, log="outputs/{name}/log.jsonl", guards={"min_free_host_ram_gib": 0.01},
                             poll=(1, 2), prereg=PREREG))
    assert main(["register", str(spec), "--accelerated", "--registry", str(root / "babysit.toml")]) == 0


def finish(daemons: Daemons, root: Path, timeout: float = 60) -> None:
    proc = daemons.start("--exit-when-idle")
    assert proc.wait(timeout) == 0, (root / "daemon-out.txt").read_text()[-3000:]


VERDICT_PLACES = ("reading the verdict", "reading the final verdict", "drawing the verdict chart", "starting")


def internal_errors(store: Store, run: str) -> list:
    return [i for i in store.incidents(run) if i.kind == "internal-error"]


def channel(root: Path) -> list[dict]:
    """channel.jsonl, parsed line by line with a strict parser (no NaN, no Infinity)."""
    def strict(token: str) -> object:
        raise AssertionError(f"non-standard JSON number {token} in channel.jsonl")

    text = (root / ".babysit" / "channel.jsonl").read_text()
    return [json.loads(line, parse_constant=strict) for line in text.splitlines()]


def test_poison_values_in_a_log_end_their_run_with_a_read_and_block_nothing(tmp_path: Path, daemons: Daemons) -> None:
    # 1.7e308 at baseline and read: delta 0, but no chart axis can hold the values (the old chart crashed in
    # the exit thread: the run stayed `running`, --exit-when-idle never returned, every later start-up died)
    scripted_run(tmp_path, "p_clip", evals(s5="1.7e308", s6="1e-320", s7="-1.7e308", s8=HUGE_INT, s9="NaN",
                                           s10="1.7e308"))
    # -1.7e308 -> +1.7e308: the delta is beyond a float (the old verdict raised OverflowError)
    scripted_run(tmp_path, "p_over", evals(s5="-1.7e308", s6="1e-320", s8=HUGE_INT, s9="NaN", s10="1.7e308"))
    scripted_run(tmp_path, "healthy", evals(s5="1.0", s10="1.1"))
    finish(daemons, tmp_path)

    store = Store.in_dir(tmp_path / ".babysit")
    assert [store.run_state(r)[0] for r in ("p_clip", "p_over", "healthy")] == ["finished"] * 3
    verdicts = tmp_path / ".babysit" / "verdicts"
    clip = json.loads((verdicts / "p_clip.json").read_text())
    assert (clip["status"], clip["delta"], clip["label"]) == ("FINAL", 0.0, "HEALTHY")
    assert (verdicts / "p_clip.png").read_bytes().startswith(PNG_MAGIC)
    over = store.latest_verdict("p_over").body
    assert over["status"] == "NO-READ" and "beyond the range of a float" in over["reason"]
    assert store.final_verdict("healthy").body["label"] == "HEALTHY"
    assert (verdicts / "healthy.png").read_bytes().startswith(PNG_MAGIC)
    assert not [i.body for r in ("p_clip", "p_over", "healthy") for i in internal_errors(store, r)
                if i.body["where"] in VERDICT_PLACES or "exit" in i.body["where"]], "handled, not merely survived"
    posted = channel(tmp_path)  # every line whole, strict JSON
    assert {m["run"] for m in posted if m["kind"] == "verdict"} == {"p_clip", "healthy"}
    store.close()

    # a restarted daemon re-reads every run's state at start-up and starts (the old one crashed here)
    finish(daemons, tmp_path, timeout=30)


def test_a_verdict_that_cannot_be_written_is_an_incident_the_runs_still_end_and_a_restart_reads_it(
        tmp_path: Path, daemons: Daemons) -> None:
    scripted_run(tmp_path, "blocked", evals(s5="1.0", s10="1.2"))
    (tmp_path / ".babysit" / "verdicts").write_text("a file where the verdicts directory goes\n")
    finish(daemons, tmp_path)

    store = Store.in_dir(tmp_path / ".babysit")
    assert store.run_state("blocked")[0] == "finished" and store.final_verdict("blocked") is None
    (incident,) = [i for i in internal_errors(store, "blocked") if "FileExistsError" in i.body["error"]]  # once
    assert incident.body["where"] == "reading the verdict"
    log = (tmp_path / ".babysit" / "daemon.log").read_text()
    assert "Traceback" in log and "internal error" in log
    posted = [m for m in channel(tmp_path) if m["kind"] == "incident" and "FileExistsError" in m["text"]]
    assert len(posted) == 1, "posted once, not every tick"

    (tmp_path / ".babysit" / "verdicts").unlink()  # fixed: the next daemon reads the verdict it could not write
    finish(daemons, tmp_path, timeout=30)
    assert store.final_verdict("blocked").body["label"] == "HEALTHY"
    assert json.loads((tmp_path / ".babysit" / "verdicts" / "blocked.json").read_text())["status"] == "FINAL"
    assert [m["run"] for m in channel(tmp_path) if m["kind"] == "verdict"] == ["blocked"]
    store.close()


def test_a_chart_that_cannot_be_drawn_costs_the_chart_never_the_verdict(tmp_path: Path, daemons: Daemons) -> None:
    scripted_run(tmp_path, "nochart", evals(s5="1.0", s10="1.2"))
    (tmp_path / ".babysit" / "verdicts" / "nochart.png").mkdir(parents=True)  # savefig cannot write there
    finish(daemons, tmp_path)

    store = Store.in_dir(tmp_path / ".babysit")
    assert store.run_state("nochart")[0] == "finished"
    assert store.final_verdict("nochart").body["label"] == "HEALTHY"
    assert json.loads((tmp_path / ".babysit" / "verdicts" / "nochart.json").read_text())["status"] == "FINAL"
    (verdict,) = [m for m in channel(tmp_path) if m["kind"] == "verdict"]
    assert verdict["payload"]["chart_path"] is None and "IsADirectoryError" in verdict["payload"]["chart_error"]
    assert "chart: not drawn" in verdict["text"]
    (incident,) = [i for i in internal_errors(store, "nochart") if i.body["where"] == "drawing the verdict chart"]
    assert "IsADirectoryError" in incident.body["error"]
    store.close()
