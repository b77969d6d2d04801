"""A run's verdict under the daemon: the prereg checked frozen, the verdict read as evals arrive
(PROVISIONAL saved, posted at most once a poll interval), and the FINAL one saved, charted and posted
once — the machine decides that (`VerdictRead` -> SaveVerdict, Chart, PostVerdict); this carries it out.

Every read goes through `reading.read_registered_verdict`, the definition `babysit verdict` uses too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from babysit.campaign.hook import after_final_verdict
from babysit.core import run_events as ev
from babysit.core.errors import BabysitError, PreregTampered, short_error
from babysit.core.reading.log_records import LogRecord
from babysit.core.spec.run_toml import RunSpec
from babysit.sources.logtail import TailState
from babysit.verdict import reading

log = structlog.get_logger("babysit.run.supervisor")
PROVISIONAL_FIELDS = ("status", "label", "delta", "at_step", "read_step", "reason")  # what polls show of a read


def verdict_key(run: str) -> str:
    """The FINAL verdict's message key: queued once, whichever daemon gets there."""
    return f"{run}:verdict"


class RunVerdicts:
    """One run's verdict reads. Its collaborators are the supervisor's, injected: the context (store,
    state directory, clock), a message queue, the internal-error sink, the machine's feed, the log read."""

    def __init__(self, spec: RunSpec, frozen_sha: str | None, ctx: Any, *,
                 message: Callable[..., int | None], posted: Callable[[str], bool],
                 internal_error: Callable[[str, BaseException], None],
                 feed: Callable[[ev.Event], Any], read_log: Callable[[], int],
                 attempt_n: Callable[[], int | None]) -> None:
        self.spec, self.run, self.frozen_sha, self.ctx = spec, spec.name, frozen_sha, ctx
        self.message, self.posted, self.internal_error = message, posted, internal_error
        self.feed, self.read_log = feed, read_log
        self.attempt_n = attempt_n
        self.provisional: dict[str, Any] | None = None  # the latest read, for polls and the live view
        self.last_provisional_post = 0.0
        self.series_cache: reading.SeriesCache | None = None  # made on the first read
        self.chart: tuple[Path | None, BaseException | None] = (None, None)  # the FINAL verdict's, drawn
        # the FINAL verdict the machine decided to post that the store refused to save (a full disk, a
        # database error), or a FINAL read that failed: done again at the daemon's next guard round
        # (`retry`), not only by a restarted daemon; the outbox's key queues its post once (a refused
        # post is held by the run's posts: babysit/run/run_posts.py)
        self.unposted: dict[str, Any] | None = None
        self.final_failed = False
        # a FINAL verdict whose post the outbox refused (held): its campaign's steps wait until it is queued,
        # so their posts follow it and are not refused in turn (`retry`)
        self.campaign_waits: dict[str, Any] | None = None

    def check_prereg(self) -> None:
        """Frozen or not by the one definition the verdict commands use (reading.check_frozen); the
        incident is recorded once per hash pair whoever sees it first (this daemon or `babysit verdict`),
        and the daemon posts it once."""

        try:
            reading.check_frozen(self.spec, self.frozen_sha)
        except reading.PreregChanged as exc:
            key = f"{self.run}:tampered:{exc.current_sha256}"
            if self.posted(key):
                return
            reading.record_tamper_incident(self.ctx.store, self.run, exc, self.ctx.now())
            detail = {"registered_sha256": exc.registered_sha256, "current_sha256": exc.current_sha256}
            self.message("incident", {"attempt": self.attempt_n(),
                                      "incident": reading.TAMPER_INCIDENT, "message": exc.message, "detail": detail,
                                      "mention": list(self.spec.notify.mention_on_incident)}, key)
            log.warning("incident", run=self.run, incident=reading.TAMPER_INCIDENT, message=exc.message, posted=True)

    def take_records(self, records: Sequence[LogRecord], start: int, state: TailState) -> None:
        """The records the daemon's reader applied (read from byte `start` up to `state`): into the series
        cache, so a verdict read parses no byte of the log a second time."""
        if self.spec.prereg is None:
            return
        if self.series_cache is None:
            self.series_cache = reading.SeriesCache(self.spec.prereg)
        self.series_cache.feed(records, start, state)

    def read(self, *, full: bool = False) -> None:
        """Read the verdict now. An unexpected error (a value the verdict or its files cannot take) is an
        internal-error incident on this run, never an exception into the tick, guard, poll or watcher
        thread that asked, so one run's data cannot stop the daemon or the other runs."""
        try:
            self._read_now(full=full)
        except BabysitError:
            raise
        except Exception as exc:
            self.internal_error("reading the verdict", exc)

    def _read_now(self, *, full: bool = False) -> None:
        """Read the verdict: from the run's series cache (only new log bytes are parsed), or with
        `full` from the whole log as a finished file (its unterminated last line counts)."""
        if self.spec.prereg is None:
            return

        if self.series_cache is None:
            self.series_cache = reading.SeriesCache(self.spec.prereg)
        log_path = reading.records_log(self.spec, self.ctx.store)  # whole in the cache: no second parse
        try:
            verdict = reading.read_registered_verdict(self.spec, self.frozen_sha, self.ctx.store,
                                                      cache=self.series_cache if not full or
                                                      self.series_cache.complete(log_path) else None)
        except PreregTampered:
            self.check_prereg()
            return
        except BabysitError as exc:
            log.warning("verdict read failed", run=self.run, error=exc.message)
            return
        body = verdict.to_json(self.run, self.spec.prereg.sha256)
        self.provisional = {k: body.get(k) for k in PROVISIONAL_FIELDS}
        if body["status"] == "FINAL":
            stored = self.ctx.store.final_verdict(self.run)  # saved already (a dead daemon, `babysit verdict`)
            self.feed(ev.VerdictRead(self.ctx.now(), stored.body if stored else body, stored=stored is not None))
            return
        self.ctx.store.save_verdict(self.run, body, self.ctx.now(), final=False)
        # A provisional read is posted at most once per poll interval (evals can come every few
        # steps); every poll and the live header carry the latest one in between.
        now = self.ctx.now()
        if body["status"] == "PROVISIONAL" and now - self.last_provisional_post >= self.spec.poll.every_minutes * \
                self.ctx.scale:
            self.last_provisional_post = now
            self.message("provisional", {"verdict": body, "precision": self.spec.prereg.precision},
                         key=f"{self.run}:provisional:{body.get('at_step')}")

    def final(self) -> None:
        """After the run's last exit (and at start-up): read the FINAL verdict if none is saved, or post the
        saved one a dead daemon never queued. Never raises: the run still ends when its verdict cannot be
        read (an internal-error incident says why; a restarted daemon reads it again)."""
        if self.spec.prereg is None:
            return
        self.final_failed = False
        try:
            stored = self.ctx.store.final_verdict(self.run)
            if stored is None:
                self.read_log()
                self.read(full=True)
            else:  # saved, maybe never posted: the machine posts it unless it was
                self.feed(ev.VerdictRead(self.ctx.now(), stored.body, stored=True))
        except BabysitError as exc:
            self.final_failed = True
            log.error("final verdict not read; read again at the next guard round", run=self.run,
                      error=exc.message)
        except Exception as exc:
            self.internal_error("reading the final verdict", exc)

    def save(self, body: dict[str, Any], stored: bool) -> None:
        """The FINAL verdict's JSON written, then the verdict saved (a stored one: its JSON rewritten if
        lost). The chart is drawn next, best effort, before the post (so Slack can attach it)."""
        self.unposted = body  # until its post is queued: a refused write here or there is retried
        json_path = reading.verdict_json_path(reading.final_dir(self.ctx.state_dir), self.run)
        if not stored:
            reading.write_json_atomic(json_path, body)
            chart_path = reading.verdict_chart_path(reading.final_dir(self.ctx.state_dir), self.run)
            self.ctx.store.save_verdict(self.run, body, self.ctx.now(), final=True, chart_path=str(chart_path))
            log.info("final verdict", run=self.run, label=body.get("label"), delta=body.get("delta"))
        elif not json_path.is_file():
            reading.write_json_atomic(json_path, body)

    def draw_chart(self, body: dict[str, Any]) -> None:
        """The verdict's chart; its failure is an incident, never the verdict's (the post says it)."""
        chart_path = reading.verdict_chart_path(reading.final_dir(self.ctx.state_dir), self.run)
        cache, log_path = self.series_cache, reading.records_log(self.spec, self.ctx.store)
        whole = None
        if cache is not None and self.spec.prereg is not None and self.spec.prereg.train_metric is None \
                and cache.complete(log_path):
            whole = cache.series()  # the log read whole already: not parsed again for the chart
        # in a child process: matplotlib (+48 MB, kept for the daemon's life) never enters the daemon
        self.chart = reading.draw_chart(self.spec, body, self.ctx.store, chart_path, series=whole, child=True)
        if self.chart[1] is not None:
            self.internal_error("drawing the verdict chart", self.chart[1])

    def post(self, body: dict[str, Any]) -> None:
        """The FINAL verdict queued once (with its chart, or why there is none), then its campaign's actions.
        An outbox that refuses the message holds it for the next guard round (babysit/run/run_posts.py), and
        the campaign's actions wait for it there."""
        drawn, error = self.chart
        json_path = reading.verdict_json_path(reading.final_dir(self.ctx.state_dir), self.run)
        payload = {"verdict": body, "chart_path": str(drawn) if drawn else None,
                   "chart_error": None if error is None else short_error(error), "json_path": str(json_path),
                   "precision": self.spec.prereg.precision if self.spec.prereg else 4,
                   "channel": self.spec.notify.channel or self.ctx.default_channel}
        queued = self.message("verdict", payload, key=verdict_key(self.run), thread=False)
        self.unposted = None
        if queued is None:  # held: the campaign's posts follow it once the outbox takes it
            self.campaign_waits = body
            return
        after_final_verdict(self, body)  # a campaign run: its frozen grid's actions (docs/campaigns.md)

    def retry(self) -> None:
        """The daemon's guard round: a FINAL verdict decided but not saved (the store refused it), saved,
        charted if it was not and queued now; a FINAL read that failed, read again. Its post is queued
        once whatever the tries (the outbox's key). Never raises: the store still refusing waits for the
        next round."""
        try:
            if self.final_failed:
                self.final()
            waiting = self.campaign_waits
            if waiting is not None and self.ctx.store.has_message(verdict_key(self.run)):  # its post queued now
                self.campaign_waits = None
                after_final_verdict(self, waiting)
            body = self.unposted
            if body is None:
                return
            stored = self.ctx.store.final_verdict(self.run)
            if stored is None:
                self.save(body, False)
            else:
                body = stored.body
                self.save(body, True)
            if self.chart == (None, None):
                self.draw_chart(body)
            self.post(body)
        except Exception as exc:
            log.error("final verdict still not saved or queued; tried again at the next guard round",
                      run=self.run, error=short_error(exc))

