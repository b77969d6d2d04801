"""/metrics' families from a real store, parsed back with prometheus_client's own parser."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from babysit.db.store import Store
from babysit.web import metrics
from babysit.web.data import Site
from tests.web.workspace import HOSTILE, RUN


def scrape(site: Site) -> dict[str, list]:
    rows = site.rows()
    text = metrics.exposition(metrics.families(rows, site.incident_counts(), site.daemon_facts(), time.time()))
    return {f.name: f.samples for f in text_string_to_metric_families(text.decode())}


def value(samples: list, **labels: str) -> float:
    hits = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (labels, samples)
    return hits[0]


def test_every_run_series_is_exported_and_parses(site_root: Path) -> None:
    got = scrape(Site(site_root / "babysit.toml"))
    assert value(got["babysit_run_state"], run=RUN, state="finished") == 1.0
    assert value(got["babysit_run_state"], run=RUN, state="running") == 0.0
    assert value(got["babysit_run_step"], run=RUN) == 150
    assert value(got["babysit_run_seconds_per_step"], run=RUN) == 0.5
    assert value(got["babysit_run_gpu_utilization_percent"], run=RUN, gpu="0") == 87.0
    assert value(got["babysit_run_gpu_hours_cap"], run=RUN) == 2.0
    assert 0 < value(got["babysit_run_gpu_hours"], run=RUN) < 0.1
    assert value(got["babysit_run_incidents"], run=RUN, kind="diverged") == 1  # a counter: *_total
    assert next(s.name for s in got["babysit_run_incidents"]) == "babysit_run_incidents_total"
    assert value(got["babysit_run_verdict"], run=RUN, status="FINAL", label="SAME-DRIFT") == 1.0
    assert value(got["babysit_run_last_poll_age_seconds"], run=RUN) > 0
    assert value(got["babysit_run_state"], run=HOSTILE, state="failed") == 1.0  # label values escaped, parsed back


def test_what_was_not_measured_is_left_out_never_zero(site_root: Path) -> None:
    got = scrape(Site(site_root / "babysit.toml"))
    assert not [s for s in got["babysit_run_step"] if s.labels["run"] == HOSTILE]
    assert not [s for s in got["babysit_run_gpu_hours"] if s.labels["run"] == HOSTILE]  # a CPU run
    assert not got["babysit_run_eta_seconds"]  # nothing is running


def test_the_outbox_depth_and_last_delivery_error(site_root: Path) -> None:
    got = scrape(Site(site_root / "babysit.toml"))
    assert value(got["babysit_outbox_pending_messages"]) == 3
    assert value(got["babysit_outbox_last_error_info"], run=RUN, error="slack said: ratelimited") == 1.0
    assert value(got["babysit_outbox_oldest_pending_age_seconds"]) > 0


def test_the_posts_the_outbox_refused_are_counted_while_their_runs_hold_them(site_root: Path) -> None:
    assert value(scrape(Site(site_root / "babysit.toml"))["babysit_outbox_held_messages"]) == 0
    store = Store.in_dir(site_root / ".babysit")
    held = [{"kind": "ended", "payload": {"run": RUN}, "key": f"{RUN}:1:ended", "thread_of": None}] * 2
    store.hold_posts(RUN, held)
    store.hold_posts(HOSTILE, held[:1])
    store.close()
    assert value(scrape(Site(site_root / "babysit.toml"))["babysit_outbox_held_messages"]) == 3
