"""The demo's workspace, its run files, and the thread that declares the amendment on time."""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from babysit.sources import logtail

DRIFT_RUN = "drift_disc"
CAMPAIGN = "drift_saga"
AUG_RUN = "drift_aug"  # the campaign's single-delta run: drift_disc with --image-augment 0.5
RETRY_RUN = "retry_demo"
STDOUT_RUN = "nanogpt_stdout"
ADHOC_RUN = "nanogpt_run"  # `babysit run -- CMD`: no run.toml written by hand
GENERAL_RUN = "shapes_run"  # `babysit run -- CMD` of a format no preset knows: the general reader
AMEND_AFTER_STEP = 250  # declared with eval data seen only through step 250 (docs/demo.md)


def run_toml_drift(python: str) -> str:
    return f'''# A pre-registered experiment in the shape of a real SFT-drift discriminator (docs/demo.md).
[run]
name = "{DRIFT_RUN}"
workdir = ".."              # the workspace root: outputs/ lands there
command = ["{python}", "-m", "trainer", "--recipe", "drift", "--log", "outputs/{{name}}/train_log.jsonl",
           "--checkpoints", "outputs/{{name}}/checkpoints", "--save-every", "500"]
log = "outputs/{{name}}/train_log.jsonl"
checkpoints = "outputs/{{name}}/checkpoints"
gpus = []
env = {{ OMP_NUM_THREADS = "1" }}  # the demo's trainers share your cores: one torch thread each

[guards]
min_free_host_ram_gib = 0.5
stall_minutes = 30
stop_grace_seconds = 30

[poll]
first_after_minutes = 5     # --accelerated: 5 s
every_minutes = 20          # --accelerated: 20 s (under 30 is refused without --accelerated)

[retry]
max_attempts = 2
on = ["oom", "diverged", "crashed"]
resume = "latest-checkpoint"

[prereg]
question = "Does the drift recipe's eval error climb between steps 500 and 1000 on one CPU?"
metric = "eval_chunk_mae"
baseline_step = 500
read_step = 1000
precision = 4
train_metric = "train_chunk_mae"

[prereg.references]          # banked deltas over the same window (see docs/demo.md)
drift_ref = {{DRIFT_REF}}
healthy_ref = {{HEALTHY_REF}}

[[prereg.bands]]
label = "HEALTHY"
max = 0.005
[[prereg.bands]]
label = "SAME-DRIFT"
min = "0.5 * drift_ref"
[prereg.otherwise]
label = "AMBIGUOUS"

[prereg.interpretation]
HEALTHY = "No climb after step 500: the drift does not reproduce on one CPU; look at the distributed path."
SAME-DRIFT = "The climb reproduces on one CPU: the recipe (small corpus, big model, no regularisation) is the suspect."
AMBIGUOUS = "Some climb, less than half the banked drift: owner call (extend to 1500 vs next single-delta run)."
AMBIGUOUS-BY-INSTRUMENT = "The raw and the scale-adjusted rules disagree: no conviction; check the instrument first."

[prereg.fixture]             # the instrument must reproduce a banked read on a known log before it is trusted
log = "../fixtures/healthy_train_log.jsonl"
expect_delta = {{FIXTURE_DELTA}}
expect_label = "HEALTHY"

[campaign]                   # the baseline run of the campaign drift_saga (docs/campaigns.md)
file = "campaign.toml"
[campaign.grid.AMBIGUOUS-BY-INSTRUMENT]
owner_call = "the raw and scaled rules disagree: check the instrument before reading the single-delta runs"
'''


CAMPAIGN_TOML = f'''# A campaign: why does the drift recipe climb after step 500? (docs/campaigns.md)
[campaign]
name = "{CAMPAIGN}"
question = "Why does the drift recipe's eval error climb after step 500?"
runs = ["{AUG_RUN}.toml"]    # registered by `babysit campaign register` (drift_disc, its parent, first)

[[suspects]]
name = "no-augment"
status = "live"
factors = ["--image-augment"]
note = "the drift recipe trains without image augmentation"
[[suspects]]
name = "lr"
factors = ["--lr", "--lr-scale"]
[[suspects]]
name = "label-noise"
note = "10 % noisy labels in a 32-episode corpus"

[[banked]]                   # the deltas every run of the campaign is read against (docs/demo.md)
name = "drift_ref"
delta = {{DRIFT_REF}}
note = "the drift recipe, Δ(500→1000) on CPU, seed 0"
[[banked]]
name = "healthy_ref"
delta = {{HEALTHY_REF}}
'''


# drift_aug asks its own question: its one delta is the augmentation, so its words are about that
# (`babysit register` warns when a single-delta run's question or interpretation is its parent's verbatim).
AUG_QUESTION = ("With image augmentation (--image-augment 0.5), does the drift recipe's eval error still climb "
                "between steps 500 and 1000 on one CPU?")
AUG_INTERPRETATION = """[prereg.interpretation]
HEALTHY = "With augmentation the climb is gone: the missing augmentation is the suspect (read against drift_disc)."
SAME-DRIFT = "The climb survives augmentation: the missing augmentation is exonerated; look at the learning rate."
AMBIGUOUS = "Augmentation shrinks the climb without removing it: owner call (extend to 1500 vs the next run)."
AMBIGUOUS-BY-INSTRUMENT = "The raw and the scale-adjusted rules disagree on the augmented run: check the instrument."
"""


def run_toml_aug(drift_text: str) -> str:
    """drift_disc with ONE delta, the suspect no-augment's flag, its own question and interpretation, and a
    grid for what each label does."""
    text = drift_text.replace(f'name = "{DRIFT_RUN}"', f'name = "{AUG_RUN}"', 1)
    text = text.replace('"--save-every", "500"]', '"--save-every", "500", "--image-augment", "0.5"]', 1)
    question = next(line for line in text.splitlines() if line.startswith("question = "))
    text = text.replace(question, f'question = "{AUG_QUESTION}"', 1)
    start = text.index("[prereg.interpretation]")
    end = text.index("\n\n", start) + 1
    text = text[:start] + AUG_INTERPRETATION + text[end:]
    head = text.partition("[campaign]")[0]
    return head + f'''[campaign]                   # a single-delta run of drift_saga: drift_disc, one flag changed
file = "campaign.toml"
parent = "{DRIFT_RUN}"
suspect = "no-augment"
[campaign.grid.HEALTHY]
suspects = {{ no-augment = "convicted" }}
say = "With augmentation the eval error stops climbing: the missing augmentation is CONVICTED."
bank = "banked/{{name}}"     # load-bearing: the first non-drifting checkpoints of the recipe
propose = {{ suspect = "lr", set = {{ "--lr-scale" = "0.5" }} }}
[campaign.grid.SAME-DRIFT]
suspects = {{ no-augment = "exonerated", lr = "live", label-noise = "live" }}
propose = {{ suspect = "lr", set = {{ "--lr-scale" = "0.5" }} }}
[campaign.grid.AMBIGUOUS]
owner_call = "some climb: extend to 1500 vs the next single-delta run"
'''


def run_toml_retry(python: str) -> str:
    return f'''# A run whose first profile diverges: classified at once, retried with the next declared profile.
[run]
name = "{RETRY_RUN}"
workdir = ".."
command = ["{python}", "-m", "trainer", "--recipe", "tiny", "--log", "outputs/{{name}}/train_log.jsonl",
           "--checkpoints", "outputs/{{name}}/checkpoints"]
log = "outputs/{{name}}/train_log.jsonl"
gpus = []
env = {{ OMP_NUM_THREADS = "1" }}

[guards]
min_free_host_ram_gib = 0.5
stop_grace_seconds = 10

[poll]
first_after_minutes = 3
every_minutes = 20

[retry]
max_attempts = 3
on = ["oom", "diverged"]

[[attempts]]
profile = "fast-lr"
args = ["--lr-scale", "4", "--inject-nan-at-step", "60"]   # the trainer's test hook stands in for a real blow-up

[[attempts]]
profile = "stable-lr"
args = ["--lr-scale", "0.5"]
'''


def run_toml_stdout(python: str) -> str:
    return f'''# A trainer babysit did not write, unchanged: it prints nanoGPT's lines, nothing else.
# babysit reads them with the patterns below (docs/your-trainer.md).
[run]
name = "{STDOUT_RUN}"
workdir = ".."
command = ["{python}", "-m", "babysit.demo.nanogpt_like", "--eval-every", "50", "--sleep", "0.02"]
total_steps = 300           # for the ETA: the trainer's flags are its own

[source]                    # records come from its stdout: one regex a line shape, named groups are metrics
kind = "stdout"
[[source.patterns]]
regex = 'iter (?P<step>\\d+): loss (?P<train_loss>\\S+), time (?P<iter_ms>[\\d.]+)ms'
[[source.patterns]]
regex = 'step (?P<step>\\d+): train loss \\S+, val loss (?P<val_loss>\\S+)'

[guards]
min_free_host_ram_gib = 0.5
stop_grace_seconds = 10     # the trainer goes on printing NaN: babysit stops it (non-finite *loss*)

[poll]
first_after_minutes = 2
every_minutes = 20

[retry]
on = ["diverged"]

[[attempts]]
profile = "lr-too-high"
args = ["--iters", "100000", "--nan-at", "120"]   # never ends by itself: NaN from iteration 120 on

[[attempts]]
profile = "lr-ok"
args = ["--iters", "300"]
'''


AMENDMENT = '''title = "measurement-scale calibration"
rationale = """Declared with eval data seen only through step 250, before the step-500 baseline. The banked
references were read on 24 px eval renders and this run evaluates on 16 px ones: the instrument's units
changed by about x2.5 (an estimate, declared as one). The step-1000 read computes both rules; if they
disagree the verdict is AMBIGUOUS-BY-INSTRUMENT. The frozen bounds are not edited."""
scale = "2.5"
combine = "agree"
'''


def make_workspace(where: Path | None) -> Path:
    root = Path(tempfile.mkdtemp(prefix="babysit-demo-")) if where is None else Path(where)
    root.mkdir(parents=True, exist_ok=True)
    (root / "runs").mkdir(exist_ok=True)
    (root / "fixtures").mkdir(exist_ok=True)
    fixture = resources.files("babysit.demo").joinpath("healthy_train_log.jsonl")
    with resources.as_file(fixture) as src:
        shutil.copyfile(src, root / "fixtures" / "healthy_train_log.jsonl")
    return root


def write_runs(root: Path, refs: dict[str, float]) -> tuple[Path, Path, Path, Path]:
    python = sys.executable
    drift = root / "runs" / "drift_disc.toml"
    text = run_toml_drift(python)
    for key, value in refs.items():
        text = text.replace("{" + key + "}", f"{value:.4f}")
    drift.write_text(text)
    retry = root / "runs" / "retry_demo.toml"
    retry.write_text(run_toml_retry(python))
    stdout = root / "runs" / f"{STDOUT_RUN}.toml"
    stdout.write_text(run_toml_stdout(python))
    amendment = root / "runs" / "amendment-1.toml"
    amendment.write_text(AMENDMENT)
    (root / "runs" / f"{AUG_RUN}.toml").write_text(run_toml_aug(text))
    campaign = CAMPAIGN_TOML
    for key, value in refs.items():
        campaign = campaign.replace("{" + key + "}", f"{value:.4f}")
    (root / "runs" / "campaign.toml").write_text(campaign)
    return drift, retry, stdout, amendment


class AmendOnTime(threading.Thread):
    """Declares the amendment once the step-250 eval is in the log and the baseline (500) is not."""

    def __init__(self, log: Path, declare: Callable[[], int]) -> None:
        super().__init__(name="demo-amend", daemon=True)
        self.log = log
        self.declare = declare
        self.result: int | None = None
        self.done = threading.Event()

    def run(self) -> None:
        state = logtail.TailState()
        while not self.done.is_set():
            read = logtail.read_new(self.log, state)
            state = read.state
            steps = [r.step for r in read.records if "eval_chunk_mae" in r.metrics]
            if steps and max(steps) >= AMEND_AFTER_STEP:
                self.result = self.declare()
                return
            time.sleep(0.2)
