"""What the outage tests (test_outage.py, test_outage_start.py) register: a run.toml with the guards and polls
an outage needs out of its way, and the prereg a gated run's FINAL verdict is read with."""

from __future__ import annotations

import json
from pathlib import Path

PREREG = """
[prereg]
question = "Does val_loss fall between steps 50 and 100?"
metric = "val_loss"
baseline_step = 50
read_step = 100
[[prereg.bands]]
label = "IMPROVED"
max = 0.0
[prereg.otherwise]
label = "NOT-IMPROVED"
"""


def write_spec(box: Path, run: str, cmd: list[str], body: str = "") -> Path:
    path = box / f"{run}.toml"
    path.write_text(f"""[run]
name = "{run}"
command = {json.dumps(cmd)}
log = "outputs/{{name}}/train_log.jsonl"
gpus = [0]

[guards]
min_free_host_ram_gib = 0.1
stop_grace_seconds = 20
stall_minutes = 120

[poll]
first_after_minutes = 600
every_minutes = 600
{body}""")
    return path
