"""bot/envelopes.py: which re-sent Socket Mode envelopes run, which are re-acked, which are dropped."""

from __future__ import annotations

from bot.envelopes import EnvelopeLedger, keys_of


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_first_sight_runs_a_repeat_while_running_is_dropped_a_finished_one_is_re_acked() -> None:
    ledger = EnvelopeLedger()
    keys = keys_of("e1", {"trigger_id": "t1"})
    assert ledger.claim(keys).state == "new"
    assert ledger.claim(keys).state == "running"
    ledger.finish(keys, {"text": "queued"}, acked=True)
    seen = ledger.claim(keys)
    assert (seen.state, seen.ack, seen.acked) == ("done", {"text": "queued"}, True)


def test_a_re_send_under_a_new_envelope_id_is_known_by_its_trigger_or_event_id() -> None:
    ledger = EnvelopeLedger()
    ledger.finish(keys_of("e1", {"trigger_id": "t1"}), None, acked=True)
    assert ledger.claim(keys_of("e2", {"trigger_id": "t1"})).state == "done"
    ledger.finish(keys_of("e3", {"event_id": "Ev1"}), None, acked=True)
    assert ledger.claim(keys_of("e4", {"event_id": "Ev1"})).state == "done"
    assert ledger.claim(keys_of("e5", {"trigger_id": "t2"})).state == "new"


def test_a_run_that_failed_before_its_ack_is_forgotten_so_the_re_send_runs() -> None:
    ledger = EnvelopeLedger()
    keys = keys_of("e1", {})
    ledger.claim(keys)
    ledger.forget(keys)
    assert ledger.claim(keys).state == "new"


def test_entries_expire_and_the_ledger_stays_bounded() -> None:
    clock = Clock()
    ledger = EnvelopeLedger(keep_s=60, max_entries=4, clock=clock)
    ledger.finish(keys_of("old", {}), None, acked=True)
    clock.t += 61
    assert ledger.claim(keys_of("old", {})).state == "new"  # Slack stopped re-sending long ago
    for i in range(10):
        ledger.claim(keys_of(f"e{i}", {}))
    assert len(ledger._entries) == 4
    assert ledger.claim(keys_of("e9", {})).state == "running"
