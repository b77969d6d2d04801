"""`babysit register`'s checks of the command (registration.register, the one function the CLI, the
campaign's launches and a relaunch call): a program, or the script an interpreter is given, that is not
there is refused naming `run.command`;
a read_step past the run's end and a log folder nobody makes are warned about."""

from __future__ import annotations

import contextlib
import io
import os
import stat
import sys
from pathlib import Path

import pytest

from babysit.cli import main
from babysit.runtime import registry

PREREG = """
[prereg]
metric = "eval_loss"
baseline_step = 10
read_step = {read}
[[prereg.bands]]
label = "HEALTHY"
max = 0.1
"""


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def write(tmp_path: Path, command: str, extra: str = "", log: str = "out/{name}/log.jsonl") -> Path:
    spec = tmp_path / "r.toml"
    spec.write_text(f'[run]\nname = "r"\ncommand = {command}\nlog = "{log}"\n{extra}')
    return spec


def register(tmp_path: Path, spec: Path) -> tuple[int, str, str]:
    return run_cli("register", str(spec), "--registry", str(tmp_path / "babysit.toml"))


def test_a_program_not_on_path_is_refused_naming_run_command_and_the_nearest_programs(tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("python", "python3"):
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    spec = write(tmp_path, f'["pythn", "train.py"]\nenv = {{PATH = "{folder}"}}')
    code, out, err = register(tmp_path, spec)
    assert code == 2 and out == ""
    assert err.splitlines()[0] == (f"ERROR: {spec}: run.command: expected a program that exists (on PATH, or a path "
                                   f"relative to run.workdir {tmp_path}), got <'pythn': not found on PATH>")
    assert err.splitlines()[1] == ("HINT: did you mean 'python' or 'python3'? fix run.command's first item, or set "
                                   "PATH in [run].env for the trainer")
    assert registry.load(tmp_path / "babysit.toml").runs == (), "nothing registered"


def test_a_relative_program_is_looked_for_in_the_workdir_and_must_be_executable(tmp_path: Path) -> None:
    spec = write(tmp_path, '["./train.sh"]')
    code, _, err = register(tmp_path, spec)
    assert code == 2 and f"got <'./train.sh': {tmp_path / 'train.sh'} does not exist>" in err
    (tmp_path / "train.sh").write_text("#!/bin/sh\nexit 0\n")
    code, _, err = register(tmp_path, spec)
    assert code == 2 and "is not an executable file" in err and "chmod +x" in err
    (tmp_path / "train.sh").chmod(stat.S_IRWXU)
    code, out, _ = register(tmp_path, spec)
    assert code == 0 and out.startswith("added: r")


@pytest.mark.parametrize("command", [
    '["python", "trian.py"]', '["python3", "-u", "trian.py", "--steps", "10"]', '["bash", "trian.py"]',
    '["torchrun", "--nproc-per-node", "2", "trian.py"]'])
def test_a_script_that_is_not_in_the_workdir_is_refused_naming_run_command_and_the_nearest_file(
        tmp_path: Path, command: str) -> None:
    """`python trian.py` registered, launched, exited 2 and was classified `crashed`: refused now, as a
    missing program is."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("python", "python3", "bash", "torchrun"):
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = write(tmp_path, f'{command}\nenv = {{PATH = "{folder}"}}')
    code, out, err = register(tmp_path, spec)
    assert code == 2 and out == "", err
    assert err.splitlines()[0] == (f"ERROR: {spec}: run.command: expected a script that exists (a path relative to "
                                   f"run.workdir {tmp_path}), got <'trian.py': {tmp_path / 'trian.py'} does not exist>")
    assert err.splitlines()[1] == ("HINT: did you mean 'train.py'? fix the script's path in run.command (a path is "
                                   "relative to run.workdir)")
    assert registry.load(tmp_path / "babysit.toml").runs == (), "nothing registered"
    fixed = write(tmp_path, f'{command.replace("trian.py", "train.py")}\nenv = {{PATH = "{folder}"}}')
    assert register(tmp_path, fixed)[0] == 0


@pytest.mark.parametrize("command", ['["python", "-m", "trainer"]', '["python", "-c", "pass"]',
                                     '["bash", "-c", "python trian.py"]'])
def test_a_module_or_inline_code_names_no_script_to_look_for(tmp_path: Path, command: str) -> None:
    code, out, err = register(tmp_path, write(tmp_path, f'{command}\nenv = {{PATH = "{Path(sys.executable).parent}'
                                                        f'{os.pathsep}{os.environ.get("PATH", "")}"}}'))
    assert code == 0 and out.startswith("added: r"), err


def test_a_program_on_path_registers(tmp_path: Path) -> None:
    code, out, _ = register(tmp_path, write(tmp_path, f'["{Path(sys.executable).name}", "-c", "pass"]\n'
                                                      f'env = {{PATH = "{Path(sys.executable).parent}{os.pathsep}'
                                                      f'{os.environ.get("PATH", "")}"}}'))
    assert code == 0 and out.startswith("added: r")


@pytest.mark.parametrize(("args", "extra", "warned"), [
    ('"--steps", "100"', "", "the command says 100"),
    ('"--max_iters=100"', "", "the command says 100"),  # nanoGPT's configurator
    ('"--max_steps", "100"', "", "the command says 100"),  # Hugging Face
    ('"--steps", "5000"', "total_steps = 100\n", "run.total_steps says 100"),
    ('"--steps", "5000"', "", None),
])
def test_a_read_step_past_the_runs_known_end_warns(tmp_path: Path, args: str, extra: str, warned: str | None) -> None:
    spec = write(tmp_path, f'["{sys.executable}", "-c", "pass", {args}]\n{extra}', PREREG.format(read=200))
    (tmp_path / "out" / "r").mkdir(parents=True)
    code, out, err = register(tmp_path, spec)
    assert code == 0 and out.startswith("added: r"), "a warning, never a refusal"
    if warned is None:
        assert err == ""
    else:
        assert err == (f"WARNING: {spec}: prereg.read_step: 200 is past the run's last step ({warned}): the verdict "
                       "would never be read (NO-READ); lower read_step or let the run go to step 200 or beyond\n")


@pytest.mark.parametrize(("script", "warned"), [
    ("import babysit\nbabysit.log(1, loss=1.0)\n", False),
    ("from babysit.integrations.huggingface import BabysitCallback\n", False),
    ("import os\nopen(os.environ['BABYSIT_LOG'], 'a')\n", False),
    ("print('hello')\n", True),
])
def test_no_missing_folder_warning_for_a_trainer_that_writes_babysits_log(tmp_path: Path, script: str,
                                                                          warned: bool) -> None:
    (tmp_path / "train.py").write_text(script)
    code, _, err = register(tmp_path, write(tmp_path, f'["{sys.executable}", "train.py"]'))
    assert code == 0
    assert ("does not exist yet" in err) is warned, err


def test_every_door_in_checks_and_records_a_run_the_same_way(tmp_path: Path) -> None:
    """`babysit register`, a campaign's launch of a proposal (campaign/actions.launch_file) and a relaunch (the
    CLI's and the bot's: relaunch.prepare) all go through registration.register: the same run.toml is refused
    by each with the same words, and accepted by each into the same entry and the same frozen prereg."""
    from babysit.campaign.actions import launch_file
    from babysit.core.errors import BabysitError
    from babysit.db.store import Store
    from babysit.register import relaunch

    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "python").write_text("#!/bin/sh\n")
    (folder / "python").chmod(0o755)
    (tmp_path / "train.py").write_text("")
    good = f'["python", "train.py"]\nenv = {{PATH = "{folder}"}}'
    bad = f'["pythn", "train.py"]\nenv = {{PATH = "{folder}"}}'
    prereg = PREREG.format(read=100)

    def refusal(door) -> str:
        try:
            door()
        except BabysitError as exc:
            return exc.message
        raise AssertionError("registered a run whose program is not there")

    # a run registered once and ended, for the relaunch's door
    spec = write(tmp_path, good, prereg)
    assert register(tmp_path, spec)[0] == 0
    store = Store.in_dir(registry.load(tmp_path / "babysit.toml").state_dir)
    try:
        a = store.begin_attempt("r", 1, "default", ["python", "train.py"], "local", 0, str(tmp_path / "a1"), 1.0)
        store.mark_ended(a.id, ended_at=2.0, outcome="crashed", exit_code=1)
        store.set_run_state("r", "failed", 2.0)
    finally:
        store.close()
    before = registry.load(tmp_path / "babysit.toml").get("r")

    spec = write(tmp_path, bad, prereg)
    cli = register(tmp_path, spec)
    assert cli[0] == 2
    said = {"cli": cli[2].splitlines()[0].removeprefix("ERROR: "),
            "campaign": refusal(lambda: launch_file(tmp_path / "babysit.toml", spec)),
            "relaunch": refusal(lambda: relaunch.prepare(tmp_path / "babysit.toml", "r", accelerated=True,
                                                         shown=str(spec)))}
    assert len(set(said.values())) == 1 and "run.command: expected a program that exists" in said["cli"], said
    assert registry.load(tmp_path / "babysit.toml").get("r") == before, "a refusal writes nothing"

    spec = write(tmp_path, good, prereg)
    entries = {}
    for door, call in (("campaign", lambda: launch_file(tmp_path / "babysit.toml", spec)),
                       ("relaunch", lambda: relaunch.prepare(tmp_path / "babysit.toml", "r", accelerated=True)),
                       ("cli", lambda: register(tmp_path, spec))):
        call()
        entry = registry.load(tmp_path / "babysit.toml").get("r")
        entries[door] = (entry.name, entry.spec, entry.prereg_sha256)
    assert set(entries.values()) == {(before.name, before.spec, before.prereg_sha256)}, entries
