"""`babysit verdict`, `babysit amend` and `babysit prereg show` through the real CLI entry point."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from babysit.cli import main
from tests.support import run_toml

FIXTURES = Path(__file__).parent / "fixtures" / "verdict"
RUN = "grasp_sft_v2_demosonly_1gpu_disc"
SPEC_KEYS = ["run", "status", "metric", "baseline_step", "read_step", "at_step", "baseline", "read", "delta",
             "rules", "label", "interpretation", "corroboration", "prereg_sha256", "amendments"]


def line(step: int, **metrics: float) -> str:
    return json.dumps({"step": step, "ts": 1755400000.0 + step, **metrics}) + "\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    for name in FIXTURES.iterdir():
        shutil.copy(name, tmp_path / name.name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BABYSIT_REGISTRY", raising=False)
    return tmp_path


def registered(project: Path, log_text: str = "") -> None:
    (project / "demosonly_train_log.jsonl").write_text(log_text)
    assert main(["register", "run.toml"]) == 0


def test_offline_json_is_exactly_spec_section_5(project: Path, capsys):
    rc = main(["verdict", "run.toml", "--log", "demosonly_train_log.jsonl", "--amendment", "scale_amendment.toml",
               "--json"])
    out, err = capsys.readouterr()
    assert rc == 0
    body = json.loads(out)  # stdout is the JSON and nothing else
    assert list(body) == SPEC_KEYS
    assert (body["status"], body["delta"], body["label"]) == ("FINAL", 2.0317, "AMBIGUOUS-BY-INSTRUMENT")
    assert body["amendments"][0]["provenance_checked"] is False
    assert "chart:" in err
    assert (project / f"{RUN}.verdict.png").is_file()  # next to the log


def test_offline_card_ignores_garbage_and_names_the_chart(project: Path, capsys):
    assert main(["verdict", "run.toml", "--chart", "c.png"]) == 0
    out = capsys.readouterr().out
    assert f"⚖️ {RUN}: SAME-DRIFT  (FINAL)" in out  # the post's words (core/render.verdict_text)
    assert "Δ +2.0317" in out and "1 garbage line(s) ignored" in out
    assert "chart: c.png" in out and (project / "c.png").is_file()


def test_provisional_is_a_banner_and_prefixes_the_label(project: Path, capsys):
    assert main(["verdict", "run.toml", "--at-step", "800", "--compare", "rigonly=rigonly_train_log.jsonl"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == "⏳ PROVISIONAL — read as of step 750, before read step 1000: NOT a verdict"
    assert out.splitlines()[0] == out.splitlines()[2] == "=" * 78  # fenced
    assert "AMBIGUOUS  (PROVISIONAL)" in out and "rigonly: Δ +0.6929" in out


def test_registered_read_uses_recorded_amendments_and_the_state_dir_chart(project: Path, capsys):
    registered(project, line(250, eval_chunk_mae=12.5087))
    assert main(["amend", RUN, "scale_amendment.toml"]) == 0
    assert "data seen through step 250" in capsys.readouterr().out
    with (project / "demosonly_train_log.jsonl").open("a") as f:
        f.write(line(500, eval_chunk_mae=3.4623) + line(750, eval_chunk_mae=4.0) + line(1000, eval_chunk_mae=5.494))
    assert main(["verdict", RUN, "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["label"] == "AMBIGUOUS-BY-INSTRUMENT"
    assert body["amendments"][0]["data_seen_through_step"] == 250
    assert (project / ".babysit" / "verdicts" / f"{RUN}.png").is_file()


def test_no_read_when_the_baseline_eval_is_missing_exits_0_with_a_reason(project: Path, capsys):
    registered(project, line(250, eval_chunk_mae=4.0) + line(1000, eval_chunk_mae=5.0))
    capsys.readouterr()
    assert main(["verdict", RUN, "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["status"] == "NO-READ" and "baseline_step 500" in body["reason"] and body["label"] is None


def test_tampered_prereg_exits_1_and_records_the_incident_once(project: Path, capsys):
    registered(project)
    capsys.readouterr()
    spec = project / "run.toml"
    spec.write_text(spec.read_text().replace('min = "0.5 * demosonly"', 'min = "0.4 * demosonly"'))
    assert main(["verdict", RUN]) == 1
    assert main(["verdict", RUN, "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "ERROR:" in err and "HINT:" in err and "edited after registration" in err
    from babysit.db.store import Store

    incidents = [r for r in Store.in_dir(project / ".babysit").incidents(RUN) if r.kind == "prereg-tampered"]
    assert len(incidents) == 1
    assert main(["prereg", "show", RUN]) == 1
    assert "TAMPERED" in capsys.readouterr().out


def test_late_amendment_exits_1_and_malformed_exits_2(project: Path, capsys):
    registered(project, line(500, eval_chunk_mae=3.0) + line(1000, eval_chunk_mae=3.1))
    assert main(["amend", RUN, "scale_amendment.toml"]) == 1
    assert "refused" in capsys.readouterr().err
    (project / "bad.toml").write_text('title = "t"\nrationale = "r"\nscale = 2\ncombine = "either"\n')
    (project / "demosonly_train_log.jsonl").write_text("")
    assert main(["amend", RUN, "bad.toml"]) == 2
    assert "bad.toml: combine: expected one of" in capsys.readouterr().err


def test_unknown_run_and_missing_log_are_bad_input(project: Path, capsys):
    registered(project)
    assert main(["verdict", "grasp_sft_v2_demosonly_1gpu_dis"]) == 2
    assert "did you mean" in capsys.readouterr().err
    assert main(["verdict", "run.toml", "--log", "nope.jsonl"]) == 2
    assert main(["verdict", RUN, "--log", "x.jsonl"]) == 2


def test_fixture_flag_ok_and_mismatch(project: Path, capsys):
    assert main(["verdict", "run.toml", "--fixture"]) == 0
    assert "OK" in capsys.readouterr().out
    spec = project / "run.toml"
    spec.write_text(spec.read_text().replace("expect_delta = 0.6929", "expect_delta = 0.6930"))
    assert main(["verdict", "run.toml", "--fixture"]) == 1
    out, err = capsys.readouterr()
    assert "MISMATCH" in out and "+0.6930" in err and "+0.6929" in err


def test_register_refuses_a_fixture_that_does_not_reproduce(project: Path, capsys):
    spec = project / "run.toml"
    spec.write_text(spec.read_text().replace('expect_label = "AMBIGUOUS"', 'expect_label = "HEALTHY"'))
    assert main(["register", "run.toml"]) == 1
    assert "fixture check failed" in capsys.readouterr().err


def test_prereg_show_verifies_the_chain(project: Path, capsys):
    registered(project)
    assert main(["amend", RUN, "scale_amendment.toml"]) == 0
    assert main(["amend", RUN, "scale_amendment.toml"]) == 0
    capsys.readouterr()
    assert main(["prereg", "show", RUN, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["matches"] and info["chain_ok"] and [a["n"] for a in info["amendments"]] == [1, 2]
    assert info["prereg"]["read_step"] == 1000
    import sqlite3

    db = sqlite3.connect(project / ".babysit" / "state.db")
    db.execute("UPDATE amendments SET text = text || ' ' WHERE n = 1")
    db.commit()
    db.close()
    assert main(["prereg", "show", RUN]) == 1
    assert "CHAIN BROKEN" in capsys.readouterr().out


# -- one poison value, one typo, one what-if: never a traceback, never the FINAL verdict's files ----------
def final_files(project: Path) -> dict[str, bytes]:
    """Write the FINAL verdict's files and record it, exactly as the daemon does (reading + store)."""
    from babysit.db.store import Store
    from babysit.verdict.reading import load_registered, read_registered_verdict, write_verdict_files

    reg, entry, spec = load_registered(project / "babysit.toml", RUN)
    store = Store.in_dir(reg.state_dir)
    body = read_registered_verdict(spec, entry.prereg_sha256, store).to_json(RUN, entry.prereg_sha256)
    assert body["status"] == "FINAL"
    files = write_verdict_files(spec, body, store, reg.state_dir / "verdicts")
    store.save_verdict(RUN, body, 0.0, final=True, chart_path=str(files.chart_path))
    store.close()
    return {p.name: p.read_bytes() for p in (files.json_path, files.chart_path)}


def test_what_if_reads_never_touch_the_final_verdicts_files(project: Path, capsys):
    registered(project, line(500, eval_chunk_mae=3.4623) + line(750, eval_chunk_mae=4.0)
               + line(1000, eval_chunk_mae=5.494))
    before = final_files(project)
    verdicts = project / ".babysit" / "verdicts"
    assert main(["verdict", RUN, "--at-step", "700"]) == 0  # the old code drew a PROVISIONAL chart over the FINAL's
    assert f"chart: {project / '.babysit' / 'whatif' / f'{RUN}-at-700.png'}" in capsys.readouterr().out
    assert main(["verdict", RUN, "--json", "--amendment", "scale_amendment.toml"]) == 0
    assert json.loads(capsys.readouterr().out)["amendments"][0]["provenance_checked"] is False
    assert main(["verdict", RUN, "--compare", "rigonly=rigonly_train_log.jsonl"]) == 0
    assert main(["verdict", RUN]) == 0  # the read of record points at the daemon's chart, redraws nothing
    assert "(the FINAL verdict's, as the daemon drew it)" in capsys.readouterr().out
    assert main(["verdict", RUN, "--chart", "mine.png"]) == 0 and (project / "mine.png").is_file()  # a path given
    assert {p.name: p.read_bytes() for p in verdicts.iterdir()} == before
    assert sorted(p.name for p in (project / ".babysit" / "whatif").iterdir()) == \
        [f"{RUN}-at-700.png", f"{RUN}-compare.png", f"{RUN}-whatif.png"]
    assert main(["verdict", RUN, "--at-step", "700", "--chart", str(verdicts / f"{RUN}.png")]) == 2
    assert "FINAL verdict's files" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in verdicts.iterdir()} == before


def test_json_comes_first_even_when_the_chart_cannot_be_drawn(project: Path, capsys):
    (project / "chart_dir.png").mkdir()  # savefig cannot write a directory
    assert main(["verdict", "run.toml", "--json", "--chart", "chart_dir.png"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["label"] == "SAME-DRIFT"
    assert "chart: not drawn (IsADirectoryError" in err


def test_poison_values_read_offline_give_json_and_a_clipped_chart(project: Path, capsys):
    (project / "poison.jsonl").write_text(
        '{"step": 500, "ts": 1.0, "eval_chunk_mae": -1.7e308}\n{"step": 600, "ts": 1.0, "eval_chunk_mae": 1e-320}\n'
        f'{{"step": 700, "ts": 1.0, "eval_chunk_mae": {10**400}}}\n{{"step": 800, "ts": 1.0, "eval_chunk_mae": NaN}}\n'
        '{"step": 1000, "ts": 1.0, "eval_chunk_mae": 1.7e308}\n')
    assert main(["verdict", "run.toml", "--log", "poison.jsonl", "--json"]) == 0  # old: OverflowError traceback
    body = json.loads(capsys.readouterr().out)
    assert body["status"] == "NO-READ" and "beyond the range of a float" in body["reason"]
    assert (project / f"{RUN}.verdict.png").read_bytes().startswith(b"\x89PNG")
    (project / "same.jsonl").write_text('{"step": 500, "ts": 1.0, "eval_chunk_mae": 1.7e308}\n'
                                        '{"step": 1000, "ts": 1.0, "eval_chunk_mae": 1.7e308}\n')
    assert main(["verdict", "run.toml", "--log", "same.jsonl", "--chart", "same.png"]) == 0  # old: chart crashed
    out = capsys.readouterr().out
    assert "HEALTHY  (FINAL)" in out and "chart: same.png" in out and "1.7e+308" in out
    assert (project / "same.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("target", ["offline", "registered"])
def test_a_what_if_amendment_with_a_typo_exits_2_naming_the_file_and_field_as_amend_does(project: Path, capsys,
                                                                                          target: str):
    (project / "typo.toml").write_text('title = "t"\nrationale = "r"\nscale = "12.5087 / demosonyl"\n'
                                       'combine = "agree"\n')
    registered(project)
    capsys.readouterr()
    assert main(["amend", RUN, "typo.toml"]) == 2
    amend_err = capsys.readouterr().err
    args = ["run.toml", "--log", "demosonly_train_log.jsonl"] if target == "offline" else [RUN]
    assert main(["verdict", *args, "--amendment", "typo.toml", "--json"]) == 2  # old: ExprError traceback
    out, err = capsys.readouterr()
    assert out == "" and err == amend_err
    assert "typo.toml: scale:" in err and "demosonly" in err and "12.5087 / demosonyl" in err


def test_a_read_mid_run_says_the_run_is_still_running_and_when_the_read_step_is_due(project: Path, capsys):
    """`babysit verdict RUN` mid-run said a bare NO-READ/PROVISIONAL; now where the run is and when the
    read step comes, from its step and s/step."""
    from babysit.db.store import Store

    registered(project, line(500, eval_chunk_mae=3.4623) + line(600, train_chunk_mae=3.0)
               + line(750, eval_chunk_mae=4.0))
    store = Store.in_dir(project / ".babysit")
    attempt = store.begin_attempt(RUN, 1, "default", ["python", "-m", "trainer"], "local", 1, "", 1755400000.0)
    store.mark_running(attempt.id, started_at=1755400000.0, pid=None)
    store.set_run_state(RUN, "running", 1755400750.0, attempt=1)
    assert main(["verdict", RUN]) == 0
    out = capsys.readouterr().out
    assert "run:       still running (attempt 1, step 750 at 1 s/step): read step 1000 expected in ~4m10s " \
           "(about " in out, out
    assert main(["verdict", RUN, "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["status"] == "PROVISIONAL", "the JSON is the verdict's alone"
    assert "still running (attempt 1, step 750" in got.err

    store.mark_ended(attempt.id, ended_at=1755400760.0, outcome="crashed", exit_code=1)
    store.set_run_state(RUN, "failed", 1755400760.0, ended="crashed")
    store.close()
    assert main(["verdict", RUN]) == 0
    assert "run:       failed (crashed) at step 750, before read step 1000: no read will come from this run " \
           f"(`babysit relaunch {RUN}` runs it again)" in capsys.readouterr().out


DRIFT = run_toml("drift", ["python", "-m", "trainer"], log="drift.jsonl", prereg={
    "metric": "eval_chunk_mae", "baseline_step": 500, "read_step": 1000, "precision": 4,
    "references": {"drift_ref": 0.0205}, "bands": [{"label": "HEALTHY", "max": 0.005},
                                                   {"label": "SAME-DRIFT", "min": "0.5 * drift_ref"}],
    "otherwise": {"label": "AMBIGUOUS"}})


def test_the_cli_card_says_the_verdict_in_the_post_s_words_and_digits(tmp_path: Path, monkeypatch, capsys):
    """`babysit verdict` printed `<=`, `->`, `x2.5000` and `SAME-DRIFT >= +0.01025` where the post wrote
    `≤ → ×2.5` and `≥ +0.0103`, and a `combine: agree (a disagreement is AMBIGUOUS-BY-INSTRUMENT)` line
    right above the interpretation saying the rules disagree: one renderer now, one rounding (each bound
    as the verdict JSON rounded it, core.verdict.shown_bound: 0.01025, never re-rounded by the post)."""
    from babysit.core.render import render

    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.toml").write_text(DRIFT)
    (tmp_path / "drift.jsonl").write_text(line(500, eval_chunk_mae=0.262) + line(1000, eval_chunk_mae=0.2825))
    (tmp_path / "a.toml").write_text('title = "t"\nrationale = "r"\nscale = "2.5"\ncombine = "agree"\n')
    assert main(["verdict", "run.toml", "--amendment", "a.toml", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["label"] == "AMBIGUOUS-BY-INSTRUMENT" and body["rules"][0]["bounds"]["SAME-DRIFT"] == {"min": 0.01025}
    assert main(["verdict", "run.toml", "--amendment", "a.toml"]) == 0
    out = capsys.readouterr().out
    post = render("verdict", {"verdict": body, "precision": 4}).text
    missing = [x for x in post.splitlines() if x not in out.splitlines()]
    assert not missing, (missing, out)  # every line of the post, word for word
    assert "  rule original: HEALTHY ≤ +0.0050, SAME-DRIFT ≥ +0.01025 → SAME-DRIFT" in post.splitlines()
    assert "  rule amendment-1 (×2.5): HEALTHY ≤ +0.0125, SAME-DRIFT ≥ +0.02562 → AMBIGUOUS" in post.splitlines()
    for old in ("<=", ">=", "->", "x2.5", "combine"):
        assert old not in out, (old, out)
