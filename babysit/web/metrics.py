"""`/metrics` in the Prometheus text format: the runs table and the daemon's outbox as series.

`families` is pure (rows, counts and outbox facts in, metric families out); prometheus_client is
imported only here, inside functions, so `babysit --help` never pays for it. A value babysit has not
measured (no GPU, no poll yet, no s/step) is left out, never exported as 0: an alert on
`babysit_run_gpu_utilization_percent < 10` must not fire on a run that was never polled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from babysit.core.status import SHOWN_STATUSES
from babysit.view.runview import RunRow
from babysit.web.data import DaemonFacts, StoreFacts

STATES = SHOWN_STATUSES  # one gauge series each (core/status.py)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def families(rows: Sequence[RunRow], incidents: Mapping[str, Mapping[str, int]], daemon: DaemonFacts,
             now: float, store: StoreFacts | None = None) -> list[Any]:
    """Every metric family of one scrape (`store`: what the page read, for the store gauges)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    def gauge(name: str, doc: str, labels: Sequence[str] = ("run",)) -> Any:
        return GaugeMetricFamily(name, doc, labels=list(labels))

    state = gauge("babysit_run_state", "1 for the run's current state, 0 for the others", ("run", "state"))
    attempt = gauge("babysit_run_attempt", "the run's current (or last) attempt number")
    step = gauge("babysit_run_step", "the last step the run's log (or daemon) reported")
    target = gauge("babysit_run_target_step", "the step the ETA counts to (the read step, then the end)")
    sps = gauge("babysit_run_seconds_per_step", "seconds per step over the attempt's recent records")
    eta = gauge("babysit_run_eta_seconds", "seconds until the target step at the current pace (running runs)")
    util = gauge("babysit_run_gpu_utilization_percent", "GPU utilization at the attempt's last poll",
                 ("run", "gpu"))
    used = gauge("babysit_run_gpu_hours", "GPU-hours used over all attempts")
    cap = gauge("babysit_run_gpu_hours_cap", "the [guards].gpu_hours_cap the daemon enforces (the spec it loaded)")
    verdict = gauge("babysit_run_verdict", "1 for the latest verdict read: its status (PROVISIONAL | FINAL | "
                    "NO-READ) and label", ("run", "status", "label"))
    delta = gauge("babysit_run_verdict_delta", "the latest read's delta from baseline")
    poll_age = gauge("babysit_run_last_poll_age_seconds", "seconds since the run's last poll")
    count = CounterMetricFamily("babysit_run_incidents", "incidents recorded for the run, by kind",
                                labels=["run", "kind"])
    for row in rows:
        for s in STATES:
            state.add_metric([row.run, s], 1.0 if row.status == s else 0.0)
        for family, value in ((attempt, row.attempt), (step, row.step), (target, row.target_step),
                              (sps, row.seconds_per_step), (eta, row.eta_seconds)):
            if value is not None:
                family.add_metric([row.run], float(value))
        for i, u in enumerate(row.gpu_util_pct):
            util.add_metric([row.run, str(i)], float(u))
        if row.gpus:  # a CPU run has no GPU-hours to count (the table says "—" too)
            used.add_metric([row.run], float(row.gpu_hours))
            if row.gpu_hours_cap is not None:
                cap.add_metric([row.run], float(row.gpu_hours_cap))
        if row.verdict is not None and row.verdict.status:
            verdict.add_metric([row.run, row.verdict.status, row.verdict.label or ""], 1.0)
            if isinstance(row.verdict.delta, (int, float)):
                delta.add_metric([row.run], float(row.verdict.delta))
        if row.last_poll_at is not None:
            poll_age.add_metric([row.run], max(0.0, now - row.last_poll_at))
        for kind, n in sorted(incidents.get(row.run, {}).items()):
            count.add_metric([row.run, kind], float(n))

    pending = GaugeMetricFamily("babysit_outbox_pending_messages", "messages queued and not yet delivered",
                                value=float(daemon.outbox_pending))
    failed = GaugeMetricFamily("babysit_outbox_failed_messages", "messages given up on after their retries",
                               value=float(daemon.outbox_failed))
    held = GaugeMetricFamily("babysit_outbox_held_messages", "posts the outbox refused, held by their runs and "
                             "queued once it takes rows again", value=float(daemon.outbox_held))
    last = GaugeMetricFamily("babysit_outbox_last_error_info", "1 with the newest delivery error and its run as "
                             "labels (no sample when no delivery has failed)", labels=["run", "error"])
    if daemon.last_error is not None:
        last.add_metric([daemon.last_error_run or "", daemon.last_error[:200]], 1.0)
    out = [state, attempt, step, target, sps, eta, util, used, cap, verdict, delta, poll_age, count, pending, failed,
           held, last]
    if daemon.oldest_pending_at is not None:
        out.append(GaugeMetricFamily("babysit_outbox_oldest_pending_age_seconds",
                                     "how long the oldest undelivered message has waited",
                                     value=max(0.0, now - daemon.oldest_pending_at)))
    return out + store_families(store or StoreFacts(degraded=False))


def store_families(store: StoreFacts) -> list[Any]:
    """Whether the page reads the shared database or, PostgreSQL unreachable, the box's mirror (then how
    old its copy is): what an alert on a degraded box fires on."""
    from prometheus_client.core import GaugeMetricFamily

    out = [GaugeMetricFamily("babysit_store_degraded", "1 while the shared database (PostgreSQL) cannot be reached: "
                             "the series are this box's runs as its local mirror holds them (other boxes' runs "
                             "absent), or none without a mirror; 0 otherwise", value=1.0 if store.degraded else 0.0)]
    if store.mirror_age_s is not None:
        out.append(GaugeMetricFamily("babysit_store_mirror_age_seconds", "while degraded, seconds since the local "
                                     "mirror was last in step with the database", value=store.mirror_age_s))
    return out


def exposition(metric_families: Sequence[Any]) -> bytes:
    """The families in the Prometheus text exposition format."""
    from prometheus_client import CollectorRegistry, generate_latest

    class _Snapshot:
        def collect(self) -> Sequence[Any]:
            return metric_families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot())
    return generate_latest(registry)
