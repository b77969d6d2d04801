"""Control requests (`babysit abort`, `/babysit abort`, `/babysit poll`, relaunches, an owner's click passed
on by another box's gateway) carried out at most once and answered at least once.

Its own module because that promise outlives a daemon: an answer carried out but not yet written, and a
request begun, are saved in the store (babysit/db/marks.py, one row a request), so a daemon restarted in
between writes the owed answer (or says the request was interrupted) instead of carrying it out twice.
When to look for requests is the daemon's (babysit.service.daemon); which runs exist is the roster's
(babysit.service.roster).
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from babysit.campaign import clicks
from babysit.core.errors import BabysitError
from babysit.db.store import Row
from babysit.register import relaunch
from babysit.run.context import DaemonContext
from babysit.runtime.faults import crash_point
from babysit.service.roster import Roster

log = structlog.get_logger("babysit.service.control")


class ControlRequests:
    """Answers the store's pending requests for the runs of `roster`."""

    def __init__(self, roster: Roster, ctx: DaemonContext) -> None:
        self.roster = roster
        self.ctx = ctx
        self.store = ctx.store
        self._owed: dict[int, str] = {}  # request id -> its answer, carried out but not yet written

    def answer(self, requests: Sequence[Row]) -> bool:
        """Carry out and answer each request; False when an answer could not be written (the store refused
        it): that request stays claimed and owed, and the next look writes its answer."""
        answered = True
        for req in requests:
            try:
                if req.id not in self._owed and not self._owed_before(req):
                    self._mark_started(req)
                    self._owed[req.id] = self._carry_out(req)[:500]  # carried out once; its answer written again
                    crash_point("after-request")
                self.store.finish_request(req.id, self._owed[req.id], self.ctx.now())
                del self._owed[req.id]
                self._save_owed(req.run, req.id, None)
            except Exception:
                log.exception("control request not answered; answered at the next guard round",
                              request=req.id, run=req.run, action=req.kind)
                answered = False
                if req.id in self._owed:
                    self._save_owed(req.run, req.id, self._owed[req.id])
        return answered

    def _owed_before(self, req: Row) -> bool:
        """Was `req` taken by a daemon that stopped before its answer was written? Then it is not carried
        out again: the answer that daemon saved is the one owed, or, for a request it had begun
        (`_mark_started`) and died in, an answer saying so. A failed read raises: the request waits for the
        next look, its marks untouched."""
        if req.run not in self.roster.supervisors:  # answered without acting ("no run named …"): nothing saved
            return False
        saved = self.store.owed_answers(req.run)
        if req.id in saved:
            self._owed[req.id] = saved[req.id]
        elif req.id in self.store.started_requests(req.run):
            self._owed[req.id] = interrupted_answer(req)
        else:
            return False
        return True

    def _mark_started(self, req: Row) -> None:
        """A request whose second carrying-out would be a second effect (a poll posted twice, a relaunch of
        an attempt that ended meanwhile, an owner's call) is marked begun first, so a daemon that dies
        before its answer is written is followed by one that answers it as interrupted rather than doing
        it again. An abort is not marked: the run's recorded stop makes a second abort a no-op (`already
        stopping`), and an abort waits on no store write. A store that refuses the mark does not stop the
        request (it is carried out, as before the mark existed)."""
        if req.kind == "abort" or req.run not in self.roster.supervisors:
            return
        try:
            self.store.mark_request_started(req.run, req.id, req.kind)
        except Exception as exc:
            log.warning("control request's start not saved; carried out unmarked", request=req.id, run=req.run,
                        error=f"{type(exc).__name__}: {exc}")

    def _save_owed(self, run: str, request_id: int, answer: str | None) -> None:
        """The owed answer saved (None: written, so neither owed nor begun any longer), so a daemon
        restarted before it is written writes it rather than carrying the request out again. Only a run
        babysat here (an answer without an action is simply given again); a store that takes nothing
        keeps it in memory."""
        if run not in self.roster.supervisors:
            return
        try:
            if answer is None:
                self.store.forget_request(run, request_id)
            else:
                self.store.save_owed_answer(run, request_id, answer)
        except Exception as exc:
            log.warning("owed control answer not saved; kept in memory", request=request_id, run=run,
                        error=f"{type(exc).__name__}: {exc}")

    def _carry_out(self, req: Row) -> str:
        """One control request carried out; its answer (written by `answer`). An error of the action itself
        is the answer, so the asker is never left waiting."""
        supervisor = self.roster.supervisors.get(req.run)
        by = req.body.get("requested_by", "?")
        if req.kind in relaunch.ASKED:  # another box's gateway asked: the checks are this box's (its files)
            try:
                relaunch.prepare(self.roster.registry_path, req.run, accelerated=True)  # the cadence: babysittable
                return self.roster.relaunch(req.run, by, resume=relaunch.ASKED[req.kind])
            except BabysitError as exc:
                return f"not relaunched: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")
            except Exception as exc:
                log.exception("relaunch failed", run=req.run)
                return f"failed: {type(exc).__name__}: {exc}"[:300]
        if req.kind in (relaunch.ACTION, relaunch.ACTION_RESUME):
            try:
                return self.roster.relaunch(req.run, by, resume=req.kind == relaunch.ACTION_RESUME)
            except Exception as exc:
                log.exception("relaunch failed", run=req.run)
                return f"failed: {type(exc).__name__}: {exc}"[:300]
        if clicks.parse_action(req.kind) is not None:  # another box's gateway passing on an owner's click
            try:
                return clicks.carry_out(self.roster.registry_path, self.store, req.kind, by, self.ctx.now())
            except Exception as exc:
                log.exception("owner call click failed", request=req.id)
                return clicks.Answer(False, f"the owner call failed on this box: {type(exc).__name__}: "
                                            f"{exc}"[:300]).to_result()
        if supervisor is None:
            return f"no run named {req.run} is babysat"
        try:
            if req.kind in ("abort", "poll-now"):
                return supervisor.request(req.kind, by, req.id)
            return f"unknown action {req.kind}"
        except Exception as exc:  # the others go on
            supervisor.failed(f"handling a {req.kind} request", exc)
            return f"failed: {type(exc).__name__}: {exc}"[:300]


def interrupted_answer(req: Row) -> str:
    """The answer to a request a daemon began and died in (it is not carried out twice); an owner's click
    gets it as its gateway reads answers (clicks.Answer), said to the clicker alone."""
    call = clicks.parse_action(req.kind)
    if call is not None:
        return clicks.Answer(False, f"Owner call #{call[0]} (*{call[1]}*): babysit stopped while carrying out "
                                    f"this decision and does not carry it out twice; `babysit status {req.run}` "
                                    "shows whether it took effect. Click again if it did not (a decision "
                                    "already made says so).").to_result()
    return (f"interrupted: babysit stopped while carrying out this {req.kind} and does not carry it out twice; "
            f"`babysit status {req.run}` shows whether it took effect — ask again if it did not")
