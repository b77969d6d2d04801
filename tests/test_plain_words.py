"""Jargon a newcomer meets in the demo comes with a plain sentence beside it, in the post itself: an owner
call (a decision babysit leaves to people) and the corroboration line (figures that decide nothing)."""

from __future__ import annotations

from babysit.core.render import render

VERDICT = {"run": "r", "status": "FINAL", "label": "HEALTHY", "metric": "eval_mae", "baseline": 1.0,
           "baseline_step": 2, "read": 1.05, "at_step": 4, "delta": 0.05, "rules": [],
           "corroboration": {"train_delta": -0.01, "monotone_rise": False}}


def test_an_owner_call_says_in_plain_words_who_decides_and_that_nothing_runs_meanwhile() -> None:
    post = render("owner-call", {"call_id": 1, "campaign": "saga", "run": "r", "label": "AMBIGUOUS",
                                 "question": "extend or the next run?", "options": ["hold"]})
    lines = post.text.splitlines()
    assert lines[0].startswith("🙋 owner call #1") and lines[1] == (
        "A decision babysit does not take itself: one of the campaign's owners answers it (a button in Slack); "
        "until then nothing runs."), lines  # before: the question straight after "owner call #1"
    assert lines[1] in str(post.blocks)


def test_the_corroboration_line_says_what_it_is_and_that_it_decides_nothing() -> None:
    post = render("verdict", {"verdict": VERDICT, "precision": 4})
    (line,) = [x for x in post.text.splitlines() if x.startswith("corroboration")]
    assert line == ("corroboration (not a gate): train Δ -0.0100, monotone rise no — shown beside the label, "
                    "never deciding it: how the train metric moved over the same window, and whether every eval rose")
    assert line in str(post.blocks)


def test_campaign_show_says_what_its_decisions_are() -> None:
    from babysit.core.campaign.render import show_text

    view = {"campaign": "saga", "question": "why?", "suspects": [], "banked": [], "runs": [],
            "decisions": [{"call": 1, "run": "r", "question": "extend?", "options": ["hold"]}]}
    lines = show_text(view).splitlines()
    head = lines.index("decisions (owner calls: questions only the campaign's owners answer; nothing runs until "
                       "they do):")  # before: "decisions:" over "call #1 …", jargon alone
    assert lines[head + 1] == "  • call #1 (r): OPEN — extend? [hold]"
