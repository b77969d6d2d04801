"""What babysit says about reading printed output, on a fleet (docs/your-trainer.md, docs/fleet.md): two
real daemons with different host names on one real PostgreSQL behind one local Slack server; box-a
babysits two stdout-source runs, box-b nothing. `drift` prints lines the general reader reads, then 700
lines it cannot, then ends quietly: the answer "read by the general reader" and the records-stopped
incident. `mute` prints only lines nothing reads: the answer with a pattern that would, and the
`log-unreadable` incident at its quiet end. Each reaches Slack once (box-b posts none of box-a's rows),
in its run's thread."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet.helpers import PY, babysit, box_env, kill_trainers, pg_store, posted_ids, stop, up
from tests.reliability.harness import gpu_file
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.support import run_toml, wait_for

DRIFT = ("import time\nfor i in range(1, 21):\n    print(f'step {i} | loss {1 / i:.4f}', flush=True)\n"
         "for i in range(700):\n    print(f'phase two: item {i} done', flush=True)\n    time.sleep(0.01)\n")
MUTE = ("import time\nfor i in range(1, 40):\n    print(f'upd {i * 10} loss={1 / i:.4f}', flush=True)\n"
        "    time.sleep(0.01)\n")


def _spec(box: Path, run: str, script: str) -> Path:
    (box / f"{run}.py").write_text(script)
    spec = box / f"{run}.toml"
    spec.write_text(run_toml(run, [PY, f"{run}.py"], gpus=[], source={"kind": "stdout", "preset": "auto"},
                             guards={"min_free_host_ram_gib": 0.01}, retry={"max_attempts": 1}, poll=(600, 600)))
    return spec


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str) -> Iterator[FakeSlack]:
    fake = FakeSlack(TOKEN).start()
    boxes, procs = {}, []
    try:
        for name in ("box-a", "box-b"):
            box = boxes[name] = tmp_path / name
            box.mkdir()
            gpu_file(box / "gpus.json")
            (box / "babysit.toml").write_text(f'[daemon]\nchannel = "C0RUNS"\nguard_interval_seconds = 3600\n'
                                              f'[store]\nurl = "{pg_url}"\n[host]\nname = "{name}"\n'
                                              'lease_seconds = 3\n')
        for run, script in (("drift", DRIFT), ("mute", MUTE)):
            out = babysit(boxes["box-a"], "register", str(_spec(boxes["box-a"], run, script)), "--accelerated")
            assert out.returncode == 0, out.stderr
        for box in boxes.values():
            env = {**box_env(box), "SLACK_BOT_TOKEN": TOKEN, "BABYSIT_SLACK_API_URL": fake.api_url}
            env.pop("BABYSIT_SLACK_CHANNEL", None)
            procs.append(up(box, env))
        yield fake
    finally:
        for proc in procs:
            stop(proc)
        kill_trainers(pg_url)
        fake.stop()
        for box in boxes.values():  # shown when the test failed: what each daemon did
            for log in (box / "daemon-out.txt", box / ".babysit" / "daemon.log"):
                print(f"--- {log}", *(log.read_text().splitlines()[-40:] if log.exists() else []), sep="\n")


def _thread(fake: FakeSlack, run: str) -> list[str]:
    """What was posted in `run`'s thread (its launch post's replies), each post's blocks and text."""
    mine = [m for m in fake.messages if ((m.get("metadata") or {}).get("event_payload") or {}).get("run") == run]
    (root,) = [m for m in mine if m["thread_ts"] is None]
    assert all(m["thread_ts"] == root["ts"] for m in mine if m is not root), mine
    return [json.dumps(m.get("blocks") or m["text"]) + m["text"] for m in mine if m is not root]


def test_the_answers_about_reading_reach_slack_once_each_in_the_run_s_thread_from_its_own_box(
        fleet: FakeSlack, pg_url: str) -> None:
    fake = fleet
    store = pg_store(pg_url)
    try:
        for run in ("drift", "mute"):
            wait_for(f"{run} ended", lambda run=run: [a for a in store.attempts(run) if a.status == "ended"],
                     timeout=90)
        wait_for("every post delivered", lambda: store.pending_count() == 0 and all(
            m.status == "sent" for m in store.messages()), timeout=30)
        assert store.run_hosts() == {"drift": "box-a", "mute": "box-a"}
        posted = posted_ids(fake)
        assert [i for i, n in posted.items() if n > 1] == [], "a post was delivered twice"
        rows = {m.id: m for m in store.messages() if m.kind != "header"}
        assert set(posted) == set(rows), (sorted(posted), sorted(rows))
        assert {r["host"] for r in store._query("SELECT host FROM outbox")} == {"box-a"}  # box-b posted none

        drift = _thread(fake, "drift")
        (read,) = [t for t in drift if "📖" in t]
        assert "drift: its printed lines are read by the general reader" in read and "reading step 1: loss=1" in read
        (stopped,) = [t for t in drift if "its output goes on but gives no record" in t]
        assert "since the last record (step 20" in stopped and "phase two: item" in stopped, stopped
        assert not [t for t in drift if "ended with no record read" in t]  # it read 20 records

        mute = _thread(fake, "mute")
        (unread,) = [t for t in mute if "📖" in t]
        assert "mute: nothing reads its printed lines yet" in unread and "A pattern that would read it:" in unread
        assert "babysit run --pattern " in unread, unread
        (at_exit,) = [t for t in mute if "log-unreadable" in t or "ended with no record read" in t]
        assert "attempt 1 ended with no record read: its losses were never watched" in at_exit, at_exit
        assert "A pattern that would read it:" in at_exit and "under [source]" in at_exit, at_exit
        # its source is stdout already (before, the incident said to write `[source] kind = "stdout"`)
        assert 'kind = "stdout"' not in at_exit.replace('\\"', '"'), at_exit
        assert [i.kind for i in store.incidents("mute")] == ["log-unreadable"]
        assert [i.kind for i in store.incidents("drift")] == ["log-unreadable"]
    finally:
        store.close()
