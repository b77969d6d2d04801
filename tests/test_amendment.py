"""Amendments: parsing that names the field, records from a real log and store, refusal after the read,
the freeze check on every read, and the tamper incident recorded once."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path

import pytest

from babysit.commands.amend import amend_registered, record_amendment
from babysit.core.errors import BabysitError, PreregTampered, SpecError
from babysit.core.spec.amendment import amendment_sha256, check_against, parse_amendment
from babysit.core.spec.run_toml import load_spec
from babysit.db.store import Store
from babysit.verdict import reading

FIXTURES = Path(__file__).parent / "fixtures" / "verdict"
NOW = datetime(2026, 8, 17, 21, 35, 0, tzinfo=timezone.utc)
GOOD = """title = "measurement-scale calibration"
rationale = "the instrument's units changed"
scale = "12.5087 / 3.4623"
combine = "agree"
"""


def line(step: int, **metrics: float) -> str:
    return json.dumps({"step": step, "ts": 1755400000.0 + step, **metrics}) + "\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The seed's run.toml and fixture log in a fresh directory, with an empty train log, registered."""
    for name in ("run.toml", "rigonly_train_log.jsonl", "scale_amendment.toml"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    (tmp_path / "demosonly_train_log.jsonl").write_text("")
    from babysit.cli import main

    assert main(["register", str(tmp_path / "run.toml"), "--registry", str(tmp_path / "babysit.toml")]) == 0
    return tmp_path


# -- parsing -----------------------------------------------------------------------------------------------


def test_parse_good_amendment():
    a = parse_amendment(GOOD, "a.toml")
    assert a.title == "measurement-scale calibration" and a.combine == "agree" and a.text == GOOD


@pytest.mark.parametrize(("text", "field"), [
    (GOOD.replace('combine = "agree"', 'combine = "any"'), "combine"),
    (GOOD.replace('scale = "12.5087 / 3.4623"', 'scale = "__import__(1)"'), "scale"),
    (GOOD.replace('scale = "12.5087 / 3.4623"', 'scale = "-2"'), "scale"),
    (GOOD.replace('scale = "12.5087 / 3.4623"', 'scale = "1 / 0"'), "scale"),
    (GOOD.replace('scale = "12.5087 / 3.4623"', "scale = true"), "scale"),
    (GOOD.replace('scale = "12.5087 / 3.4623"\n', ""), "scale"),
    (GOOD.replace('title = "measurement-scale calibration"', 'title = ""'), "title"),
    (GOOD.replace('rationale = "the instrument\'s units changed"\n', ""), "rationale"),
    (GOOD + 'scael = 2\n', "scael"),
])
def test_malformed_amendments_are_refused_naming_the_file_and_field(text, field):
    with pytest.raises(SpecError) as err:
        parse_amendment(text, "amend.toml")
    assert err.value.exit_code == 2
    assert err.value.key == field and err.value.file == "amend.toml"
    assert str(err.value).startswith(f"amend.toml: {field}: expected")


def test_invalid_toml_is_refused_naming_the_file():
    with pytest.raises(SpecError, match=r"amend\.toml: expected valid TOML"):
        parse_amendment("title = ", "amend.toml")


def test_scale_may_name_references_but_only_declared_ones():
    prereg = load_spec(FIXTURES / "run.toml").prereg
    ok = parse_amendment(GOOD.replace('"12.5087 / 3.4623"', '"mixedv2 / demosonly"'), "a.toml")
    assert check_against(ok, prereg) == Fraction("2.3319") / Fraction("2.0317")
    bad = parse_amendment(GOOD.replace('"12.5087 / 3.4623"', '"nope * 2"'), "a.toml")
    with pytest.raises(SpecError, match=r"a\.toml: scale: expected arithmetic over numbers and names from"):
        check_against(bad, prereg)


# -- recording against a real log and store ----------------------------------------------------------------


def test_amendment_records_the_last_metric_step_seen_in_the_log(project: Path):
    log = project / "demosonly_train_log.jsonl"
    log.write_text(line(100, train_loss=0.9) + line(250, eval_chunk_mae=12.5087, train_chunk_mae=12.4202)
                   + "garbage\n" + line(300, train_loss=0.6))
    record, _ = amend_registered(project / "babysit.toml", "grasp_sft_v2_demosonly_1gpu_disc",
                                 project / "scale_amendment.toml", NOW)
    assert record.n == 1 and record.declared_at == "2026-08-17T21:35:00Z"
    assert record.data_seen_through_step == 250  # the metric's last step, not the log's (300)
    assert record.sha256 == amendment_sha256((project / "scale_amendment.toml").read_text(), None)


def test_amendment_before_any_eval_records_none(project: Path):
    record, _ = amend_registered(project / "babysit.toml", "grasp_sft_v2_demosonly_1gpu_disc",
                                 project / "scale_amendment.toml", NOW)
    assert record.data_seen_through_step is None


def test_amendments_chain_their_hashes(project: Path):
    args = (project / "babysit.toml", "grasp_sft_v2_demosonly_1gpu_disc", project / "scale_amendment.toml", NOW)
    first, _ = amend_registered(*args)
    second, _ = amend_registered(*args)
    assert second.n == 2 and second.prev_sha256 == first.sha256
    assert second.sha256 == amendment_sha256(second.text, first.sha256) != first.sha256


def test_late_amendment_is_refused_once_read_step_data_exists(project: Path):
    log = project / "demosonly_train_log.jsonl"
    log.write_text(line(500, eval_chunk_mae=3.4623) + line(1000, eval_chunk_mae=5.4940))
    with pytest.raises(BabysitError) as err:
        amend_registered(project / "babysit.toml", "grasp_sft_v2_demosonly_1gpu_disc",
                         project / "scale_amendment.toml", NOW)
    assert err.value.exit_code == 1 and "refused" in err.value.message and err.value.hint
    assert Store.in_dir(project / ".babysit").amendments("grasp_sft_v2_demosonly_1gpu_disc") == []


def test_record_amendment_refuses_a_run_without_prereg(tmp_path: Path):
    (tmp_path / "run.toml").write_text('[run]\nname = "plain"\ncommand = ["true"]\nlog = "log.jsonl"\n')
    spec = load_spec(tmp_path / "run.toml")
    with pytest.raises(BabysitError, match="has no \\[prereg\\]"):
        record_amendment(Store.in_dir(tmp_path / "s"), spec, parse_amendment(GOOD, "a.toml"), NOW)


# -- freezing ----------------------------------------------------------------------------------------------


def tamper(project: Path) -> None:
    spec = project / "run.toml"
    spec.write_text(spec.read_text().replace("max = 0.30", "max = 0.70"))


def test_tampered_prereg_is_detected_on_every_read(project: Path):
    reg, entry, spec = reading.load_registered(project / "babysit.toml", "grasp_sft_v2_demosonly_1gpu_disc")
    store = Store.in_dir(reg.state_dir)
    reading.read_registered_verdict(spec, entry.prereg_sha256, store)  # untouched: reads fine
    tamper(project)
    _, _, edited = reading.load_registered(project / "babysit.toml", "grasp_sft_v2_demosonly_1gpu_disc")
    with pytest.raises(PreregTampered) as err:
        reading.read_registered_verdict(edited, entry.prereg_sha256, store)
    assert entry.prereg_sha256 in err.value.message and edited.prereg.sha256 in err.value.message
    assert "register" in err.value.hint and err.value.exit_code == 1


def test_amending_a_tampered_prereg_is_refused(project: Path):
    tamper(project)
    with pytest.raises(PreregTampered):
        amend_registered(project / "babysit.toml", "grasp_sft_v2_demosonly_1gpu_disc",
                         project / "scale_amendment.toml", NOW)


def test_tamper_incident_is_recorded_once_per_hash_pair(project: Path):
    reg, entry, _ = reading.load_registered(project / "babysit.toml", "grasp_sft_v2_demosonly_1gpu_disc")
    tamper(project)
    _, _, edited = reading.load_registered(project / "babysit.toml", "grasp_sft_v2_demosonly_1gpu_disc")
    store = Store.in_dir(reg.state_dir)
    with pytest.raises(PreregTampered) as err:
        reading.check_frozen(edited, entry.prereg_sha256)
    assert reading.record_tamper_incident(store, edited.name, err.value, 1.0) is not None
    assert reading.record_tamper_incident(store, edited.name, err.value, 2.0) is None
    rows = [r for r in store.incidents(edited.name) if r.kind == "prereg-tampered"]
    assert len(rows) == 1 and rows[0].body["registered_sha256"] == entry.prereg_sha256
    # a second, different edit is a new pair: recorded again
    (project / "run.toml").write_text((project / "run.toml").read_text().replace("max = 0.70", "max = 0.90"))
    _, _, again = reading.load_registered(project / "babysit.toml", "grasp_sft_v2_demosonly_1gpu_disc")
    with pytest.raises(PreregTampered) as err2:
        reading.check_frozen(again, entry.prereg_sha256)
    assert reading.record_tamper_incident(store, again.name, err2.value, 3.0) is not None


def test_stored_amendments_are_applied_to_registered_reads(project: Path):
    log = project / "demosonly_train_log.jsonl"
    log.write_text(line(250, eval_chunk_mae=12.5087))
    amend_registered(project / "babysit.toml", "grasp_sft_v2_demosonly_1gpu_disc",
                     project / "scale_amendment.toml", NOW)
    with log.open("a") as f:
        f.write(line(500, eval_chunk_mae=3.4623) + line(1000, eval_chunk_mae=5.4940))
    reg, entry, spec = reading.load_registered(project / "babysit.toml", "grasp_sft_v2_demosonly_1gpu_disc")
    v = reading.read_registered_verdict(spec, entry.prereg_sha256, Store.in_dir(reg.state_dir))
    assert v.label == "AMBIGUOUS-BY-INSTRUMENT"
    body = v.to_json(spec.name, entry.prereg_sha256)
    assert body["amendments"][0]["data_seen_through_step"] == 250
    assert "provenance_checked" not in body["amendments"][0]
