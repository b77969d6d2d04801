"""Fixtures for the reliability campaign: a workspace whose daemons and attempt process groups are
killed in teardown whatever the test's outcome, and the FINAL verdict of an uninterrupted run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import once_per_session
from tests.reliability.harness import Daemons, check_invariants, make_workspace, run_trial


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    d = Daemons(tmp_path)
    yield d
    d.cleanup()


@pytest.fixture(scope="session")
def baseline_verdict(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The r_prereg FINAL verdict of a daemon never interrupted (and its invariants, as a control); built
    once per session, whichever xdist worker needs it first."""
    import json
    import random

    def build() -> dict:
        root = tmp_path_factory.mktemp("baseline")
        make_workspace(root, runs=("r_prereg",))
        d = Daemons(root)
        try:
            trial = run_trial(root, d, random.Random(0), kills=0)
            assert trial.violations == [], trial.violations
            assert check_invariants(root, None, runs=("r_prereg",)) == []
            return json.loads((root / ".babysit" / "verdicts" / "r_prereg.json").read_text())
        finally:
            d.cleanup()

    return once_per_session(tmp_path_factory, "reliability-baseline-verdict", build)
