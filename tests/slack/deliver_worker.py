"""A delivering process for the crash tests: `python -m tests.slack.deliver_worker STATE_DIR`.

It runs the real outbox worker (`deliver_due`) with the real SlackChannel (BABYSIT_SLACK_API_URL,
SLACK_BOT_TOKEN) until nothing is pending, then exits 0. With BABYSIT_CRASH_AT naming a crash point it
SIGKILLs itself there (babysit/runtime/faults.py): the crash is a real one, not an exception.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from babysit.channels.notify import deliver_due
from babysit.db.store import Store
from babysit.slack.channel import SlackChannel
from babysit.slack.client import web_client


def main(argv: list[str]) -> int:
    state = Path(argv[0])
    store = Store.in_dir(state)
    channel = SlackChannel(web_client(timeout=5), state, default_channel="C0RUNS", store=store)
    clock = [time.time()]  # a clock that jumps over retry backoffs: the test is about crashes, not waiting
    for _ in range(200):
        deliver_due(store, channel, lambda: clock[0])
        if store.pending_count() == 0:
            store.close()
            return 0
        clock[0] += 5.0
    print(f"{store.pending_count()} messages still pending", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
