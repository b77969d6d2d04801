"""docs/fleet.md's one-machine try, `python examples/fleet_demo.py`, runs as written: two boxes on one
throwaway PostgreSQL, a status listing both, an abort asked on one box carried out by the other, and a
killed box posted lost once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from babysit.db.localserver import PostgresUnavailable, find_bin_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_fleet_demo_runs_as_the_docs_say(tmp_path: Path) -> None:
    try:
        find_bin_dir()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    env = {k: v for k, v in os.environ.items() if k not in ("BABYSIT_STORE_URL", "BABYSIT_HOST", "SLACK_BOT_TOKEN")}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "fleet_demo.py")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "box box-a: up" in text and "box box-b: up" in text  # status on box-a lists both boxes
    assert "abort train-b: stopping" in text  # asked on box-a, carried out by box-b
    assert text.count("🚨 box box-b lost") == 1  # the killed box, posted once
    assert "box box-b: LOST" in text
