"""A delivering process for the memory check: `python -m tests.reliability.slack_worker STATE ROUNDS PER_ROUND`.

It plays a daemon through a long Slack outage on a time-shifted clock (each round is a minute): every
round it queues PER_ROUND messages over 5 runs and runs the real outbox worker (`deliver_due`) against
the real SlackChannel over real HTTP (BABYSIT_SLACK_API_URL). It prints one JSON line per sample:
round, its RSS in bytes, pending messages.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psutil

from babysit.channels.notify import deliver_due
from babysit.db.store import Store
from babysit.slack.channel import SlackChannel
from babysit.slack.client import web_client


def main(argv: list[str]) -> int:
    state, rounds, per_round = Path(argv[0]), int(argv[1]), int(argv[2])
    store = Store.in_dir(state)
    channel = SlackChannel(web_client(timeout=2), state, default_channel="C0RUNS", store=store)
    me = psutil.Process()
    t = 1_000_000.0
    roots: dict[str, int] = {}
    for r in range(rounds):
        for i in range(per_round):
            run = f"run{i % 5}"
            if run not in roots:
                roots[run] = store.enqueue(run, "launch", {"run": run, "attempt": 1, "max_attempts": 3,
                                                           "profile": "p", "argv": ["python"], "gpus": [0],
                                                           "executor": "local", "channel": "C0RUNS"}, t)
            else:
                store.enqueue(run, "poll", {"run": run, "snapshot": {"run": run, "kind": "periodic", "step": r}},
                              t, thread_of=roots[run])
        deliver_due(store, channel, lambda now=t: now)
        t += 60.0
        if r % 50 == 0 or r == rounds - 1:
            print(json.dumps({"round": r, "rss": me.memory_info().rss, "pending": store.pending_count()}),
                  flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
