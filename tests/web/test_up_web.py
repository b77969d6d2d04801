"""`babysit up --web PORT`: the daemon serves the page, and a page that cannot start never stops babysitting."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from babysit.core.errors import EXIT_BAD_INPUT
from tests.scenarios.conftest import PY, store_of
from tests.support import register, run_toml

FAKE = Path(__file__).resolve().parents[1] / "reliability" / "fake_trainer.py"


def register_fake(root: Path, name: str = "quick") -> None:
    argv = [PY, str(FAKE), f"outputs/{name}/log.jsonl", "--steps", "20", "--sleep", "0.02"]
    register(root, run_toml(name, argv, log="outputs/{name}/log.jsonl", gpus=[], poll=(60, 60),
                            guards={"min_free_host_ram_gib": 0.1}))


def up(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "babysit", "up", "--accelerated", "--no-view", "--exit-when-idle",
                           "--registry", str(root / "babysit.toml"), *args], cwd=root, capture_output=True, text=True,
                          timeout=120, env=env)


def test_a_port_in_use_costs_the_page_not_the_babysitting(tmp_path: Path) -> None:
    register_fake(tmp_path)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        res = up(tmp_path, "--web", str(held.getsockname()[1]))
    assert res.returncode == 0, res.stderr
    store = store_of(tmp_path)
    try:
        assert store.run_state("quick")[0] == "finished"
    finally:
        store.close()
    log = (tmp_path / ".babysit" / "daemon.log").read_text()
    assert "web server not started; babysitting goes on without it" in log and "Errno 98" in log


def test_a_web_bind_without_its_token_is_refused_before_anything_starts(tmp_path: Path) -> None:
    register_fake(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "BABYSIT_WEB_TOKEN"}
    res = up(tmp_path, "--web", "0", "--web-bind", "0.0.0.0", env=env)
    assert res.returncode == EXIT_BAD_INPUT and "BABYSIT_WEB_TOKEN" in res.stderr
    assert not (tmp_path / ".babysit" / "state.db").exists()  # nothing launched


def test_the_daemon_serves_the_page_while_it_babysits(tmp_path: Path) -> None:
    register_fake(tmp_path)
    res = up(tmp_path, "--web", "0")
    assert res.returncode == 0, res.stderr
    assert "babysit web: serving http://127.0.0.1:" in res.stdout
    assert '"web page up"' in (tmp_path / ".babysit" / "daemon.log").read_text()
