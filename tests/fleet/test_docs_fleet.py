"""docs/fleet.md is a newcomer's setup page: its commands, run in its order against a real PostgreSQL,
do what it says (the database made, the url and host name in babysit.toml, the schema upgraded, a box's
SQLite history copied over, `babysit up`, every box in `status`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from babysit.db.store import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "fleet.md"
V2 = ROOT / "tests" / "fixtures" / "store" / "state_v2.db"
DOC_URL = "postgresql://babysit@db.lab/babysit"


def setup_blocks() -> list[tuple[str, str]]:
    """The fenced blocks of the 'Setup, step by step' section, in order: (language, text)."""
    section = DOC.read_text().split("## Setup, step by step", 1)[1].split("\n## ", 1)[0]
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w*)\n(.*?)```", section, re.S)]


def test_the_setup_page_runs_as_written(postgres: Any, tmp_path: Path) -> None:
    blocks = setup_blocks()
    commands = [line.split("#")[0].strip() for lang, text in blocks if lang == "" for line in text.splitlines()]
    commands = [c for c in commands if c]
    toml = "\n".join(text for lang, text in blocks if lang == "toml")
    assert DOC_URL in toml and "[host]" in toml
    assert commands[0] == "createdb babysit" and "babysit db upgrade" in commands and "babysit up" in commands[-1]

    url = postgres.url("babysit")
    (tmp_path / "babysit.toml").write_text(toml.replace(DOC_URL, url))
    (tmp_path / ".babysit").mkdir()
    shutil.copy(V2, tmp_path / ".babysit" / "state.db")  # this box has history: step 5 moves it
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PGHOST": str(postgres.sock), "PGUSER": "postgres",
           "BABYSIT_GPU_PROBE": "none", "PATH": f"{postgres.bin_dir}:{os.environ['PATH']}"}
    for key in ("BABYSIT_STORE_URL", "BABYSIT_HOST", "SLACK_BOT_TOKEN"):
        env.pop(key, None)
    outputs = {}
    for command in commands:
        argv = command.split()
        if argv[0] == "babysit":
            argv = [sys.executable, "-m", "babysit", *argv[1:]]
            if argv[3:4] == ["up"] or command == "babysit up":
                argv.append("--exit-when-idle")  # the page's daemon runs on; here it stops once idle
            argv = [a.replace(DOC_URL, url) for a in argv]
        out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (command, out.stdout, out.stderr)
        outputs[command] = out.stdout
    assert f"schema 0 -> {SCHEMA_VERSION}" in outputs["babysit db upgrade"]
    assert f"schema {SCHEMA_VERSION} (this babysit: {SCHEMA_VERSION})" in outputs["babysit db version"]
    copy = next(v for k, v in outputs.items() if k.startswith("babysit db copy"))
    assert "every table compared equal" in copy
    status = subprocess.run([sys.executable, "-m", "babysit", "status"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "box box-a: down (daemon stopped)" in status.stdout, status.stdout  # its daemon ran, then stopped
