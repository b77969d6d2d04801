"""run.toml → RunSpec: every default of SPEC §1, every rejection path with its exact message shape."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from babysit.core.errors import SpecError
from babysit.core.spec import expr
from babysit.core.spec.prereg import prereg_sha256
from babysit.core.spec.run_toml import GuardsSpec, PollSpec, RetrySpec, check_cadence, load_spec

MINIMAL = """
[run]
name = "r1"
command = ["python", "-m", "trainer"]
log = "outputs/{name}/train_log.jsonl"
"""

PREREG = """
[prereg]
question = "q"
metric = "eval_chunk_mae"
baseline_step = 500
read_step = 1000
[prereg.references]
demosonly = 2.0317
[[prereg.bands]]
label = "HEALTHY"
max = 0.30
[[prereg.bands]]
label = "SAME-DRIFT"
min = "0.5 * demosonly"
[prereg.otherwise]
label = "AMBIGUOUS"
"""


def write(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def rejection(tmp_path: Path, text: str) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text), display="run.toml")
    assert info.value.exit_code == 2
    return str(info.value)


def test_minimal_spec_takes_every_default(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, MINIMAL))
    assert spec.name == "r1" and spec.command == ("python", "-m", "trainer")
    assert spec.log == tmp_path / "outputs" / "r1" / "train_log.jsonl"  # {name} expanded, relative to the file
    assert spec.checkpoints == tmp_path / "outputs" / "r1" / "checkpoints"
    assert spec.workdir == tmp_path and spec.gpus == () and spec.executor == "local" and dict(spec.env) == {}
    assert spec.guards == GuardsSpec(True, 12.0, 8.0, 20.0, 120.0)
    assert spec.poll == PollSpec(5.0, 30.0, 50.0)
    assert spec.retry == RetrySpec(3, ("oom", "diverged"), "fresh")
    assert spec.attempts == () and spec.classify == () and spec.machinery_knobs == ()
    assert spec.prereg is None and spec.notify.channel is None and spec.slurm is None
    assert spec.profile_for(1).profile == "default"


def test_the_spec_example_loads_with_its_values(tmp_path: Path) -> None:
    text = Path(__file__).parent.joinpath("fixtures", "verdict", "seed_run.toml")
    spec = load_spec(text) if text.exists() else None
    spec = spec or load_spec(write(tmp_path, MINIMAL + PREREG))
    assert spec.prereg is not None and spec.prereg.baseline_step == 500 and spec.prereg.read_step == 1000


def test_attempt_k_uses_the_kth_profile_then_the_last(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, MINIMAL + """
[[attempts]]
profile = "a"
args = ["--batch-size", "2"]
[[attempts]]
profile = "b"
args = ["--batch-size", "1", "--grad-checkpointing"]
"""))
    assert [spec.profile_for(k).profile for k in (1, 2, 3, 7)] == ["a", "b", "b", "b"]


@pytest.mark.parametrize(("fragment", "message"), [
    ('[guards]\ngpu_hours_cap = -1', "run.toml: guards.gpu_hours_cap: expected a positive number, got -1"),
    ('[guards]\ngpu_hour_cap = 1', "run.toml: guards.gpu_hour_cap: expected a known key"),
    ('[guards]\nexclusive_gpu = "yes"', "run.toml: guards.exclusive_gpu: expected true or false, got 'yes'"),
    ('[guards]\nstall_minutes = 0', "run.toml: guards.stall_minutes: expected a positive number, got 0"),
    ('[guards]\nstop_grace_seconds = -5', "run.toml: guards.stop_grace_seconds: expected a number >= 0, got -5"),
    ('[poll]\nstarvation_util_pct = 150', "run.toml: poll.starvation_util_pct: expected a number between 0 and 100"),
    ('[poll]\nevery_minutes = "30"', "run.toml: poll.every_minutes: expected a positive number, got '30'"),
    ('[retry]\non = ["oom", "boom"]', "run.toml: retry.on: expected a list of failure classes"),
    ('[retry]\nmax_attempts = 0', "run.toml: retry.max_attempts: expected a positive integer, got 0"),
    ('[retry]\nresume = "sometimes"', 'run.toml: retry.resume: expected one of "fresh" | "latest-checkpoint"'),
    ('[[attempts]]\nargs = ["--x"]', "run.toml: attempts[0].profile: expected a value (this key is required)"),
    ('[[attempts]]\nprofile = "p"\nargs = "--x 1"', "run.toml: attempts[0].args: expected a list of strings"),
    ('[[classify]]\npattern = "("\nclass = "oom"', "run.toml: classify[0].pattern: expected a valid regular expression"),
    ('[[classify]]\npattern = "x"\nclass = "meh"', "run.toml: classify[0].class: expected one of"),
    ('[machinery]\nknobs = ["num-workers"]', "run.toml: machinery.knobs: expected a list of command-line flags"),
    ('[notify]\nmention_on_incident = "U1"', "run.toml: notify.mention_on_incident: expected a list of Slack user IDs"),
    ('[slurm]\ntime_limit = "soon"', "run.toml: slurm.time_limit: expected a Slurm time limit"),
    ('[smoke]\nsteps = 0', "run.toml: smoke.steps: expected a positive integer, got 0"),
    ('[retry]\ngpu_fault_max = -1', "run.toml: retry.gpu_fault_max: expected"),
    ('[retry]\non = ["gpu-faults"]', "run.toml: retry.on: expected a list of failure classes (oom | diverged | crashed | "
                                     "stalled | gpu-fault | node-lost)"),
    ('[extra]\nx = 1', "run.toml: extra: expected a known key"),
])
def test_bad_values_are_refused_naming_file_key_and_expectation(tmp_path: Path, fragment: str, message: str) -> None:
    assert rejection(tmp_path, MINIMAL + fragment).startswith(message)


@pytest.mark.parametrize(("run_table", "message"), [
    ('name = "R1"\ncommand = ["x"]\nlog = "l"', "run.toml: run.name: expected a run name matching [a-z0-9_.-]{1,64}"),
    ('name = "r"\ncommand = "python train.py"\nlog = "l"', "run.toml: run.command: expected a non-empty list of strings"),
    ('name = "r"\ncommand = []\nlog = "l"', "run.toml: run.command: expected a non-empty list of strings"),
    ('name = "r"\ncommand = ["x"]', "run.toml: run.log: expected a value (this key is required)"),
    ('command = ["x"]\nlog = "l"', "run.toml: run.name: expected a value (this key is required)"),
    ('name = "r"\ncommand = ["x"]\nlog = "{nme}/l"', "run.toml: run.log: expected a path whose only placeholder is {name}"),
    ('name = "r"\ncommand = ["x"]\nlog = "l"\ngpus = [0, 0]', "run.toml: run.gpus: expected a list of non-negative integers"),
    ('name = "r"\ncommand = ["x"]\nlog = "l"\ngpus = [-1]', "run.toml: run.gpus: expected a list of non-negative integers"),
    ('name = "r"\ncommand = ["x"]\nlog = "l"\ngpus = "any"', 'run.toml: run.gpus: expected a list of GPU indices ([0, 1]) or "any N"'),
    ('name = "r"\ncommand = ["x"]\nlog = "l"\ngpus = "any 0"', 'run.toml: run.gpus: expected a list of GPU indices ([0, 1]) or "any N"'),
    ('name = "r"\ncommand = ["x"]\nlog = "l"\ngpus = [0]\nspare_gpus = [0]',
     "run.toml: run.spare_gpus: expected GPUs not already in run.gpus, got [0]"),
    ('name = "r"\ncommand = ["x"]\nlog = "l"\nexecutor = "k8s"', 'run.toml: run.executor: expected one of "local" | "slurm"'),
    ('name = "r"\ncommand = ["x"]\nlog = "l"\nenv = { A = 1 }', "run.toml: run.env.A: expected a string, got 1"),
    ('name = "r"\ncommand = ["x"]\nlog = "l"\nstop_signal = "SIGKILL"',
     'run.toml: run.stop_signal: expected one of "SIGTERM" | "SIGINT" | "SIGHUP" | "SIGUSR1" | "SIGUSR2", got \'SIGKILL\''),
    ('name = "r"\ncommand = ["x"]\nlog = "l"\nstop_signal = "TERM"', "run.toml: run.stop_signal: expected one of"),
    ('name = "r"\ncommand = ["x"]\nlog = "l"\nstop_signal = 15', "run.toml: run.stop_signal: expected one of"),
])
def test_bad_run_tables_are_refused(tmp_path: Path, run_table: str, message: str) -> None:
    assert rejection(tmp_path, "[run]\n" + run_table + "\n").startswith(message)


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2"])
def test_stop_signal_defaults_to_sigterm_and_takes_a_catchable_signal(tmp_path: Path, name: str) -> None:
    assert load_spec(write(tmp_path, MINIMAL)).stop_signal == "SIGTERM"
    spec = load_spec(write(tmp_path, MINIMAL.replace('log = ', f'stop_signal = "{name}"\nlog = ')))
    assert spec.stop_signal == name


def test_missing_run_table_and_bad_toml_and_missing_file(tmp_path: Path) -> None:
    assert rejection(tmp_path, "[guards]\n").startswith("run.toml: run: expected a table (this table is required)")
    assert "expected valid TOML" in rejection(tmp_path, "[run\nname=")
    with pytest.raises(SpecError, match="expected an existing TOML file"):
        load_spec(tmp_path / "nope.toml")


@pytest.mark.parametrize(("fragment", "message"), [
    ("read_step = 400", "run.toml: prereg.read_step: expected a step after baseline_step (500), got 400"),
    ("precision = 20", "run.toml: prereg.precision: expected an integer between 0 and 12, got 20"),
])
def test_prereg_step_and_precision_rules(tmp_path: Path, fragment: str, message: str) -> None:
    text = MINIMAL + PREREG.replace("read_step = 1000", fragment if "read_step" in fragment else "read_step = 1000")
    if "precision" in fragment:
        text = text.replace("read_step = 1000", "read_step = 1000\n" + fragment)
    assert rejection(tmp_path, text).startswith(message)


@pytest.mark.parametrize(("old", "new", "message"), [
    ('min = "0.5 * demosonly"', 'min = "0.5 * mixedv2"', "run.toml: prereg.bands[1].min: expected arithmetic over numbers and names from [prereg.references]"),
    ('min = "0.5 * demosonly"', 'min = "__import__(\'os\')"', "run.toml: prereg.bands[1].min: expected a number or arithmetic"),
    ('min = "0.5 * demosonly"', 'min = "demosonly ** 2"', "run.toml: prereg.bands[1].min: expected a number or arithmetic"),
    ('max = 0.30', 'mx = 0.30', "run.toml: prereg.bands[0].mx: expected a known key"),
    ('label = "SAME-DRIFT"', 'label = "HEALTHY"', "run.toml: prereg.bands: expected distinct labels"),
    ('label = "AMBIGUOUS"', 'label = "AMBIGUOUS-BY-INSTRUMENT"', "run.toml: prereg.bands: expected labels other than AMBIGUOUS-BY-INSTRUMENT"),
])
def test_prereg_band_rejections(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert rejection(tmp_path, MINIMAL + PREREG.replace(old, new, 1)).startswith(message)


def test_a_band_needs_a_bound_and_interpretations_need_known_labels(tmp_path: Path) -> None:
    assert "expected a band with max, min or both" in rejection(
        tmp_path, MINIMAL + PREREG.replace("max = 0.30", ""))
    assert "prereg.interpretation.CONVICTED: expected a label of the bands" in rejection(
        tmp_path, MINIMAL + PREREG + '[prereg.interpretation]\nCONVICTED = "x"\n')


def test_prereg_hash_is_canonical_and_changes_with_any_edit(tmp_path: Path) -> None:
    a = load_spec(write(tmp_path, MINIMAL + PREREG, "a.toml")).prereg
    reordered = PREREG.replace('question = "q"\nmetric = "eval_chunk_mae"', 'metric = "eval_chunk_mae"\nquestion = "q"')
    b = load_spec(write(tmp_path, "# a comment\n" + MINIMAL + reordered, "b.toml")).prereg
    c = load_spec(write(tmp_path, MINIMAL + PREREG.replace("0.30", "0.31"), "c.toml")).prereg
    assert a is not None and b is not None and c is not None
    assert a.sha256 == b.sha256, "key order and comments do not change what was frozen"
    assert a.sha256 != c.sha256
    assert a.sha256 == prereg_sha256({"question": "q", "metric": "eval_chunk_mae", "baseline_step": 500,
                                      "read_step": 1000, "references": {"demosonly": 2.0317},
                                      "bands": [{"label": "HEALTHY", "max": 0.30},
                                                {"label": "SAME-DRIFT", "min": "0.5 * demosonly"}],
                                      "otherwise": {"label": "AMBIGUOUS"}})


def test_cadence_under_30_minutes_needs_accelerated(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, MINIMAL + "[poll]\nevery_minutes = 5\n"), display="run.toml")
    check_cadence(spec, accelerated=True)
    with pytest.raises(SpecError, match=r"run.toml: poll.every_minutes: expected a number >= 30, got 5.0"):
        check_cadence(spec, accelerated=False)


@pytest.mark.parametrize(("source", "refs", "value"), [
    ("0.30", {}, 0.30), ("0.5 * demosonly", {"demosonly": 2.0317}, 1.01585), ("-(1 + 2) / 4", {}, -0.75),
    (1, {}, 1.0), ("12.5087 / 3.4623", {}, 12.5087 / 3.4623),
])
def test_bound_expressions_evaluate(source: object, refs: dict, value: float) -> None:
    assert expr.parse(source).evaluate(refs) == pytest.approx(value)


@pytest.mark.parametrize("source", ["__import__('os').system('true')", "a.b", "f(1)", "1 ** 2", "[1]", "True",
                                    "1 if 1 else 2", "", "lambda: 1", "x[0]", "1 // 2", "1 % 2"])
def test_anything_but_arithmetic_is_refused(source: str) -> None:
    with pytest.raises(expr.ExprError):
        expr.parse(source)


def test_division_by_zero_and_unknown_names_are_errors_not_crashes() -> None:
    with pytest.raises(expr.ExprError):
        expr.parse("1 / (2 - 2)").evaluate({})
    with pytest.raises(expr.ExprError):
        expr.parse("nope * 2").evaluate({})


# -- a misspelt required key is named as the typo (issue 18) -------------------------------------------

@pytest.mark.parametrize(("text", "typo", "meant"), [
    ('[run]\nname = "r"\ncommnd = ["x"]\nlog = "l"\n', "run.commnd", "command"),
    ('[run]\nname = "r"\ncommand = ["x"]\nlg = "l"\n', "run.lg", "log"),
    ('[run]\nnme = "r"\ncommand = ["x"]\nlog = "l"\n', "run.nme", "name"),
    ('[rn]\nname = "r"\ncommand = ["x"]\nlog = "l"\n', "rn", "run"),
    (MINIMAL + '[[attempts]]\nprofil = "a"\n', "attempts[0].profil", "profile"),
    (MINIMAL + '[[classify]]\npatern = "x"\nclass = "oom"\n', "classify[0].patern", "pattern"),
    (MINIMAL + '[[classify]]\npattern = "x"\nclas = "oom"\n', "classify[0].clas", "class"),
    (MINIMAL + PREREG.replace("metric =", "metrc ="), "prereg.metrc", "metric"),
    (MINIMAL + PREREG.replace("baseline_step =", "baseline_stp ="), "prereg.baseline_stp", "baseline_step"),
    (MINIMAL + PREREG.replace("[[prereg.bands]]", "[[prereg.band]]"), "prereg.band", "bands"),
    (MINIMAL + PREREG.replace('label = "HEALTHY"', 'lable = "HEALTHY"'), "prereg.bands[0].lable", "label"),
    (MINIMAL + PREREG.replace('label = "AMBIGUOUS"', 'labl = "AMBIGUOUS"'), "prereg.otherwise.labl", "label"),
    (MINIMAL + PREREG + '[prereg.fixture]\nlog = "f.jsonl"\nexpect_delt = 0.1\nexpect_label = "HEALTHY"\n',
     "prereg.fixture.expect_delt", "expect_delta"),
    (MINIMAL + '[smoke]\n[[smoke.candidates]]\nprofle = "a"\n', "smoke.candidates[0].profle", "profile"),
])
def test_a_misspelt_required_key_is_named_as_the_typo_with_the_key_it_misses(
        tmp_path: Path, text: str, typo: str, meant: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text), display="run.toml")
    assert str(info.value) == f'run.toml: {typo}: unknown key — did you mean "{meant}"?'
    assert info.value.hint is not None and f'rename it to "{meant}"' in info.value.hint
    assert info.value.exit_code == 2


def test_a_missing_required_key_without_a_near_miss_is_still_said_missing(tmp_path: Path) -> None:
    text = '[run]\nname = "r"\ncommand = ["x"]\nwhere = "l"\n'  # not a typo of "log": the plain message
    assert rejection(tmp_path, text) == "run.toml: run.log: expected a value (this key is required), got <nothing>"


def test_no_key_babysit_reads_is_a_near_miss_of_a_required_key_of_its_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes "unknown key — did you mean" safe to say: a key babysit reads can never be taken for a
    misspelling of a required key of the same table. Every read of a full run.toml, babysit.toml and
    amendment is recorded (the reads themselves are the real ones), then every pair is compared."""
    import difflib
    import re
    from collections import defaultdict

    from babysit.core.spec import tomlfile
    from babysit.core.spec.amendment import load_amendment
    from babysit.runtime.registry import load

    keys: dict[str, set[str]] = defaultdict(set)
    needed: dict[str, set[str]] = defaultdict(set)
    real_raw, real_table, real_tables = tomlfile.Table.raw, tomlfile.Table.table, tomlfile.Table.tables

    def where(table: tomlfile.Table) -> str:
        return Path(table.file).name + ":" + re.sub(r"\[\d+\]", "[]", table.path)

    def raw(self: tomlfile.Table, name: str, default: object = tomlfile._MISSING) -> object:
        keys[where(self)].add(name)
        if default is tomlfile._MISSING:
            needed[where(self)].add(name)
        return real_raw(self, name, default)

    def table(self: tomlfile.Table, name: str, required: bool = False) -> object:
        keys[where(self)].add(name)
        if required:
            needed[where(self)].add(name)
        return real_table(self, name, required)

    def tables(self: tomlfile.Table, name: str) -> object:
        keys[where(self)].add(name)
        return real_tables(self, name)

    monkeypatch.setattr(tomlfile.Table, "raw", raw)
    monkeypatch.setattr(tomlfile.Table, "table", table)
    monkeypatch.setattr(tomlfile.Table, "tables", tables)
    full_run = MINIMAL.replace("[run]", '[run]\nworkdir = "."\ncheckpoints = "c"\ngpus = [0]\nexecutor = "slurm"\n'
                                        'env = { A = "1" }') + PREREG.replace(
        'question = "q"', 'question = "q"\nprecision = 3\ntrain_metric = "train_mae"') + """
[prereg.interpretation]
HEALTHY = "fine"
[prereg.fixture]
log = "f.jsonl"
expect_delta = 0.1
expect_label = "HEALTHY"
[guards]
exclusive_gpu = true
[poll]
every_minutes = 30
[retry]
max_attempts = 2
[[attempts]]
profile = "a"
args = ["--x"]
[[classify]]
pattern = "ECC"
class = "crashed"
retry = false
[machinery]
knobs = ["--num-workers"]
[notify]
channel = "#runs"
[slurm]
partition = "gpu"
[smoke]
steps = 5
[[smoke.candidates]]
profile = "a"
"""
    load_spec(write(tmp_path, full_run), display="run.toml")
    load(write(tmp_path, '[daemon]\nstate_dir = "s"\nchannel = "#c"\n[[runs]]\nname = "a"\nspec = "a.toml"\n'
                         'registered_at = "2026-08-17T18:41:02Z"\nprereg_sha256 = "' + "a" * 64 + '"\n',
               "babysit.toml"))
    load_amendment(Path(__file__).parent / "fixtures" / "verdict" / "scale_amendment.toml", "amendment.toml")
    keys.pop("run.toml:prereg.references", None)  # reference names are the user's own, not babysit's keys
    assert {"run.toml:run", "run.toml:prereg.fixture", "babysit.toml:runs[]", "amendment.toml:"} <= set(keys)
    near = [(t, r, k) for t, names in keys.items() for r in needed[t] for k in names - {r}
            if difflib.SequenceMatcher(None, r, k).ratio() >= tomlfile.NEAR_MISS]
    assert near == [], "a key babysit reads is within NEAR_MISS of a required key: raise NEAR_MISS or rename the key"


# -- exclusive_gpu on a CPU run (issue 18) ---------------------------------------------------------------

def test_exclusive_gpu_written_true_on_a_cpu_run_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, MINIMAL + "[guards]\nexclusive_gpu = true\n"), display="run.toml")
    assert str(info.value) == ("run.toml: guards.exclusive_gpu: expected false, or GPUs in run.gpus (a CPU run "
                               "holds no GPU), got <true with run.gpus = []>")
    assert "run.gpus = [0]" in (info.value.hint or "") and "exclusive_gpu = false" in (info.value.hint or "")
    assert info.value.exit_code == 2


@pytest.mark.parametrize(("gpus", "guards"), [("[]", ""), ("[]", "[guards]\nexclusive_gpu = false\n"),
                                              ("[0]", "[guards]\nexclusive_gpu = true\n"), ("[0]", "")])
def test_exclusive_gpu_is_accepted_wherever_it_means_something_or_is_not_written(
        tmp_path: Path, gpus: str, guards: str) -> None:
    spec = load_spec(write(tmp_path, MINIMAL.replace("[run]", f"[run]\ngpus = {gpus}") + guards))
    assert spec.gpus == tuple(json.loads(gpus))


def test_gpus_any_n_and_spares_and_the_gpu_fault_budget(tmp_path: Path) -> None:
    from babysit.core.spec.run_toml import load_spec

    spec = load_spec(write(tmp_path, '[run]\nname = "r"\ncommand = ["x"]\nlog = "l"\ngpus = "any 2"\n'
                                     '[retry]\non = ["gpu-fault"]\ngpu_fault_max = 5\n'))
    assert (spec.gpus, spec.gpus_any, spec.retry.on, spec.retry.gpu_fault_max) == ((0, 1), True, ("gpu-fault",), 5)
    spare = load_spec(write(tmp_path, '[run]\nname = "r"\ncommand = ["x"]\nlog = "l"\ngpus = [0]\nspare_gpus = [3]\n'))
    assert (spare.gpus, spare.gpus_any, spare.spare_gpus, spare.retry.gpu_fault_max) == ((0,), False, (3,), 2)
