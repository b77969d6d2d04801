"""One run's exits: an attempt's end handed to the daemon's one exit watcher (or asked for, where the
executor has no descriptor: Slurm), its output drained, its exit classified (core/classify.py) from what
was seen — the exit record, the last records, a stop that was asked for and whether the trainer saved
after it, the GPUs' own fault evidence — and fed to the run's transition as `ExitSeen`. Whatever goes
wrong in between, the attempt ends and the run reaches a defined state (`InternalError`): a watcher or
timer thread never leaves a run `running`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import structlog

from babysit.core import classify
from babysit.core import run_events as ev
from babysit.core.errors import BabysitError, short_error
from babysit.core.status import AttemptStatus, Outcome
from babysit.db.store import Attempt
from babysit.run import gpufault
from babysit.run.context import RunHost
from babysit.run.log_chunks import CHUNK_BYTES
from babysit.run.run_guard import GUARD_LOCK_WAIT_SECONDS
from babysit.run.run_log import RunLog

log = structlog.get_logger("babysit.run.supervisor")


# Ends whose own incident already says the run failed: "no record was read" adds nothing to them. Any other
# end (completed, stopped, stalled, a time limit) with no record read gets a log-unreadable incident.
LOUD_ENDS = (Outcome.CRASHED, Outcome.OOM, Outcome.GPU_FAULT, Outcome.NODE_LOST, Outcome.DIVERGED)


class RunExits:
    def __init__(self, host: RunHost, runlog: RunLog) -> None:
        self.host, self.ctx, self.run = host, host.ctx, host.run
        self.executor, self.lock, self.runlog = host.executor, host.lock, runlog  # fixed for the run's life
        self.exiting: int | None = None  # the attempt whose exit a thread is draining

    def watch(self) -> None:
        """Hand the attempt's end to the daemon's one exit watcher (a descriptor that turns readable at the
        exit), or, where the executor has none (Slurm), ask for it every `exit_poll_seconds`."""
        attempt = self.host.attempt
        assert attempt is not None
        n = attempt.n
        fd = self.executor.exit_fd(attempt)
        if fd is not None:
            self.ctx.exits.watch(self.run, fd, lambda: self.host.later(f"exit:{self.run}:{n}", 0.0,
                                                                       lambda: self.on_exit(n), "handling its exit"))
            return

        def ask() -> None:
            self.check_exit()
            current = self.host.attempt
            if current is not None and current.n == n and current.status == AttemptStatus.RUNNING:
                self.host.later(f"exit-check:{self.run}", self.executor.exit_poll_seconds, ask, "asking for its exit")

        self.host.later(f"exit-check:{self.run}", self.executor.exit_poll_seconds, ask, "asking for its exit")

    def check_exit(self) -> None:
        """A backstop to the exit watcher (and the way exits are seen for schedulers)."""
        attempt = self.host.attempt
        if attempt is not None and attempt.status == AttemptStatus.RUNNING:
            attempt = self.host.attempt = self.sync_start(attempt)
        if attempt is not None and self.host.is_running() and self.executor.exit_info(attempt) is not None:
            self.on_exit(attempt.n)

    def check_exit_later(self) -> None:
        """The guard round's backstop: an exit found is handled at once when its output is read to within
        a chunk, else on a timer's thread (its output drained there), never on the round's."""
        attempt = self.host.attempt
        if self.exiting is not None:
            return  # handled by the thread that saw it (the exit watcher, a timer)
        if attempt is not None and self.host.is_running() and self.executor.exit_info(attempt) is not None \
                and self.runlog.reader.unread_bytes() > CHUNK_BYTES:
            n = attempt.n
            self.host.later(f"exit:{self.run}:{n}", 0.0, lambda: self.on_exit(n), "handling its exit")
            return
        if self.lock.acquire(timeout=GUARD_LOCK_WAIT_SECONDS):  # a run busy with its exit is left to it
            try:
                self.check_exit()  # its start time kept on the job's (schedulers)
            finally:
                self.lock.release()

    def sync_start(self, attempt: Attempt) -> Attempt:
        """Schedulers: keep the store's started_at on the job's real start, so a queued job costs no GPU-time.

        An executor with `start_time(attempt)` (Slurm) says the real StartTime once the job left the
        queue, None while it waits; while it waits started_at follows the clock (GPU-seconds stay ~0).
        """
        if attempt.status != AttemptStatus.RUNNING:
            return attempt
        real = self.executor.start_time(attempt)  # asks the job's state: a requeue is seen here
        attempt = self.sync_requeues(attempt)
        if real is None:
            real = self.ctx.now()
            if attempt.started_at is not None and real - attempt.started_at < 5:
                return attempt
        elif real == attempt.started_at:
            return attempt
        self.ctx.store.mark_running(attempt.id, started_at=real, pid=attempt.pid,
                                    pid_create_time=attempt.pid_create_time, job_id=attempt.job_id)
        return self.ctx.store.attempt(self.run, attempt.n)

    def sync_requeues(self, attempt: Attempt) -> Attempt:
        """The runs of the attempt's job before its scheduler requeued it (Slurm: same job id, Restarts up):
        their GPU-time kept on the attempt (`requeued_seconds`, which its GPU-hours and the cap count, since
        its started_at moves to the new start) and each said once. The attempt goes on: same job, its
        script rerun from the run's latest checkpoint."""
        runs = self.executor.requeues(attempt)
        known = attempt.detail.get("requeues") or []
        if len(runs) <= len(known):
            return attempt
        seconds = sum(max(0.0, float(r["end"]) - float(r["start"])) for r in runs)
        self.ctx.store.merge_attempt_detail(attempt.id, {"requeues": [dict(r) for r in runs],
                                                         "requeued_seconds": seconds})
        goes_on = "resumes from the latest checkpoint" if self.host.spec.retry.resume == "latest-checkpoint" \
            else "starts again (retry.resume is not latest-checkpoint)"
        for r in runs[len(known):]:
            ran = max(0.0, float(r["end"]) - float(r["start"]))
            self.host.incident("requeued", f"Slurm requeued job {attempt.job_id} (restart {r.get('restart')}): not "
                               f"the trainer's fault. It had run {ran / 60:.1f} min on {r.get('nodes') or '?'}, "
                               f"{ran * attempt.gpus / 3600:.2f} GPU-hours, counted. The same job runs again and "
                               f"{goes_on}", {"attempt": attempt.n, **dict(r)},
                               key=f"{self.run}:{attempt.n}:requeued:{r.get('restart')}")
        return self.ctx.store.attempt(self.run, attempt.n)

    def on_exit(self, n: int) -> None:
        """The attempt's exit: its output read to the end, then classify, record, decide. Whatever goes
        wrong in between, the attempt ends and the run reaches a defined state: the watcher thread never
        dies leaving a run `running`. The drain holds the run's lock a chunk at a time, never whole: the
        guards and polls of this run and the others go on meanwhile."""
        attempt = self.host.attempt
        if attempt is not None and attempt.n == n and self.host.is_running():
            self.exiting = n
            try:
                self.runlog.read_log(drain=True)
            finally:
                self.exiting = None
        with self.lock:
            try:
                self._on_exit(n)
            except BabysitError:
                raise  # the store failing (a full disk): check_exit's backstop redoes the exit later
            except Exception as exc:
                self.host.internal_error(f"handling attempt {n}'s exit", exc)
                self.end_after_internal_error(n, exc)

    def _on_exit(self, n: int) -> None:
        """Classify attempt n's exit from what was seen (pure: core/classify.py), then `ExitSeen`."""
        with self.lock:
            attempt = self.ctx.store.attempt(self.run, n)
            if attempt.status == AttemptStatus.ENDED:
                return
            info = self.executor.exit_info(attempt)
            if info is None:
                return
            attempt, spec = self.sync_start(attempt), self.host.spec
            # the last records (a diverged event, the final eval) belong to it, an unterminated last line too
            self.runlog.read_log(drain=True, final=True)
            stop = self.host.state.stop
            stop = stop if stop is not None and stop.attempt == n else None  # a stop of this attempt was asked for
            sent_at = (stop.sent_at or stop.at) if stop is not None else None
            fresh = self.ctx.store.attempt(self.run, n)  # the exit's own read_log may have noted a NaN on it
            # the signals of the attempt's GPUs: where they are read (a Slurm job's: its sidecars, each node's)
            probe = self.executor.gpu_probe(fresh, self.ctx.gpu_probe)
            evidence = gpufault.at_exit(probe, self.ctx.store, fresh, spec.gpus)
            cls = classify.classify_exit(
                classify.ExitFacts(exit_code=info.exit_code, signal=info.signal, stderr_tail=info.stderr_tail,
                last_records=list(self.runlog.recent), rules=spec.classify, stop_requested=stop is not None,
                stop_reason=stop.reason if stop is not None else None,
                host_memory_pressure=bool(attempt.detail.get("host_memory_pressure")),
                nonfinite_seen=fresh.detail.get("nonfinite"),
                nonfinite_metrics=spec.guards.nonfinite_metrics,
                stop_sent_at=sent_at,
                checkpoint_after_stop=written_after(spec.checkpoints, sent_at) if sent_at else None,
                gpu_evidence=evidence, end_step=self.runlog.end_step(fresh), lost_nodes=info.lost_nodes,
                node_fail=info.state if info.state in ("NODE_FAIL", "BOOT_FAIL") else None,
                time_limit=info.time_limit, preempted=info.state == "PREEMPTED"))
            if cls.outcome not in LOUD_ENDS:  # it ended as if all went well, and no record was read: said
                self.runlog.teller.check_unread_at_exit(attempt)
            summary = cls.summary
            vanished = self.runlog.reader.vanished(n)
            if vanished:  # read as far as they existed: what they held after that is not known
                summary = f"{summary} — not read to its end: {', '.join(vanished)} vanished"
            detail = {**fresh.detail, **dict(cls.detail), "summary": summary, "retry_override": cls.retry,
                      "note": info.note or None, "state": info.state or None, "gpu_evidence": evidence}
            if vanished:
                detail["undrained"] = vanished
            if cls.outcome == "gpu-fault" or cls.detail.get("completed_before_stop") == "gpu-fault":
                self.quarantine(n, evidence)  # before the retry chooses its GPUs; a broken GPU stays broken
            if cls.outcome == Outcome.NODE_LOST and info.lost_nodes:  # the executor quarantined them
                names = ", ".join(info.lost_nodes)
                self.host.incident("node-quarantined", f"{names} quarantined: lost under attempt {n}'s job; no run "
                                   f"is submitted to {'them' if len(info.lost_nodes) > 1 else 'it'} until "
                                   f"`babysit node release {info.lost_nodes[0]}`", {"nodes": list(info.lost_nodes)},
                                   key=f"{self.run}:{n}:node-quarantined")
            if stop is not None and "stop_reason" in cls.detail:
                # Only a stop that decided the outcome is a guard stop: a trainer that exited with its
                # own code (OOM, divergence) while being stopped keeps that class and its retry.
                detail["stopped_by"] = stop.reason
            seen = ev.ExitSeen(self.ctx.now(), n, cls.outcome, summary, ended_at=info.ended_at or self.ctx.now(),
                               exit_code=info.exit_code, signal=info.signal, retry_override=cls.retry,
                               stopped_by=detail.get("stopped_by"), detail=detail)
        self.deciding(seen, n, f"deciding after attempt {n}'s exit")

    def deciding(self, event: ev.Event, n: int, where: str) -> None:
        """An event after attempt n's exit (its record, the retry or the end): an unexpected error is an
        internal-error incident that ends the run, never a start-up crash or a run `running` forever."""
        try:
            self.host.feed(event)
        except BabysitError:
            raise  # the store failing (a full disk): check_exit's backstop redoes the exit later
        except Exception as exc:
            self.host.internal_error(where, exc)
            self.end_after_internal_error(n, exc)

    def quarantine(self, n: int, evidence: list[dict[str, Any]]) -> None:
        """After a machine fault: the GPUs it hit are quarantined (by UUID), and on a job across nodes the
        nodes they are on (the executor leaves them out of every later submission), each said once."""
        for e in gpufault.quarantine(self.ctx.store, self.run, evidence, self.ctx.now()):
            self.host.incident("gpu-quarantined", f"GPU {e.get('gpu')} ({e.get('uuid')}) quarantined after "
                               f"{e.get('name')}: {e.get('meaning')} — {e.get('action_words')}, then "
                               f"`babysit gpu release {e.get('uuid')}`", {"evidence": [e]},
                               key=f"{self.run}:{n}:quarantined:{e.get('uuid')}")
        attempt = self.ctx.store.attempt(self.run, n)
        for node, seen in gpufault.faulty_nodes(evidence).items():
            if self.executor.quarantine_nodes(attempt, (node,), f"{seen} during run {self.run}, attempt {n}"):
                self.host.incident("node-quarantined", f"{node} quarantined: {seen} there, the machine's fault; no "
                                   f"run is submitted to it until `babysit node release {node}`",
                                   {"nodes": [node], "fault": seen}, key=f"{self.run}:{n}:node-quarantined:{node}")

    def end_after_internal_error(self, n: int, exc: Exception) -> None:
        """After an internal error in deciding: attempt n is ended (it did exit) and, unless a later attempt
        was launched, the run is `failed` with the error as its reason (`InternalError`). The state is read
        back from the store first: the step that failed may have left it ahead of what was written.
        Never raises."""
        try:
            now = self.ctx.now()
            self.host.read_state()
            row = self.ctx.store.attempt(self.run, n)
            info = self.executor.exit_info(row) if row.status != AttemptStatus.ENDED else None
            self.host.attempt = row
            self.host.feed(ev.InternalError(now, n, short_error(exc), ended_at=info.ended_at if info else None,
                                            exit_code=info.exit_code if info else None,
                                            signal=info.signal if info else None))
        except Exception:
            log.exception("could not end the run after an internal error", run=self.run, attempt=n)


# Did the trainer save after a requested stop? What a launcher's exit status cannot say (torchrun exits 1 after
# any signal, whatever its ranks did), the checkpoint folder can: a file written there after the signal is
# the trainer saving on its way out. core/classify.py weighs it with the trainer's stop record; this only
# looks, bounded: a folder of many thousand files is not walked whole at every exit.
MAX_ENTRIES = 5000  # entries looked at, at most
MAX_DEPTH = 3  # folders below [run].checkpoints (HF: checkpoint-500/…, Lightning: version_0/checkpoints/…)
POINTER_BYTES = 256  # a file this small is a pointer (`latest`), not the checkpoint itself
# Linux stamps a file with its coarse clock (up to a jiffy, 1-10 ms, behind time.time()): a file written
# just after the signal can carry an mtime a few ms before it
MTIME_SLACK_S = 0.02


def written_after(folder: Path, since: float) -> tuple[str, float] | None:
    """(the file's path relative to `folder`, seconds after `since`) of the newest file modified at or after
    `since`, a real checkpoint preferred over a pointer file; None when there is none (or no folder)."""
    best: tuple[bool, float, str] | None = None
    seen = 0
    stack: list[tuple[Path, int]] = [(Path(folder), 0)]
    while stack and seen < MAX_ENTRIES:
        here, depth = stack.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth < MAX_DEPTH:
                        stack.append((Path(entry.path), depth + 1))
                    continue
                st = entry.stat()
            except OSError:
                continue
            if st.st_mtime >= since - MTIME_SLACK_S:
                key = (st.st_size > POINTER_BYTES, st.st_mtime, os.path.relpath(entry.path, folder))
                if best is None or key[:2] > best[:2]:
                    best = key
    if best is None:
        return None
    return best[2], max(0.0, best[1] - since)
