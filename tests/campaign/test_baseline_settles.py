"""A single-delta run is read against its parent, so its grid waits for the parent (docs/campaigns.md,
"When the FINAL verdict lands"). Through the demo's own campaign `drift_saga` — its run.tomls written by
babysit/demo/runner.py, registered through the real CLI, the amendment recorded by `babysit amend`'s own
code, each FINAL verdict read by a real RunSupervisor from a real log and carried out through the
daemon's hook into a real store: the child `drift_aug` landing HEALTHY before its parent `drift_disc`
moves nothing and says it is pending on what; the parent landing AMBIGUOUS-BY-INSTRUMENT suspends it,
visibly (the post, `campaign show`, the chart's data, the web page); a usable parent carries it out
then, once; an amendment recorded after the conclusion was carried out suspends it.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from babysit.campaign import history, hook, settle
from babysit.campaign.saga import outcome_label
from babysit.cli import main as cli_main
from babysit.commands.amend import amend_registered
from babysit.commands.demo import REFERENCES
from babysit.core.render import render
from babysit.core.spec.amendment import load_amendment
from babysit.core.spec.run_toml import load_spec
from babysit.db.url import open_store
from babysit.demo import runner
from babysit.probes.gpu import open_gpu_probe
from babysit.run.context import DaemonContext
from babysit.run.supervisor import RunSupervisor
from babysit.runtime import registry
from babysit.service.roster import open_executor
from babysit.web.server import Settings, WebServer
from tests.web.conftest import fetch

# eval_chunk_mae at the baseline (500) and the read (1000): drift_disc as the demo measures it (Δ +0.0205:
# SAME-DRIFT by the original rule, AMBIGUOUS under the ×2.5 amendment), drift_aug Δ +0.0025 → HEALTHY.
PARENT = {500: 0.2620, 1000: 0.2825}
CHILD = {500: 0.2600, 1000: 0.2625}
SUSPECT, PARENT_RUN, CHILD_RUN, CAMPAIGN = "no-augment", runner.DRIFT_RUN, runner.AUG_RUN, runner.CAMPAIGN


class Demo:
    """The demo's workspace with drift_disc and its campaign registered; runs' logs written by hand and
    their verdicts read by the daemon's own supervisor."""

    def __init__(self, root: Path, store_url: str | None = None) -> None:
        self.root = runner.make_workspace(root)
        drift, _, _, self.amendment = runner.write_runs(self.root, REFERENCES)
        self.reg = self.root / "babysit.toml"
        if store_url is not None:  # a fleet's box: the same story on PostgreSQL
            with self.reg.open("a") as f:
                f.write(f'\n[store]\nurl = "{store_url}"\n\n[host]\nname = "box-a"\n')
        assert cli_main(["register", str(drift), "--accelerated", "--registry", str(self.reg)]) == 0
        assert cli_main(["campaign", "register", str(self.root / "runs" / "campaign.toml"), "--accelerated",
                         "--registry", str(self.reg)]) == 0
        self.state_dir = registry.load(self.reg).state_dir
        self.store = open_store(registry.load(self.reg))
        self.ctx = DaemonContext(store=self.store, state_dir=self.state_dir, gpu_probe=open_gpu_probe("none"),
                                 executors={"local": open_executor("local", self.state_dir)}, scale=1.0)
        self.supervisors: dict[str, RunSupervisor] = {}

    def close(self) -> None:
        self.store.close()

    def log(self, run: str, evals: dict[int, float], through: int) -> None:
        """The trainer's JSONL log up to step `through`: an eval every 50 steps, the given values exactly."""
        path = self.root / "outputs" / run / "train_log.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        lo, hi = evals[500], evals[1000]
        with path.open("w") as f:
            for step in range(0, through + 1, 50):
                value = evals.get(step, lo + (hi - lo) * (step - 500) / 500 if step > 500 else 0.30 - step * 7.6e-5)
                f.write(json.dumps({"step": step, "ts": time.time(), "eval_chunk_mae": round(value, 6),
                                    "train_chunk_mae": round(value, 6)}) + "\n")

    def checkpoints(self, run: str) -> None:
        ck = self.root / "outputs" / run / "checkpoints"
        ck.mkdir(parents=True, exist_ok=True)
        (ck / "step_001000.pt").write_bytes(b"weights" * 100)
        (ck / "latest").write_text("step_001000.pt")

    def read(self, run: str) -> dict[str, Any]:
        """The daemon's verdict read of `run` (a FINAL one goes through its hook into the campaign)."""
        sup = self.supervisors.get(run)
        if sup is None:
            reg = registry.load(self.reg)
            entry = reg.find(run)
            sup = self.supervisors[run] = RunSupervisor(self.ctx, load_spec(reg.spec_path(entry)),
                                                        entry.prereg_sha256)
        sup.runlog.read_log()
        sup.verdicts.read(full=True)
        verdict = self.store.final_verdict(run) or self.store.latest_verdict(run)
        assert verdict is not None
        return verdict.body

    def posts(self, run: str) -> list[str]:
        return [render(m.kind, m.payload).text for m in self.store.messages(run) if m.kind == "campaign"]

    def events(self, kind: str, run: str = CHILD_RUN) -> list[dict[str, Any]]:
        return [e.body for e in self.store.campaign_events(CAMPAIGN, kind) if e.run == run]

    def view(self) -> history.View:
        return history.collect(self.reg, CAMPAIGN, curves=True)

    def suspect(self) -> dict[str, Any]:
        return next(s for s in self.view().to_json()["suspects"] if s["name"] == SUSPECT)

    def show(self, *args: str, capsys: pytest.CaptureFixture[str]) -> str:
        capsys.readouterr()
        assert cli_main(["campaign", "show", CAMPAIGN, "--registry", str(self.reg), *args]) == 0
        return capsys.readouterr().out


@pytest.fixture(params=["sqlite", "postgresql"])
def demo(request: pytest.FixtureRequest, tmp_path: Path) -> Demo:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    d = Demo(tmp_path / "demo", url)
    assert cli_main(["register", str(d.root / "runs" / f"{CHILD_RUN}.toml"), "--accelerated",
                     "--registry", str(d.reg)]) == 0
    d.checkpoints(CHILD_RUN)
    yield d
    d.close()


def amend_parent(demo: Demo) -> None:
    """`babysit amend drift_disc runs/amendment-1.toml` with the step-250 eval in, as the demo declares it."""
    demo.log(PARENT_RUN, PARENT, through=250)
    record, _ = amend_registered(demo.reg, PARENT_RUN, demo.amendment, datetime.now(timezone.utc))
    assert record.data_seen_through_step == 250


def nothing_drawn_from_the_child(demo: Demo) -> None:
    assert demo.events("suspect") == []
    assert demo.suspect()["status"] == "live"
    assert not (demo.root / "runs" / "banked" / CHILD_RUN).exists()
    assert not (demo.root / "runs" / "proposals").exists() or not list((demo.root / "runs" / "proposals").iterdir())
    assert [c for c in demo.store.owner_calls(CAMPAIGN) if c.run == CHILD_RUN] == []


def test_a_child_landing_before_its_parent_is_pending_then_suspended_by_an_instrument_ambiguous_parent(
        demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    amend_parent(demo)
    demo.log(PARENT_RUN, PARENT, through=600)
    assert demo.read(PARENT_RUN)["status"] == "PROVISIONAL"

    demo.log(CHILD_RUN, CHILD, through=1000)
    child = demo.read(CHILD_RUN)
    assert (child["status"], child["label"]) == ("FINAL", "HEALTHY")
    # its own words, not its parent's (issue 25, item 2)
    assert "augmentation" in child["interpretation"] and "distributed" not in child["interpretation"]

    # pending: nothing moves, is banked or proposed; it says on what it waits
    nothing_drawn_from_the_child(demo)
    (pending,) = demo.events("pending")
    assert pending["parent"] == PARENT_RUN
    assert pending["why"].startswith(f"{PARENT_RUN}'s FINAL verdict at step 1000 (now PROVISIONAL @600")
    (post,) = demo.posts(CHILD_RUN)
    assert "outcome PENDING" in post and f"waiting for {PARENT_RUN}'s FINAL verdict at step 1000" in post
    assert "CONVICTED" not in post.split("\n")[0]
    # every line naming an effect says in itself that it has not happened (before: `then: suspect … → convicted`,
    # which quoted alone, in a notification or a search hit, reads as the conviction)
    assert f"  PENDING, not done yet: suspect {SUSPECT} → convicted" in post.splitlines(), post
    effects = [x for x in post.splitlines() if any(w in x for w in ("→ convicted", "→ exonerated", "bank", "propos"))]
    assert effects and all("PENDING" in x or "not done" in x or x.lstrip().startswith("if it lands") for x in effects), \
        effects
    assert any(h.startswith("PENDING: → convicted by drift_aug (HEALTHY)") for h in demo.suspect()["held"])
    shown = demo.show(capsys=capsys)
    assert f"outcome PENDING: {PARENT_RUN}'s FINAL verdict at step 1000" in shown

    # the parent lands FINAL AMBIGUOUS-BY-INSTRUMENT: the child's conclusion is suspended
    demo.log(PARENT_RUN, PARENT, through=1000)
    parent = demo.read(PARENT_RUN)
    assert (parent["status"], parent["label"]) == ("FINAL", "AMBIGUOUS-BY-INSTRUMENT")
    nothing_drawn_from_the_child(demo)
    (suspended,) = demo.events("suspended")
    assert suspended["parent"] == PARENT_RUN and "AMBIGUOUS-BY-INSTRUMENT" in suspended["why"]
    assert demo.events("carried") == []
    post = demo.posts(CHILD_RUN)[-1]
    assert "conclusion SUSPENDED" in post.split("\n")[0] and f"parent {PARENT_RUN} read FINAL AMBIGUOUS" in post
    assert "nothing was moved, banked or proposed on it" in post
    assert f"not done: suspect {SUSPECT} → convicted" in post
    # the parent's own post, right after, shows the same suspect table: said, not printed a second time
    (parent_post,) = demo.posts(PARENT_RUN)
    assert f"suspects: unchanged since {CHILD_RUN}'s post (`babysit campaign show {CAMPAIGN}`)" in parent_post
    assert "SUSPENDED: → convicted" in post and "SUSPENDED: → convicted" not in parent_post, parent_post
    # visibly suspended everywhere the campaign is shown
    shown = demo.show(capsys=capsys)
    assert f"⏸ outcome SUSPENDED: parent {PARENT_RUN} read FINAL AMBIGUOUS-BY-INSTRUMENT" in shown
    assert "SUSPENDED: → convicted by drift_aug (HEALTHY)" in shown
    data = json.loads(demo.show("--json", capsys=capsys))
    (run,) = [r for r in data["runs"] if r["name"] == CHILD_RUN]
    assert run["outcome"] == "suspended" and run["label"] == "HEALTHY"
    view = demo.view()
    (drawn,) = [r for r in view.runs if r.name == CHILD_RUN]
    assert drawn.outcome == "suspended" and drawn.curve  # the chart's data: the run is drawn, as suspended
    assert outcome_label(drawn).startswith("outcome SUSPENDED: parent drift_disc")
    assert (demo.state_dir / "campaigns" / f"{CAMPAIGN}.png").stat().st_size > 10_000  # drawn with it
    web = WebServer(demo.reg, Settings(port=0)).start()
    try:
        status, _, body = fetch(web.url + f"campaign/{CAMPAIGN}")
    finally:
        web.stop()
    page = body.decode()
    assert status == 200 and 'class="curve run suspended"' in page and "drift_aug: HEALTHY — SUSPENDED" in page
    assert '<section id="outcomes">' in page and "outcome SUSPENDED — parent drift_disc" in page
    assert "<td>SUSPENDED</td>" in page  # the runs table's outcome column
    # the parent's own grid (its owner call) is its own: carried out
    assert [c.run for c in demo.store.owner_calls(CAMPAIGN)] == [PARENT_RUN]

    # idempotent: a daemon restarting redoes nothing
    before = (len(demo.store.campaign_events(CAMPAIGN)), len(demo.store.messages()))
    hook.catch_up(demo.ctx)
    demo.read(CHILD_RUN)
    assert (len(demo.store.campaign_events(CAMPAIGN)), len(demo.store.messages())) == before


def test_a_usable_parent_landing_after_the_child_carries_the_pending_outcome_out_once(demo: Demo) -> None:
    demo.log(PARENT_RUN, PARENT, through=600)
    demo.read(PARENT_RUN)
    demo.log(CHILD_RUN, CHILD, through=1000)
    demo.read(CHILD_RUN)
    nothing_drawn_from_the_child(demo)

    demo.log(PARENT_RUN, PARENT, through=1000)  # no amendment: Δ +0.0205 → SAME-DRIFT, a usable baseline
    assert demo.read(PARENT_RUN)["label"] == "SAME-DRIFT"
    assert demo.events("suspect") == [{"suspect": SUSPECT, "status": "convicted", "run": CHILD_RUN,
                                       "label": "HEALTHY"}]
    assert demo.suspect()["status"] == "convicted" and demo.suspect()["held"] == []
    assert (demo.root / "runs" / "banked" / CHILD_RUN / "manifest.json").is_file()
    assert (demo.root / "runs" / "proposals" / "drift_saga_lr.toml").is_file()
    assert [c.run for c in demo.store.owner_calls(CAMPAIGN)] == [CHILD_RUN]
    (carried,) = demo.events("carried")
    assert carried["why"] == f"parent {PARENT_RUN} read FINAL SAME-DRIFT"
    post = demo.posts(CHILD_RUN)[-1]
    assert "the missing augmentation is CONVICTED" in post and f"read against: parent {PARENT_RUN}" in post

    # once: every trigger again (the child's read, the parent's, a restarted daemon's catch-up) adds nothing
    before = (len(demo.store.campaign_events(CAMPAIGN)), len(demo.store.messages()),
              len(demo.store.owner_calls(CAMPAIGN)))
    demo.read(CHILD_RUN)
    demo.read(PARENT_RUN)
    hook.catch_up(demo.ctx)
    assert (len(demo.store.campaign_events(CAMPAIGN)), len(demo.store.messages()),
            len(demo.store.owner_calls(CAMPAIGN))) == before
    assert len([p for p in demo.posts(CHILD_RUN) if p.startswith("🧭")]) == 1  # the one carried-out post


def test_an_amendment_recorded_after_the_conclusion_was_carried_out_suspends_it(
        demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    demo.log(PARENT_RUN, PARENT, through=1000)
    assert demo.read(PARENT_RUN)["label"] == "SAME-DRIFT"
    demo.log(CHILD_RUN, CHILD, through=1000)
    demo.read(CHILD_RUN)
    assert demo.suspect()["status"] == "convicted"
    (call,) = [c for c in demo.store.owner_calls(CAMPAIGN) if c.run == CHILD_RUN]

    # the amendment `babysit amend` checked against a log through step 900 lands after the FINAL read
    # (the read raced it): the record is exactly that, with its data-seen step
    amendment = load_amendment(demo.amendment)
    demo.store.add_amendment(PARENT_RUN, amendment.title, amendment.text, "2026-12-01T20:00:00Z", 900)
    hook.catch_up(demo.ctx)  # the daemon's start (`babysit amend` reconciles the same way)

    (suspended,) = demo.events("suspended")
    assert "AMBIGUOUS-BY-INSTRUMENT under amendment 1, recorded after its FINAL read (SAME-DRIFT)" in suspended["why"]
    assert demo.suspect()["status"] == "live"  # the conviction no longer counts
    assert demo.suspect()["held"][0].startswith("SUSPENDED: → convicted by drift_aug (HEALTHY)")
    closed = demo.store.owner_call(call.id)
    assert (closed.decision, closed.decided_by) == ("hold", "babysit") and "withdrawn" in closed.result
    post = demo.posts(CHILD_RUN)[-1]
    assert "conclusion SUSPENDED" in post and f"withdrawn: suspect {SUSPECT} → convicted" in post
    assert "not load-bearing" in post and f"owner call #{call.id} closed" in post
    assert "⏸ outcome SUSPENDED" in demo.show(capsys=capsys)
    before = len(demo.store.messages())
    hook.catch_up(demo.ctx)
    assert len(demo.store.messages()) == before


def test_settle_is_pending_until_the_parent_is_final_and_suspends_on_instrument_ambiguity() -> None:
    run = settle.Baseline("child", "parent", settle.RUN, status="PROVISIONAL", label="HEALTHY", at_step=600,
                          read_step=1000, state="running")
    assert settle.settle(run) == settle.Settlement(
        settle.PENDING, "parent", "parent's FINAL verdict at step 1000 (now PROVISIONAL @600 HEALTHY, parent running)")
    ended = settle.Baseline("child", "parent", settle.RUN, status="NO-READ", state="failed", read_step=1000)
    assert "may never come: parent ended (failed)" in settle.settle(ended).why
    final = settle.Baseline("child", "parent", settle.RUN, status="FINAL", label="SAME-DRIFT")
    assert settle.settle(final).state == settle.SETTLED
    aby = settle.Baseline("child", "parent", settle.RUN, status="FINAL", label="AMBIGUOUS-BY-INSTRUMENT")
    assert settle.settle(aby).state == settle.SUSPENDED
    late = settle.Baseline("child", "parent", settle.RUN, status="FINAL", label="SAME-DRIFT",
                           relabel="AMBIGUOUS-BY-INSTRUMENT", late=(2,))
    assert "under amendment 2" in settle.settle(late).why
    assert settle.settle(settle.Baseline("child", None, settle.NO_PARENT)).state == settle.SETTLED
    assert settle.settle(settle.Baseline("child", "ref", settle.BANKED)).state == settle.SETTLED

    s_ok, s_wait, s_bad = settle.settle(final), settle.settle(run), settle.settle(aby)
    assert settle.next_step(None, s_wait).action == settle.PEND
    assert settle.next_step(settle.PENDING, s_wait) is None
    assert settle.next_step(settle.PENDING, s_ok).action == settle.CARRY
    assert settle.next_step(settle.CARRIED, s_ok) is None
    assert settle.next_step(settle.PENDING, s_bad) == settle.Step(settle.SUSPEND, s_bad, withdraw=False)
    assert settle.next_step(settle.CARRIED, s_bad) == settle.Step(settle.SUSPEND, s_bad, withdraw=True)
    assert settle.next_step(settle.SUSPENDED, s_ok) is None and settle.next_step(settle.SUSPENDED, s_bad) is None


def test_register_warns_when_a_child_copies_its_parents_prereg_words(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    d = Demo(tmp_path / "demo")
    try:
        child = d.root / "runs" / f"{CHILD_RUN}.toml"
        capsys.readouterr()
        assert cli_main(["register", str(child), "--accelerated", "--registry", str(d.reg)]) == 0
        assert "WARNING" not in capsys.readouterr().err  # the demo's child asks its own question
        copied = d.root / "runs" / "drift_aug_copied.toml"
        text = runner.run_toml_drift(sys.executable).replace(f'name = "{PARENT_RUN}"', 'name = "drift_aug_copied"')
        for key, value in REFERENCES.items():
            text = text.replace("{" + key + "}", f"{value:.4f}")
        text = text.replace('"--save-every", "500"]', '"--save-every", "500", "--image-augment", "0.5"]')
        text = text.partition("[campaign]")[0] + f'[campaign]\nfile = "campaign.toml"\nparent = "{PARENT_RUN}"\n' \
            f'suspect = "{SUSPECT}"\n'
        text = text.replace('HEALTHY = "No climb', 'HEALTHY = "With augmentation, no climb')
        copied.write_text(text)
        assert cli_main(["register", str(copied), "--accelerated", "--registry", str(d.reg)]) == 0  # not refused
        err = capsys.readouterr().err
        assert f"WARNING: {copied}: prereg.question: its parent {PARENT_RUN}'s text, word for word" in err
        for label in ("SAME-DRIFT", "AMBIGUOUS", "AMBIGUOUS-BY-INSTRUMENT"):
            assert f"prereg.interpretation.{label}: its parent {PARENT_RUN}'s text" in err
        assert "prereg.interpretation.HEALTHY" not in err  # its own words
        assert "drift_aug_copied" in registry.load(d.reg).names
    finally:
        d.close()


def test_a_verdict_post_the_outbox_refused_holds_its_campaigns_steps_which_follow_it(tmp_path: Path) -> None:
    """The outbox refuses every post as the child's FINAL verdict lands: the verdict's post is held, and the
    campaign's steps wait for it rather than running into the same refusal (an internal error, their post
    lost); once the outbox takes rows again the verdict is queued, then the campaign's step and its post."""
    demo = Demo(tmp_path / "demo")
    try:
        assert cli_main(["register", str(demo.root / "runs" / f"{CHILD_RUN}.toml"), "--accelerated",
                         "--registry", str(demo.reg)]) == 0
        demo.checkpoints(CHILD_RUN)
        amend_parent(demo)
        demo.log(PARENT_RUN, PARENT, through=600)
        assert demo.read(PARENT_RUN)["status"] == "PROVISIONAL"
        demo.store._db.execute("CREATE TEMP TRIGGER refuse_post BEFORE INSERT ON outbox"
                               " BEGIN SELECT RAISE(ABORT, 'disk I/O error (the test''s)'); END")
        demo.log(CHILD_RUN, CHILD, through=1000)
        assert demo.read(CHILD_RUN)["status"] == "FINAL"
        child = demo.supervisors[CHILD_RUN]
        child.retry_posts()
        child.retry_verdict()  # still refused: the campaign's steps still wait
        assert [m.kind for m in demo.store.messages(CHILD_RUN)] == []
        assert demo.events("pending") == [] and demo.store.incidents(CHILD_RUN) == []
        demo.store._db.execute("DROP TRIGGER refuse_post")
        child.retry_posts()  # the guard round: the verdict's post queued, then its campaign's steps
        child.retry_verdict()
        assert [m.kind for m in demo.store.messages(CHILD_RUN)] == ["verdict", "campaign"]
        (pending,) = demo.events("pending")
        assert pending["parent"] == PARENT_RUN and demo.store.incidents(CHILD_RUN) == []
        child.retry_posts()
        child.retry_verdict()
        assert len(demo.store.messages(CHILD_RUN)) == 2  # once
    finally:
        demo.close()
