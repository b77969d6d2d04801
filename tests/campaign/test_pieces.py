"""The pure pieces of campaigns: campaign.toml validation, the delta and its single-delta rule, the grid's
plan, the suspect table, the proposal's argv edit; and banking against real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from babysit.campaign import actions, propose
from babysit.core.campaign import delta, grid
from babysit.core.campaign.spec import Campaign, RunLink, Suspect, parse_campaign, parse_link
from babysit.core.errors import SpecError
from babysit.core.spec.run_toml import AttemptProfile, RunSpec
from babysit.core.spec.tomlfile import Table, loads

CAMPAIGN = """
[campaign]
name = "sft_drift"
question = "Why do the v2 SFT runs drift after step 500?"
owners = ["U0OWNER01"]

[[suspects]]
name = "distributed"
status = "live"
factors = ["gpus", "executor", "--chunk-grad-allreduce"]
[[suspects]]
name = "image-augment"
factors = ["--image-augment"]
[[suspects]]
name = "eff-96"
factors = ["--batch-size"]

[[banked]]
name = "demosonly"
delta = 2.0317
[[banked]]
name = "rigonly"
delta = 0.6929
"""


def campaign(tmp_path: Path, text: str = CAMPAIGN) -> Campaign:
    path = tmp_path / "campaign.toml"
    return parse_campaign(loads(text, "campaign.toml"), path, "campaign.toml")


def spec(name: str, argv: list[str], *, gpus: tuple[int, ...] = (), env: dict[str, str] | None = None,
         knobs: tuple[str, ...] = (), attempts: tuple[AttemptProfile, ...] = ()) -> RunSpec:
    from types import MappingProxyType

    return RunSpec(name=name, command=tuple(argv), log=Path("log"), spec_file=Path(f"{name}.toml"),
                   workdir=Path("."), checkpoints=Path("ck"), gpus=gpus, env=MappingProxyType(env or {}),
                   machinery_knobs=knobs, attempts=attempts)


BASE = ["python", "-m", "trainer", "--recipe", "demosonly", "--batch-size", "96", "--image-augment", "0.8",
        "--log", "outputs/{name}/log.jsonl", "--chunk-grad-allreduce"]


def link(tmp_path: Path, **kw: object) -> RunLink:
    return RunLink(file=tmp_path / "campaign.toml", **kw)  # type: ignore[arg-type]


# -- campaign.toml -------------------------------------------------------------------------------------
def test_campaign_parses_suspects_banked_references_and_owners(tmp_path: Path) -> None:
    c = campaign(tmp_path)
    assert [s.name for s in c.suspects] == ["distributed", "image-augment", "eff-96"]
    assert c.suspect("image-augment") == Suspect("image-augment", "untested", ("--image-augment",))
    assert c.references == {"demosonly": 2.0317, "rigonly": 0.6929}
    assert c.owners == ("U0OWNER01",) and len(c.sha256) == 64


@pytest.mark.parametrize("edit, key", [
    (('status = "live"', 'status = "guilty"'), "suspects[0].status"),
    (('owners = ["U0OWNER01"]', 'owners = ["bob"]'), "campaign.owners[0]"),
    (('delta = 2.0317', 'delta = "big"'), "banked[0].delta"),
    (('name = "sft_drift"', 'name = "SFT drift"'), "campaign.name"),
    (('factors = ["--image-augment"]', 'factor = ["--image-augment"]'), "suspects[1].factor"),
])
def test_campaign_refuses_a_bad_field_by_name(tmp_path: Path, edit: tuple[str, str], key: str) -> None:
    with pytest.raises(SpecError) as info:
        campaign(tmp_path, CAMPAIGN.replace(*edit))
    assert info.value.key == key and info.value.exit_code == 2


def test_a_grid_entry_is_validated_where_it_is_written(tmp_path: Path) -> None:
    text = '''file = "campaign.toml"
[grid.HEALTHY]
suspects = { distributed = "jailed" }'''
    with pytest.raises(SpecError) as info:
        parse_link(Table(loads(text, "run.toml"), "run.toml", "campaign"), tmp_path)
    assert info.value.key == "campaign.grid.HEALTHY.suspects.distributed"
    ok = parse_link(Table(loads(text.replace("jailed", "convicted"), "run.toml"), "run.toml", "campaign"), tmp_path)
    assert ok.grid["HEALTHY"].suspects == {"distributed": "convicted"} and len(ok.grid_sha256) == 64


# -- the delta -----------------------------------------------------------------------------------------
def test_argv_is_read_as_flags_with_values_last_one_winning() -> None:
    pos, flags = delta.parse_argv(["python", "-m", "trainer", "--lr", "1e-4", "--lr=2e-4", "--quiet", "--shift",
                                   "-1"])
    assert pos == ("python",)
    assert flags == {"-m": "trainer", "--lr": "2e-4", "--quiet": delta.BARE, "--shift": "-1"}


def test_the_distributed_machinery_is_one_delta_when_it_is_the_suspect(tmp_path: Path) -> None:
    parent = spec("demosonly", BASE, gpus=tuple(range(8)))
    run = spec("disc", [a for a in BASE if a != "--chunk-grad-allreduce"], gpus=(0,))
    d = delta.compute(run, parent, link(tmp_path, parent="demosonly", suspect="distributed"), campaign(tmp_path))
    assert [(f.name, f.role) for f in d.factors] == [("--chunk-grad-allreduce", "suspect"), ("gpus", "suspect")]
    assert d.counted == ("suspect distributed",) and not d.refused
    assert "--log" not in d.summary()  # outputs/{name}/…: the run's own name is not a delta


def test_two_factors_are_refused_and_named(tmp_path: Path) -> None:
    parent = spec("demosonly", BASE)
    argv = [*BASE]
    argv[argv.index("--image-augment") + 1] = "0"
    argv[argv.index("--batch-size") + 1] = "48"
    run = spec("aug_off", argv)
    d = delta.compute(run, parent, link(tmp_path, parent="demosonly", suspect="image-augment"), campaign(tmp_path))
    assert d.refused and d.counted == ("suspect image-augment", "--batch-size: 96 → 48 (suspect eff-96)")
    error = delta.refusal(d, "runs/aug_off.toml")
    assert error.exit_code == 2
    assert "2 deltas vs parent 'demosonly'" in error.message and "--batch-size: 96 → 48" in error.message
    assert "multi_delta" in (error.hint or "")
    deliberate = delta.compute(run, parent, link(tmp_path, parent="demosonly", suspect="image-augment",
                                                 multi_delta=True), campaign(tmp_path))
    assert not deliberate.refused


def test_declared_platform_deltas_and_machinery_knobs_are_shown_not_counted(tmp_path: Path) -> None:
    parent = spec("demosonly", [*BASE, "--num-workers", "8"], env={"DATA": "/box"})
    run = spec("local", [*BASE, "--num-workers", "4"], env={"DATA": "/local"}, knobs=("--num-workers",))
    d = delta.compute(run, parent, link(tmp_path, parent="demosonly", platform=("env.DATA",)), campaign(tmp_path))
    assert [f.role for f in d.factors] == ["platform", "platform"] and d.counted == () and not d.refused
    assert d.lines()[0].endswith("[declared platform-only]")


def test_a_fallback_profile_change_is_a_factor(tmp_path: Path) -> None:
    parent = spec("a", BASE, attempts=(AttemptProfile("p1"), AttemptProfile("fallback", ("--grad-ckpt",))))
    run = spec("b", BASE, attempts=(AttemptProfile("p1"), AttemptProfile("fallback", ("--micro", "2"))))
    (factor,) = delta.compute(run, parent, link(tmp_path), campaign(tmp_path)).factors
    assert factor.name == "fallback profiles" and factor.role == "delta"


# -- the grid ------------------------------------------------------------------------------------------
def test_the_plan_is_the_grid_entry_of_the_label(tmp_path: Path) -> None:
    text = '''file = "campaign.toml"
[grid.SAME-DRIFT]
suspects = { distributed = "exonerated", image-augment = "live" }
say = "The distributed path is EXONERATED."
bank = "banked/{name}"
propose = { suspect = "image-augment", set = { "--image-augment" = "0" } }
[grid.AMBIGUOUS]
extend_to = 1500
owner_call = "extend to 1500+ vs the next single-delta run"'''
    g = parse_link(Table(loads(text, "run.toml"), "run.toml", "campaign"), tmp_path).grid
    p = grid.plan("disc", "SAME-DRIFT", g, "interpretation")
    assert p.sentence == "The distributed path is EXONERATED." and p.bank_to == "banked/disc"
    assert p.moves == (("distributed", "exonerated"), ("image-augment", "live"))
    assert p.options == ("launch", "hold") and "image-augment" in str(p.question)
    amb = grid.plan("disc", "AMBIGUOUS", g, "the prereg says")
    assert amb.options == ("extend", "hold") and amb.question == "extend to 1500+ vs the next single-delta run"
    assert amb.sentence == "the prereg says"  # no `say`: the prereg's interpretation
    none = grid.plan("disc", "HEALTHY", g, None)
    assert none.moves == () and none.question is None and none.options == ("hold",)


def test_the_suspect_table_is_the_declaration_plus_each_move_in_order(tmp_path: Path) -> None:
    c = campaign(tmp_path)
    rows = grid.suspect_table(c, [{"suspect": "distributed", "status": "exonerated", "run": "disc", "label": "SD"},
                                  {"suspect": "image-augment", "status": "live", "run": "disc", "label": "SD"},
                                  {"suspect": "image-augment", "status": "convicted", "run": "aug", "label": "H"},
                                  {"suspect": "gone", "status": "live", "run": "x", "label": "y"}])
    assert [(r.name, r.status, r.by_run) for r in rows] == [
        ("distributed", "exonerated", "disc"), ("image-augment", "convicted", "aug"), ("eff-96", "untested", None)]
    assert rows[1].declared == "untested"


def test_a_proposal_changes_exactly_its_flag() -> None:
    argv = ["python", "-m", "trainer", "--image-augment", "0.8", "--lr=3e-4", "--recompute-stats", "--steps", "1000"]
    assert propose.edit_argv(argv, {"--image-augment": "0"}, ()) == [*argv[:4], "0", *argv[5:]]
    assert propose.edit_argv(argv, {"--lr": "1e-4"}, ())[5] == "--lr=1e-4"
    assert propose.edit_argv(argv, {}, ["--recompute-stats", "--steps"]) == argv[:6]
    assert propose.edit_argv(argv, {"--seed": "1"}, ())[-2:] == ["--seed", "1"]
    _, old = delta.parse_argv(argv)
    _, new = delta.parse_argv(propose.edit_argv(argv, {"--image-augment": "0"}, ()))
    assert {k for k in old if old[k] != new.get(k)} == {"--image-augment"}


# -- banking -------------------------------------------------------------------------------------------
def test_bank_copies_with_a_verified_sha256_manifest_once(tmp_path: Path) -> None:
    source = tmp_path / "ck"
    (source / "sub").mkdir(parents=True)
    (source / "step_000500.pt").write_bytes(b"weights-500" * 1000)
    (source / "sub" / "latest").write_text("step_000500.pt")
    dest = tmp_path / "banked" / "disc"
    manifest = actions.bank(source, dest, run="disc", label="HEALTHY", now=1.0)
    assert manifest["verified"] is True and {f["path"] for f in manifest["files"]} == {"step_000500.pt", "sub/latest"}
    assert json.loads((dest / "manifest.json").read_text())["files"] == manifest["files"]
    assert actions.verify(dest)["verified"] is True
    assert actions.bank(source, dest, run="disc", label="HEALTHY", now=2.0)["banked_at"] == 1.0  # redone: kept
    (dest / "step_000500.pt").write_bytes(b"tampered")
    checked = actions.verify(dest)
    assert checked["verified"] is False and "step_000500.pt: sha256" in checked["problems"][0]
    with pytest.raises(actions.BankError, match="no checkpoints"):
        actions.bank(tmp_path / "empty", tmp_path / "b2", run="x", label="L", now=0)
