"""When a source with no record is unreadable: enough lines AND enough time since the first line."""

from __future__ import annotations

import pytest

from babysit.core.reading import readable


@pytest.mark.parametrize(("lines", "seconds", "minute", "due"), [
    (55, 30.0, 60.0, False),  # nanoGPT's preamble, 30 s in
    (55, 3600.0, 60.0, False),  # a short preamble then a long first step: lines decide
    (800, 90.0, 60.0, False),  # an HF config dump: hundreds of lines in the first minute
    (800, 301.0, 60.0, True),  # and still no record five minutes on: unreadable
    (100, 300.0, 60.0, True),  # both thresholds exactly
    (99, 10_000.0, 60.0, False),
    (500, 6.0, 1.0, True),  # --accelerated: a declared minute is a second
    (None, 301.0, 60.0, True),  # a source that does not count lines: time alone
    (None, 299.0, 60.0, False),
    (500, None, 60.0, False),  # no output seen yet
])
def test_both_thresholds_must_pass(lines, seconds, minute, due):
    assert (readable.judge(lines, seconds, minute) is not None) is due


def test_the_incident_says_how_long_it_waited_in_real_time_and_how_many_lines():
    assert readable.judge(412, 6.2, 1.0).phrase() == "babysit waited 6s after the first line of output and saw 412 lines"
    assert readable.judge(None, 605.0, 60.0).phrase() == "babysit waited 10m05s after the first line of output"
