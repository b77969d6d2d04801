"""`babysit demo --fleet` (and docs/fleet.md's `python examples/fleet_demo.py`, the same demo) runs as
written: two boxes on one throwaway PostgreSQL, a status listing both, an abort asked on one box carried
out by the other, a killed box posted lost once and its run shown host-lost, an abort of that run told at
once that it waits for the lost box, and both boxes' posts as one channel. Without the
PostgreSQL server binaries it stops at once with exit 2, naming what to install."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from babysit.cli import main as cli_main
from babysit.db.localserver import PostgresUnavailable, find_bin_dir
from babysit.demo import fleet

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_babysit_demo_fleet_runs_as_the_docs_say(tmp_path: Path) -> None:
    try:
        find_bin_dir()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    env = {k: v for k, v in os.environ.items() if k not in ("BABYSIT_STORE_URL", "BABYSIT_HOST", "SLACK_BOT_TOKEN")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-m", "babysit", "demo", "--fleet"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "box box-a: up" in text and "box box-b: up" in text  # status on box-a lists both boxes
    rows = [line.split() for line in text.splitlines() if line.startswith(("train-a ", "train-b "))]
    assert rows and all(r[2:4] == ["1/3", "default"] for r in rows), rows  # before: train-b's was "1 default"
    assert "abort train-a: stopping" in text  # asked on box-b, carried out by box-a
    assert text.count("🚨 box box-b lost") == 2  # the killed box, posted once (shown, then in the channel)
    lost = text.split("== `babysit status` on box-a: box-b LOST", 1)[1].split("\n== ", 1)[0]
    # docs/demo.md: status shows the killed box's run host-lost (before: train-b was aborted, so `stopped`)
    assert "box box-b: LOST" in lost and "train-b" in lost and "host-lost" in lost, lost
    assert "abort train-b: queued (request" in text and "for box box-b, out of sight now (box box-b: LOST" in text
    channel = text.split("== the channel", 1)[1]
    assert "[box-a] 🚨 box box-b lost" in channel and "[box-b]" in channel, channel  # both boxes' posts, one list


def test_the_fleet_demo_without_postgresql_says_what_to_install_and_exits_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def missing() -> Path:  # this machine has the binaries: their absence, as find_bin_dir reports it
        raise PostgresUnavailable("no PostgreSQL server binaries (initdb, pg_ctl): `apt-get install postgresql`")

    monkeypatch.setattr(fleet, "find_bin_dir", missing)
    assert cli_main(["demo", "--fleet"]) == 2
    err = capsys.readouterr().err
    assert "ERROR: babysit demo --fleet needs PostgreSQL's server programs" in err, err
    assert "HINT: install them — Debian/Ubuntu: `apt-get install postgresql`" in err, err
    assert cli_main(["demo", "--fleet", "--only", "drift"]) == 2
    assert "--only and --dir do not apply" in capsys.readouterr().err
