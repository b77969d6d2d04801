"""The pure rules of the bot, one by one."""

from __future__ import annotations

from babysit.core.render import render
from babysit.slack.refs import is_outbox_post, split_ref
from bot.predicates import (
    action_value,
    close_names,
    may_abort,
    parse_babysit,
    parse_verdict,
    user_of,
    wants_post,
)


def test_parse_babysit_defaults_to_help_and_lowercases_the_subcommand() -> None:
    assert parse_babysit("").name == "help"
    cmd = parse_babysit("  STATUS  run_a extra ")
    assert (cmd.name, cmd.run, cmd.rest) == ("status", "run_a", ("extra",))


def test_verdict_post_is_only_the_explicit_word() -> None:
    assert wants_post(parse_verdict("run_a post"))
    assert not wants_post(parse_verdict("run_a"))
    assert parse_verdict("").run is None


def test_abort_needs_an_explicit_allow_list_entry() -> None:
    assert may_abort("U1", ["U1"])
    assert not may_abort("U2", ["U1"])
    assert not may_abort("U1", [])  # an empty list allows nobody
    assert not may_abort(None, ["U1"])


def test_users_of_commands_and_interactions() -> None:
    assert user_of({"user_id": "U1"}) == "U1"
    assert user_of({"user": {"id": "U2"}}) == "U2"
    body = {"actions": [{"action_id": "other", "value": "x"}, {"action_id": "a", "value": "run"}]}
    assert action_value(body, "a") == "run" and action_value(body, "b") is None


def test_outbox_post_matches_on_metadata_only() -> None:
    ours = {"ts": "1.2", "metadata": {"event_type": "babysit_outbox", "event_payload": {"id": 7}}}
    assert is_outbox_post(ours, 7)
    assert not is_outbox_post(ours, 8)
    assert not is_outbox_post({"ts": "1.2", "text": "babysit_outbox 7"}, 7)


def test_refs_are_channel_and_slack_ts_and_nothing_else() -> None:
    assert split_ref("C1:1712345678.000100") == ("C1", "1712345678.000100")
    assert split_ref("console:5") is None and split_ref(None) is None and split_ref("C1") is None


def test_close_names_for_typos() -> None:
    assert close_names("grasp_v2", ["grasp_v1", "other"]) == ["grasp_v1"]


def test_every_kind_has_blocks_and_the_same_text_as_before() -> None:
    payloads = {
        "launch": {"run": "r", "attempt": 1, "argv": ["python", "t.py"]},
        "header": {"run": "r", "attempt": 1, "snapshot": {"step": 5}},
        "poll": {"run": "r", "snapshot": {"run": "r", "step": 5}},
        "incident": {"run": "r", "attempt": 1, "incident": "stalled", "message": "m", "mention": ["U9"]},
        "ended": {"run": "r", "attempt": 1, "outcome": "completed"},
        "provisional": {"verdict": {"run": "r", "status": "PROVISIONAL", "at_step": 5, "read_step": 10,
                                    "label": "X", "delta": 0.1}},
        "verdict": {"verdict": {"run": "r", "status": "FINAL", "label": "X", "delta": 0.1}},
        "amendment": {"run": "r", "n": 1, "title": "t", "sha256": "a" * 64},
        "text": {"text": "hello"},
    }
    for kind, payload in payloads.items():
        rendered = render(kind, payload)
        assert rendered.text and rendered.blocks, kind
    assert "<@U9>" in render("incident", payloads["incident"]).blocks[0]["text"]["text"]
    assert "NOT A VERDICT" in render("provisional", payloads["provisional"]).blocks[0]["text"]["text"]
