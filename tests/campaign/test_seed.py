"""The seed's numbers (shared/seeds/003) as a test: the discriminator, its references taken from the
campaign's banked deltas by name, amended by scale 12.5087/3.4623, reads exactly as the seed's rules —
and its register-time delta is the distributed machinery alone."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from babysit.core.campaign import delta, grid
from babysit.core.campaign.spec import load_campaign
from babysit.core.errors import SpecError
from babysit.core.spec.amendment import load_amendment, what_if
from babysit.core.spec.run_toml import load_spec
from babysit.core.verdict import AMBIGUOUS_BY_INSTRUMENT, evaluate, fixture_result, shown_bound
from babysit.register.campaign_join import parent_spec

FIXTURES = Path(__file__).parent.parent / "fixtures"
DISC = FIXTURES / "campaign" / "disc.toml"


def test_references_come_from_the_campaign_by_name_and_are_frozen() -> None:
    spec = load_spec(DISC)
    assert dict(spec.prereg.references) == {"demosonly": 2.0317, "mixedv2": 2.3319, "run2_pooled": 0.4640,
                                            "rigonly": 0.6929}
    assert '"demosonly":2.0317' in spec.prereg.canonical  # in the hash register freezes


def test_a_retyped_reference_must_equal_the_banked_delta(tmp_path: Path) -> None:
    text = DISC.read_text().replace("# no [prereg.references]", "[prereg.references]\ndemosonly = 2.0371\n#")
    (tmp_path / "disc.toml").write_text(text.replace('file = "campaign.toml"',
                                                     f'file = "{FIXTURES / "campaign" / "campaign.toml"}"').replace(
        '"../verdict/', f'"{FIXTURES / "verdict"}/'))
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "disc.toml")
    assert info.value.key == "prereg.references.demosonly" and "2.0317" in info.value.message


def test_the_amended_discriminator_reads_exactly_as_the_seed_rules() -> None:
    spec = load_spec(DISC)
    amendment = what_if(load_amendment(FIXTURES / "verdict" / "scale_amendment.toml"), 1)
    at = {}
    for read in ("0.2000", "0.6929", "1.0158", "1.0838", "1.0839", "2.0317", "3.6700", "3.6701", "4.0000"):
        series = [(500, 3.4623), (1000, float(Fraction("3.4623") + Fraction(read)))]
        v = evaluate(spec.prereg, [amendment], series)
        assert v.status == "FINAL" and f"{v.delta:+.4f}" == f"+{read}"
        at[read] = (v.rules[0].label, v.rules[1].label, v.label)
    # (a) raw: <= +0.30 HEALTHY, >= +1.01585 SAME-DRIFT; (b) x 12.5087/3.4623: <= +1.0838.. HEALTHY, >= +3.6700.. drift
    assert at == {
        "0.2000": ("HEALTHY", "HEALTHY", "HEALTHY"),
        "0.6929": ("AMBIGUOUS", "HEALTHY", AMBIGUOUS_BY_INSTRUMENT),
        "1.0158": ("AMBIGUOUS", "HEALTHY", AMBIGUOUS_BY_INSTRUMENT),  # the exact bound is 1.01585
        "1.0838": ("SAME-DRIFT", "HEALTHY", AMBIGUOUS_BY_INSTRUMENT),
        "1.0839": ("SAME-DRIFT", "AMBIGUOUS", AMBIGUOUS_BY_INSTRUMENT),
        "2.0317": ("SAME-DRIFT", "AMBIGUOUS", AMBIGUOUS_BY_INSTRUMENT),
        "3.6700": ("SAME-DRIFT", "AMBIGUOUS", AMBIGUOUS_BY_INSTRUMENT),
        "3.6701": ("SAME-DRIFT", "SAME-DRIFT", "SAME-DRIFT"),
        "4.0000": ("SAME-DRIFT", "SAME-DRIFT", "SAME-DRIFT"),
    }
    rules = evaluate(spec.prereg, [amendment], [(500, 3.4623), (1000, 3.4623)]).rules
    shown = [(float(shown_bound(b.max, 4, "max")[0]) if b.max is not None else None,
              float(shown_bound(b.min, 4, "min")[0]) if b.min is not None else None) for r in rules for b in r.bands]
    assert shown == [(0.3, None), (None, 1.01585), (1.0838, None), (None, 3.6701)]  # the seed's 1.084 / 3.670
    assert float(rules[1].scale) == pytest.approx(3.613, abs=5e-4)


def test_the_fixture_still_reads_rigonly_as_ambiguous() -> None:
    from babysit.verdict.reading import read_series

    spec = load_spec(DISC)
    series, train, _ = read_series(spec.prereg.fixture.log, spec.prereg)
    result = fixture_result(spec.prereg, series, train)
    assert result.ok and result.got_delta == 0.6929 and result.got_label == "AMBIGUOUS"


def test_each_seed_label_maps_to_its_grid_actions() -> None:
    spec = load_spec(DISC)
    g = spec.campaign.grid
    healthy = grid.plan(spec.name, "HEALTHY", g, None)
    assert healthy.moves == (("distributed", "convicted"),) and healthy.bank_to == f"banked/{spec.name}"
    same = grid.plan(spec.name, "SAME-DRIFT", g, spec.prereg.interpretation["SAME-DRIFT"])
    assert dict(same.moves) == {"distributed": "exonerated", "image-augment": "live", "eff-96": "live",
                                "recompute-stats": "live", "init-checkpoint": "live", "corpus-scale": "live"}
    assert same.bank_to is None and same.options == ("launch", "hold")  # not load-bearing: not banked
    amb = grid.plan(spec.name, "AMBIGUOUS", g, None)
    assert amb.options == ("launch", "extend", "hold") and "extend to 1500+" in str(amb.question)
    abi = grid.plan(spec.name, AMBIGUOUS_BY_INSTRUMENT, g, None)
    assert abi.moves == () and "stack-parity probe" in str(abi.question)


def test_the_discriminators_only_delta_is_the_distributed_machinery(tmp_path: Path) -> None:
    spec = load_spec(DISC)
    campaign = load_campaign(spec.campaign.file)
    parent = parent_spec("demosonly", campaign, tmp_path / "babysit.toml", "disc.toml")
    d = delta.compute(spec, parent, spec.campaign, campaign)
    roles = {f.name: f.role for f in d.factors}
    assert roles == {"--backward-chunks": "platform", "--chunk-grad-allreduce": "suspect", "--num-workers": "platform",
                     "gpus": "suspect", "executor": "suspect"}
    assert d.counted == ("suspect distributed",) and not d.refused
