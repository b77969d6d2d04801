"""One run's polls: when the next is due, the row a poll round records, and what a recorded poll tells
(an unreadable log, input starvation). The calendar (babysit/run/polling.py) runs the rounds; this is the
`PolledRun` it calls, under the run's lock, for one supervisor.
"""

from __future__ import annotations

from babysit.core import run_events as ev
from babysit.core import run_machine
from babysit.core.status import AttemptStatus
from babysit.db.store import PollRow
from babysit.run.context import RunHost
from babysit.run.run_log import RunLog
from babysit.run.run_observe import RunObserver

POLL_RETRY_MINUTES = 1.0  # a poll that failed is tried again this many declared minutes later


class RunPolls:
    def __init__(self, host: RunHost, runlog: RunLog, observer: RunObserver) -> None:
        self.host, self.ctx, self.run, self.lock = host, host.ctx, host.run, host.lock
        self.runlog, self.observer = runlog, observer
        self.newest: tuple[int, float | None] | None = None  # (attempt, its newest poll's time), cached

    def schedule_next(self) -> None:
        """The attempt's next poll on the calendar: `every_minutes` after its newest, or `first_after_minutes`
        after its start."""
        attempt = self.host.attempt
        if attempt is None or attempt.started_at is None:
            return
        newest = self._newest_at(attempt.n)
        if newest is not None:
            when = newest + self.host.spec.poll.every_minutes * self.ctx.scale
        else:
            when = attempt.started_at + self.host.spec.poll.first_after_minutes * self.ctx.scale
        self.ctx.polls.due(self, when)

    def _newest_at(self, n: int) -> float | None:
        """When attempt n was last polled (None: never); read from the store once, then kept as polls go."""
        if self.newest is None or self.newest[0] != n:
            newest = self.ctx.store.polls(self.run, limit=1)
            self.newest = (n, newest[0].at if newest and newest[0].attempt == n else None)
        return self.newest[1]

    def now_alone(self, kind: str | None = None) -> bool:
        """Poll now, alone (`/babysit poll`: kind "on-demand", which leaves the schedule as it is); True
        when a poll was recorded."""
        return self.ctx.polls.poll([self], kind) == 1

    def take_poll(self, kind: str | None) -> PollRow | None:
        """Under the lock, in a poll round: the running attempt's snapshot as the row that records it
        (None: nothing runs). Its log offsets are the round's deferred facts, committed with the rows."""
        attempt = self.host.attempt
        # through the run's transition: a poll is due only of a running attempt (it changes nothing but the clock)
        _, effects = run_machine.step(self.host.state, ev.PollDue(self.ctx.now(), kind))
        if attempt is None or attempt.status != AttemptStatus.RUNNING or \
                not any(isinstance(e, ev.TakePoll) and e.n == attempt.n for e in effects):
            return None
        kind = kind or ("first" if self._newest_at(attempt.n) is None else "periodic")
        snap = self.observer.snapshot(kind)
        # while the run holds posts the outbox refused, its poll's posts are held behind them (after_poll)
        return PollRow(self.run, attempt.n, snap.at, kind, snap, thread_of=self.host.launch_msg,
                       payload={"run": self.run}, held=bool(self.host.posts.held))

    def still_polled(self, poll: PollRow) -> bool:
        """Under the lock: the polled attempt still runs (an exit handled since makes its poll stale)."""
        attempt = self.host.attempt
        return attempt is not None and attempt.n == poll.attempt and attempt.status == AttemptStatus.RUNNING

    def after_poll(self, poll: PollRow) -> None:
        """Under the lock, once the poll is recorded: what it tells (an unreadable log, input
        starvation), then the next poll's date (an on-demand poll leaves the schedule as it was)."""
        self.newest = (poll.attempt, poll.at)
        if poll.held:
            self._post_held(poll)
        attempt = self.host.attempt
        if attempt is None or not self.still_polled(poll):
            return
        self.runlog.teller.check_readable(attempt)
        snap = poll.snapshot
        if "input-starvation" in snap.flags:
            wait = snap.data_wait_frac or 0.0
            util = self.host.spec.poll.starvation_util_pct
            self.host.incident("input-starvation", f"GPU util under {util:g} % while the trainer waits on its input "
                               f"{wait:.0%} of each step: fix the input pipeline (--num-workers, prefetch, faster "
                               "storage) before letting it ride",
                               {"gpus": [g.to_dict() for g in snap.gpus], "data_wait_frac": snap.data_wait_frac},
                               key=f"{self.run}:{attempt.n}:input-starvation")
        if poll.kind != "on-demand":
            self.schedule_next()

    def _post_held(self, poll: PollRow) -> None:
        """A held poll's post and header, through the run's posts: behind the posts it holds, in the launch
        post's thread (by its key while that is held too), each once (keyed by the poll's id)."""
        poll_id = next((p.id for p in self.ctx.store.polls(self.run, limit=4)
                        if p.attempt == poll.attempt and p.at == poll.at), None)
        if poll_id is None:  # not found: a poll recorded since would be a bug; the poll itself is recorded
            raise RuntimeError(f"poll of attempt {poll.attempt} at {poll.at} recorded but not found")
        self.host.message("poll", {"poll_id": poll_id}, key=f"{self.run}:poll:{poll_id}")
        self.host.message("header", {"attempt": poll.attempt, "poll_id": poll_id}, key=f"{self.run}:header:{poll_id}")

    def poll_failed(self, exc: BaseException, kind: str | None) -> None:
        """A poll that could not be taken or recorded: said (`failed`), and tried again a declared minute
        on, so a store that failed once (a full disk) does not end the run's polls."""
        self.host.failed("polling it", exc)
        attempt = self.host.attempt
        if kind != "on-demand" and attempt is not None and attempt.status == AttemptStatus.RUNNING:
            self.ctx.polls.due(self, self.ctx.now() + POLL_RETRY_MINUTES * self.ctx.scale)
