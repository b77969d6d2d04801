"""Printed-log presets and computed steps: `[source] kind = "stdout"` with `preset = NAME` (or "auto")
read the lines trainers print, on their real output (Lightning, HF) or on lines built from the tool's
own format strings (nanoGPT, word_language_model, torchtitan: each preset file names the file and
commit); `step = "EXPR"` builds a global step from counters that reset."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib

from babysit.core.errors import SpecError
from babysit.core.reading import presets
from babysit.core.reading.suggest import suggest, unread_answer
from babysit.core.spec.source import SourceSpec, parse_source, preset_line, preset_patterns
from babysit.core.spec.tomlfile import Table
from babysit.sources import stdout, unreadable
from babysit.sources.evidence import Evidence

FIXTURES = Path(__file__).parent / "fixtures" / "printed"
CORPUS = Path(__file__).parent / "fixtures" / "corpus"
ROOT = Path(__file__).resolve().parents[1]
WLM_BATCH = "| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | loss {:5.2f} | ppl {:8.2f}"
WLM_END = "| end of epoch {:3d} | time: {:5.2f}s | valid loss {:5.2f} | valid ppl {:8.2f}"


def source(table: dict, tmp_path: Path | None = None) -> SourceSpec:
    return parse_source(Table(table, "run.toml", "source"), workdir=tmp_path or Path("."), name="r", log=None)


def read_lines(src: SourceSpec, tmp_path: Path, out: str, err: str = "", state: dict | None = None):
    attempt = tmp_path / "run" / "attempt-1"
    attempt.mkdir(parents=True, exist_ok=True)
    with open(attempt / "stdout.log", "a") as f:
        f.write(out)
    with open(attempt / "stderr.log", "a") as f:
        f.write(err)
    return stdout.read(src, tmp_path / "run", state or {})


def wlm_lines(epochs: int = 2, nbatches: int = 2983, every: int = 200) -> str:
    out = []
    for epoch in range(1, epochs + 1):
        for batch in range(every, nbatches, every):
            out.append(WLM_BATCH.format(epoch, batch, nbatches, 20.0, 45.12, 7.0 - epoch / 10, 1000.0))
        out.append("-" * 89)
        out.append(WLM_END.format(epoch, 140.5, 5.54 - epoch / 10, 254.11))
        out.append("-" * 89)
    return "\n".join(out) + "\n"


def test_every_preset_loads_and_validates_as_source_patterns():
    assert set(presets.names()) >= {"nanogpt", "word_language_model", "huggingface", "torchtitan", "lightning",
                                    "tqdm"}
    for name in presets.names():
        assert preset_patterns(name), name
        assert presets.load(name).get("origin"), f"{name}: a preset names where its format comes from"
        assert name in preset_line(name)


def test_word_language_model_steps_are_computed_global_steps(tmp_path):
    got = read_lines(source({"kind": "stdout", "preset": "word_language_model"}), tmp_path, wlm_lines())
    by_step = {i.step: i.metrics for i in got.items}
    assert by_step[200]["loss"] == 6.9 and by_step[200]["ms_per_batch"] == 45.12
    assert by_step[2800]["loss"] == 6.9  # epoch 1, batch 2800
    assert by_step[2983]["valid_loss"] == 5.44  # end of epoch 1: epoch * nbatches
    assert by_step[2983 + 200]["loss"] == 6.8  # epoch 2 counts on from epoch 1's batches
    assert by_step[2 * 2983]["valid_loss"] == 5.34
    steps = [i.step for i in got.items]
    assert steps == sorted(steps) and not got.notices and not got.problems


def test_a_computed_step_that_goes_backwards_is_said_once_with_the_line(tmp_path):
    src = source({"kind": "stdout", "patterns": [{"regex": r"batch (?P<batch>\d+) loss (?P<loss>\S+)",
                                                  "step": "batch"}]})
    got = read_lines(src, tmp_path, "batch 10 loss 1.0\nbatch 20 loss 0.9\nbatch 5 loss 0.8\nbatch 3 loss 0.7\n")
    assert [i.step for i in got.items] == [10, 20, 5, 3]  # kept as computed, in the order printed
    assert len(got.notices) == 1 and got.notices[0][0] == "step-backwards"
    assert "20 → 5" in got.notices[0][1] and "batch 5 loss 0.8" in got.notices[0][1]
    again = read_lines(src, tmp_path, "batch 1 loss 0.6\n", state=got.state)
    assert again.notices == ()  # once, across reads too


def test_a_step_expression_uses_the_latest_value_an_earlier_line_printed(tmp_path):
    src = source({"kind": "stdout", "patterns": [
        {"regex": r"epoch (?P<epoch>\d+) of \d+"},  # no step of its own: refused below, so give it one
    ]}) if False else source({"kind": "stdout", "patterns": [
        {"regex": r"== epoch (?P<epoch>\d+) \((?P<per_epoch>\d+) steps\)", "step": "(epoch - 1) * per_epoch"},
        {"regex": r"it (?P<it>\d+) loss (?P<loss>\S+)", "step": "(epoch - 1) * per_epoch + it"}]})
    first = read_lines(src, tmp_path, "it 1 loss 9\n== epoch 1 (100 steps)\nit 10 loss 2.0\n")
    assert [(i.step, i.metrics.get("loss")) for i in first.items] == [(0, None), (10, 2.0)]
    assert any("could not be computed" in p for p in first.problems)  # before any epoch line: skipped, said
    later = read_lines(src, tmp_path, "== epoch 2 (100 steps)\nit 10 loss 1.5\n", state=first.state)
    assert [(i.step, i.metrics.get("loss")) for i in later.items] == [(100, None), (110, 1.5)]


@pytest.mark.parametrize("pattern, key, wanted", [
    ({"regex": r"b (?P<batch>\d+)", "step": "(epoch - 1) * nbatches + batch"}, "source.patterns[0].step",
     "named groups"),
    ({"regex": r"b (?P<step>\d+)", "step": "step + 1"}, "source.patterns[0].step", "not both"),
    ({"regex": r"b (?P<batch>\d+)", "step": "batch ** 2"}, "source.patterns[0].step", "arithmetic"),
    ({"regex": r"b (?P<batch>\d+)"}, "source.patterns[0].regex", 'step = "EXPR"'),
])
def test_a_bad_step_expression_is_refused_naming_its_key(pattern, key, wanted):
    with pytest.raises(SpecError) as err:
        source({"kind": "stdout", "patterns": [pattern]})
    assert err.value.key == key and wanted in err.value.message


@pytest.mark.parametrize("pattern, wanted", [
    ({"regex": r"b (?P<step>\d+)", "held_step": "step"}, 'a step = "EXPR" beside it'),
    ({"regex": r"b (?P<b>\d+)", "step": "b", "held_step": "b * latest_nbatches"}, "latest_ before one"),
    ({"regex": r"b (?P<b>\d+)", "step": "b", "held_step": "b ** 2"}, "arithmetic"),
])
def test_a_bad_held_step_is_refused_naming_its_key(pattern, wanted):
    with pytest.raises(SpecError) as err:
        source({"kind": "stdout", "patterns": [pattern]})
    assert err.value.key == "source.patterns[0].held_step" and wanted in err.value.message, err.value.message


def test_register_refuses_a_misspelt_step_name_with_exit_2(tmp_path):
    spec = tmp_path / "run.toml"
    spec.write_text('[run]\nname = "r"\ncommand = ["python", "t.py"]\n[source]\nkind = "stdout"\n'
                    '[[source.patterns]]\nregex = \'b (?P<batch>\\d+)/(?P<nbatches>\\d+)\'\n'
                    'step = "(epoch - 1) * nbatchs + batch"\n')
    done = subprocess.run([sys.executable, "-m", "babysit", "register", str(spec), "--registry",
                           str(tmp_path / "babysit.toml")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert "source.patterns[0].step" in done.stderr and "nbatchs" in done.stderr


def test_an_unknown_preset_is_refused_listing_the_presets():
    with pytest.raises(SpecError) as err:
        source({"kind": "stdout", "preset": "nanogtp"})
    assert err.value.key == "source.preset" and '"nanogpt"' in err.value.message
    with pytest.raises(SpecError):
        source({"kind": "csv", "path": "m.csv", "preset": "nanogpt"})


def test_nanogpt_preset_reads_its_format_strings(tmp_path):
    # karpathy/nanoGPT train.py @ e2221318: f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu
    # {running_mfu*100:.2f}%" and f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
    lines = "".join(f"iter {i}: loss {4.0 - i / 100:.4f}, time {35.123:.2f}ms, mfu {-100.0:.2f}%\n" for i in range(3))
    lines += f"step 250: train loss {3.91:.4f}, val loss {3.95:.4f}\niter 3: loss nan, time 35.00ms, mfu 1.20%\n"
    got = read_lines(source({"kind": "stdout", "preset": "auto"}), tmp_path, lines)
    assert got.notices == (("preset", "nanogpt"),)
    assert [(i.step, i.metrics) for i in got.items][:2] == [(0, {"train_loss": 4.0, "iter_ms": 35.12}),
                                                           (1, {"train_loss": 3.99, "iter_ms": 35.12})]
    assert (250, {"val_loss": 3.95}) in [(i.step, i.metrics) for i in got.items]
    assert str(got.items[-1].metrics["train_loss"]) == "nan"


def test_torchtitan_preset_reads_its_coloured_line_and_keeps_validation_apart(tmp_path):
    # pytorch/torchtitan torchtitan/components/metrics.py @ c594d8ac: f"{color.red}step: {step:2}  {color.green}
    # loss: {global_avg_loss:8.5f}  {color.orange}grad_norm: {grad_norm:7.4f}  {color.turquoise}memory: …"
    red, green, orange, reset = "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[39m"
    line = (f"[rank0]:[titan] 2025-06-01 12:00:00,000 - root - INFO - {red}step: {10:2}  {green}loss: {6.2345:8.5f}  "
            f"{orange}grad_norm: {1.2345:7.4f}  memory: 9.12GiB(11.50%)  tps: 1,234  tflops: 50.00  mfu: 10.00%{reset}\n")
    val = "[rank0]:[titan] 2025-06-01 12:01:00,000 - root - INFO - validate step: 500  loss:  2.3456  memory: 9GiB\n"
    got = read_lines(source({"kind": "stdout", "preset": "auto"}), tmp_path, line + val)
    assert got.notices == (("preset", "torchtitan"),)
    assert [(i.step, i.metrics) for i in got.items] == [(10, {"loss": 6.2345, "grad_norm": 1.2345}),
                                                         (500, {"val_loss": 2.3456})]


def test_lightning_preset_reads_real_tqdm_bar_output_with_prog_bar_metrics(tmp_path):
    # tests/integrations/printed.py lightning (lightning 2.6.6, TQDMProgressBar, self.log(prog_bar=True)),
    # 8 batches an epoch, 32 steps (4 whole epochs), validation every 10 steps
    text = (FIXTURES / "lightning_tqdm.stdout.log").read_text()
    got = read_lines(source({"kind": "stdout", "preset": "auto"}), tmp_path, text)
    assert got.notices == (("preset", "lightning"),)
    last: dict[str, tuple[int, float]] = {}
    for item in got.items:
        for k, v in item.metrics.items():
            last[k] = (item.step, v)
    assert last["train_loss"] == (32, 0.00724)
    first_val = min(i.step for i in got.items if "val_loss" in i.metrics)
    assert first_val == 10  # validated after step 10: the bar's postfix shows it from epoch 1's batch 2 on
    steps = [i.step for i in got.items]
    assert steps == sorted(steps) and max(steps) == 32  # the 0/8 frame a new epoch opens with is no step
    assert not got.problems


def test_auto_reads_with_the_general_reader_when_no_preset_matches(tmp_path):
    src = source({"kind": "stdout", "preset": "auto"})
    got = read_lines(src, tmp_path, "loading data\nEpoch 3 step 120 loss=0.52 acc 0.91\n")
    assert [(i.step, i.metrics) for i in got.items] == [(120, {"loss": 0.52, "acc": 0.91})]
    assert got.notices == (("preset", "general"),) and got.state["preset"] == "general"


def test_auto_says_none_matched_and_what_would(tmp_path):
    """A counter no reader knows (`upd`): nothing reads the line, and the message says what would."""
    src = source({"kind": "stdout", "preset": "auto"})
    got = read_lines(src, tmp_path, "loading data\nupd 120 loss=0.52 acc 0.91\n")
    assert got.items == () and got.notices == ()
    message = unreadable(src, Evidence(lines_seen=got.lines, records_parsed=0, output_bytes=100, sample=got.sample),
                         log=tmp_path / "records.jsonl")
    assert "no preset matched" in message and "nanogpt" in message and "general reader" in message
    would = suggest(got.sample)
    assert would in message
    follow = source({"kind": "stdout", "patterns": [{"regex": would}]})
    again = read_lines(follow, tmp_path / "b", "upd 120 loss=0.52 acc 0.91\n")
    assert [(i.step, i.metrics) for i in again.items] == [(120, {"loss": 0.52, "acc": 0.91})]


def test_the_incident_the_first_poll_and_the_early_answer_say_one_wording(tmp_path):
    """What reads a run's printed lines, and that nothing does and what would, is one renderer
    (suggest.unread_answer): the log-unreadable incident and the first poll's line say its words."""
    src = source({"kind": "stdout", "preset": "auto"})
    got = read_lines(src, tmp_path, "upd 120 loss=0.52 acc 0.91\n")
    tried = tuple(name for name, _ in src.candidates)
    incident = unreadable(src, Evidence(lines_seen=got.lines, records_parsed=0, output_bytes=100, sample=got.sample),
                          log=tmp_path / "records.jsonl")
    assert incident.startswith(unread_answer(tried, got.sample, lines=1))
    assert incident.endswith(" The run is not stopped for this.")
    assert stdout.KIND.reading_line(src, None, got.sample) == "📄 " + unread_answer(tried, got.sample)
    early = unread_answer(tried, got.sample, lines=1, early=True, spec_file="r.toml", command=("python3", "t.py"))
    assert early.endswith(f"or run again with: babysit run --pattern '{suggest(got.sample)}' -- python3 t.py")
    assert "Put it in r.toml under [source]" in early and "A preamble before the first metrics is normal" in early


def test_a_more_specific_preset_replaces_the_general_reader_when_its_line_comes(tmp_path):
    src = source({"kind": "stdout", "preset": "auto"})
    bar = " 33%|███▎      | 10/30 [00:01<00:02,  9.50it/s]\n"
    first = read_lines(src, tmp_path, "", bar)
    assert first.notices == (("preset", "general"),) and first.items[0].step == 10
    later = read_lines(src, tmp_path, "{'loss': '3.908', 'grad_norm': '0.8837', 'learning_rate': '0.0008667', "
                       "'epoch': '0.8333'}\n", state=first.state)
    assert later.notices == (("preset", "huggingface"),)
    assert {k: v for i in later.items for k, v in i.metrics.items()} == \
        {"loss": 3.908, "grad_norm": 0.8837, "learning_rate": 0.0008667, "epoch": 0.8333}
    assert {i.step for i in later.items} == {10}  # at the training bar's step


def test_hf_dicts_read_before_its_bar_are_placed_by_their_epoch_however_the_exit_read_is_cut(tmp_path):
    """HF's dicts (stdout) and bar (stderr) captured apart and read only at the run's exit: every dict comes
    before any bar step, so each is held until the reading has caught up, then placed at epoch × the bar's
    last step ÷ the last epoch printed: the steps HF logged at, however many reads the exit's drain takes."""
    (sample,) = [s for s in tomllib.loads((CORPUS / "huggingface.toml").read_text())["sample"]
                 if s["name"] == "trainer_split"]
    src = source({"kind": "stdout", "preset": "auto"})
    reads = {}
    for budget in (2**20, 700, 150):
        attempt = tmp_path / str(budget) / "run" / "attempt-1"
        attempt.mkdir(parents=True)
        (attempt / "stdout.log").write_text(sample["text"])
        (attempt / "stderr.log").write_text(sample["stderr"])
        state: dict = {}
        items = []
        while True:
            got = stdout.read(src, attempt.parent, state, budget=budget, final=True)
            state, items = got.state, items + [(i.step, dict(i.metrics)) for i in got.items]
            if not got.more:
                break
        assert not got.problems, got.problems
        reads[budget] = items
    assert reads[700] == reads[150] == reads[2**20]
    losses = [(step, m["loss"]) for step, m in reads[150] if "loss" in m]
    assert losses == [(5, 3.908), (10, 3.86), (15, 3.837), (20, 3.812), (25, 3.803), (30, 3.796)]
    assert [step for step, m in reads[150] if "eval_loss" in m] == [10, 20, 30]  # before: no dict gave a record


def test_a_second_attempt_s_hf_dicts_never_take_the_first_attempt_s_bar_step(tmp_path):
    """Two attempts of the split HF sample read at the end: attempt 2's dicts, read before its bar, are
    held and placed by its own epochs, not at the step attempt 1's bar ended on."""
    (sample,) = [s for s in tomllib.loads((CORPUS / "huggingface.toml").read_text())["sample"]
                 if s["name"] == "trainer_split"]
    for n in (1, 2):
        attempt = tmp_path / "run" / f"attempt-{n}"
        attempt.mkdir(parents=True)
        (attempt / "stdout.log").write_text(sample["text"])
        (attempt / "stderr.log").write_text(sample["stderr"])
    got = stdout.read(source({"kind": "stdout", "preset": "auto"}), tmp_path / "run", {}, final=True)
    losses = [i.step for i in got.items if "loss" in i.metrics]
    assert losses == [5, 10, 15, 20, 25, 30] * 2, losses


def test_a_flood_of_progress_bars_reads_the_same_records_as_line_by_line(tmp_path):
    """A read of many lines looks only at those holding a pattern's literal (or a colour code, which may
    split one): the records are the same as parsing every line."""
    lines = []
    for n in range(1, 3001):
        if n % 500 == 0:
            lines.append(f"iter {n // 500}: loss {1.0 / n:.4f}, time 1.00ms, mfu 1.00%")
        elif n == 1234:
            lines.append("it\x1b[0mer 99: loss 0.5000, time 1.00ms, mfu 1.00%")  # "iter" only once colour is gone
        else:
            lines.append(f" 40%|████      | {n}/3000 [00:01<00:02, 99999.00it/s]")
    src = source({"kind": "stdout", "preset": "nanogpt"})
    flood = read_lines(src, tmp_path / "a", "\n".join(lines) + "\n")
    one_by_one = [i for k in range(0, len(lines), 50) for i in
                  read_lines(src, tmp_path / f"b{k}", "\n".join(lines[k:k + 50]) + "\n").items]  # 50: the slow path
    assert [(i.step, dict(i.metrics)) for i in flood.items] == [(i.step, dict(i.metrics)) for i in one_by_one]
    assert [i.step for i in flood.items] == [1, 2, 99, 3, 4, 5, 6]
    assert flood.lines == 3000 and flood.sample.startswith("40%|")


@pytest.mark.slow
@pytest.mark.parametrize("framework, preset", [("hf", "huggingface"), ("lightning", "lightning")])
def test_presets_read_a_live_real_training(tmp_path, framework, preset):
    """The real trainer writing its captured files while they are read, as the daemon reads them."""
    attempt = tmp_path / "run" / "attempt-1"
    attempt.mkdir(parents=True)
    src = source({"kind": "stdout", "preset": "auto"})
    with open(attempt / "stdout.log", "wb") as out, open(attempt / "stderr.log", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tests.integrations.printed", framework, "--out",
                                 str(tmp_path / "out"), "--max-steps", "30"], stdout=out, stderr=err, cwd=ROOT)
        state: dict = {}
        items, notices = [], []
        while True:
            done = proc.poll() is not None
            got = stdout.read(src, tmp_path / "run", state)
            state, items, notices = got.state, items + list(got.items), notices + list(got.notices)
            if done:
                break
            time.sleep(0.05)
    assert proc.returncode == 0
    assert notices[-1] == ("preset", preset)
    losses = [(i.step, i.metrics) for i in items if {"loss", "train_loss"} & set(i.metrics)]
    # every loss it printed, in order; HF's dicts carry no step and are placed at the training bar's last
    # printed step, which may trail HF's own by what one read saw (docs/your-trainer.md)
    assert len(losses) >= 6 and all(0 <= step <= 30 for step, _ in losses)
    assert [s for s, _ in losses] == sorted(s for s, _ in losses)
    assert not [n for n in notices if n[0] == "step-backwards"]
    if framework == "hf":
        assert any("eval_loss" in i.metrics for i in items)
    else:
        assert any("val_loss" in i.metrics for i in items)
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
