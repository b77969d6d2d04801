"""babysit.toml: validation messages, idempotent registration, and a writer that is safe under
concurrency and SIGKILL (real files, real processes)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from babysit.core.errors import EXIT_BAD_INPUT, RegistryError, SpecError, UnknownRun
from babysit.runtime import registry
from babysit.runtime.registry import DaemonSettings, Registry, RunEntry, load, resolve_registry_path, update, with_run

SHA_A = "a" * 64
SHA_B = "b" * 64
WHEN = "2026-08-17T18:41:02Z"
LATER = "2026-08-18T09:00:00Z"

GOOD = f"""\
[daemon]
state_dir = "state"
channel = "#ml-runs"
abort_allow_list = ["U024BE7LH"]
guard_interval_seconds = 15
gpu_sample_seconds = 0.5

[[runs]]
name = "grasp_sft_v2_demosonly_1gpu_disc"
spec = "runs/disc.toml"
prereg_sha256 = "{SHA_A}"
registered_at = "{WHEN}"

[[runs]]
name = "plain.run-2"
spec = "/abs/plain.toml"
registered_at = "{WHEN}"
"""


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in a temp directory so messages name `babysit.toml` as a user would type it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(text: str) -> Path:
    path = Path("babysit.toml")
    path.write_text(textwrap.dedent(text))
    return path


def entry(name: str = "run_a", spec: str = "runs/a.toml", sha: str | None = SHA_A, when: str = WHEN) -> RunEntry:
    return RunEntry(name=name, spec=spec, registered_at=when, prereg_sha256=sha)


# --- loading -----------------------------------------------------------------------------------


def test_a_missing_file_is_an_empty_registry_with_defaults(here: Path) -> None:
    reg = load(Path("babysit.toml"))
    assert reg == Registry(here / "babysit.toml")
    assert reg.daemon == DaemonSettings() and reg.runs == ()
    assert reg.state_dir == here / ".babysit"


def test_a_valid_file_loads_every_field(here: Path) -> None:
    reg = load(write(GOOD))
    assert reg.daemon == DaemonSettings("state", "#ml-runs", ("U024BE7LH",), 15.0, 0.5)
    assert reg.names == ("grasp_sft_v2_demosonly_1gpu_disc", "plain.run-2")
    disc = reg.get("grasp_sft_v2_demosonly_1gpu_disc")
    assert disc == RunEntry("grasp_sft_v2_demosonly_1gpu_disc", "runs/disc.toml", WHEN, SHA_A)
    assert reg.get("plain.run-2").prereg_sha256 is None
    assert reg.spec_path(disc) == here / "runs" / "disc.toml"
    assert reg.spec_path(reg.get("plain.run-2")) == Path("/abs/plain.toml")
    assert reg.state_dir == here / "state"


def test_the_written_file_reads_back_equal_in_a_stable_order(here: Path) -> None:
    reg = load(write(GOOD))
    text = registry.dumps(reg)
    assert text.index("\n[daemon]") < text.index("\n[[runs]]") < text.index('name = "plain.run-2"')
    Path("copy.toml").write_text(text)
    assert load(Path("copy.toml")) == Registry(here / "copy.toml", reg.daemon, reg.runs)
    assert registry.dumps(load(Path("copy.toml"))) == text


@pytest.mark.parametrize(("text", "message"), [
    ("[daemon\n", "babysit.toml: expected valid TOML, got <syntax error: "),
    ("colour = 1\n", "babysit.toml: colour: expected a known key (daemon, host, runs, store), got <unknown key>"),
    ("[daemon]\nchanel = '#x'\n",
     "babysit.toml: daemon.chanel: expected a known key (abort_allow_list, channel, gpu_sample_seconds, "
     "guard_interval_seconds, state_dir), got <unknown key>"),
    (f"[[runs]]\nname = 'a'\nspec = 'a.toml'\nregistered_at = '{WHEN}'\nowner = 'me'\n",
     "babysit.toml: runs[0].owner: expected a known key (name, prereg_sha256, registered_at, spec), "
     "got <unknown key>"),
    ("daemon = 3\n", "babysit.toml: daemon: expected a table, got 3"),
    ("[daemon]\nstate_dir = 3\n", "babysit.toml: daemon.state_dir: expected a non-empty path, got 3"),
    ("[daemon]\nstate_dir = ''\n", "babysit.toml: daemon.state_dir: expected a non-empty path, got ''"),
    ("[daemon]\nchannel = ['#a']\n",
     "babysit.toml: daemon.channel: expected a non-empty Slack channel (e.g. \"#ml-runs\"), got ['#a']"),
    ("[daemon]\nabort_allow_list = 'U024BE7LH'\n",
     "babysit.toml: daemon.abort_allow_list: expected a list of Slack user IDs (e.g. \"U024BE7LH\"), got 'U024BE7LH'"),
    ("[daemon]\nabort_allow_list = ['U024BE7LH', '@alice']\n",
     "babysit.toml: daemon.abort_allow_list[1]: expected a Slack user ID like \"U024BE7LH\", got '@alice'"),
    ("[daemon]\nguard_interval_seconds = -1\n",
     "babysit.toml: daemon.guard_interval_seconds: expected a positive number, got -1"),
    ("[daemon]\nguard_interval_seconds = '30'\n",
     "babysit.toml: daemon.guard_interval_seconds: expected a positive number, got '30'"),
    ("[daemon]\nguard_interval_seconds = true\n",
     "babysit.toml: daemon.guard_interval_seconds: expected a positive number, got True"),
    ("[daemon]\ngpu_sample_seconds = 0\n",
     "babysit.toml: daemon.gpu_sample_seconds: expected a positive number, got 0"),
    ("runs = 3\n", "babysit.toml: runs: expected an array of tables ([[runs]]), got 3"),
    ("runs = [1]\n", "babysit.toml: runs[0]: expected a table, got 1"),
    (f"[[runs]]\nspec = 'a.toml'\nregistered_at = '{WHEN}'\n",
     "babysit.toml: runs[0].name: expected a value (this key is required), got <nothing>"),
    (f"[[runs]]\nname = 'Bad Name'\nspec = 'a.toml'\nregistered_at = '{WHEN}'\n",
     "babysit.toml: runs[0].name: expected a run name matching [a-z0-9_.-]{1,64}, got 'Bad Name'"),
    (f"[[runs]]\nname = '{'x' * 65}'\nspec = 'a.toml'\nregistered_at = '{WHEN}'\n",
     "babysit.toml: runs[0].name: expected a run name matching [a-z0-9_.-]{1,64}, got '" + "x" * 65 + "'"),
    (f"[[runs]]\nname = 'a'\nregistered_at = '{WHEN}'\n",
     "babysit.toml: runs[0].spec: expected a value (this key is required), got <nothing>"),
    (f"[[runs]]\nname = 'a'\nspec = 7\nregistered_at = '{WHEN}'\n",
     "babysit.toml: runs[0].spec: expected a non-empty path to the run's TOML, got 7"),
    ("[[runs]]\nname = 'a'\nspec = 'a.toml'\nregistered_at = 2026-08-17T18:41:02Z\n",
     "babysit.toml: runs[0].registered_at: expected a UTC time string like \"2026-08-17T18:41:02Z\", got "
     "datetime.datetime(2026, 8, 17, 18, 41, 2, tzinfo=datetime.timezone.utc)"),
    ("[[runs]]\nname = 'a'\nspec = 'a.toml'\nregistered_at = '2026-02-30T00:00:00Z'\n",
     "babysit.toml: runs[0].registered_at: expected a UTC time string like \"2026-08-17T18:41:02Z\", got "
     "'2026-02-30T00:00:00Z'"),
    (f"[[runs]]\nname = 'a'\nspec = 'a.toml'\nregistered_at = '{WHEN}'\nprereg_sha256 = 'ABC'\n",
     "babysit.toml: runs[0].prereg_sha256: expected 64 lowercase hex digits (a sha256), got 'ABC'"),
    (f"[[runs]]\nname = 'a'\nspec = 'a.toml'\nregistered_at = '{WHEN}'\n"
     f"[[runs]]\nname = 'b'\nspec = 'b.toml'\nregistered_at = '{WHEN}'\n"
     f"[[runs]]\nname = 'a'\nspec = 'c.toml'\nregistered_at = '{WHEN}'\n",
     "babysit.toml: runs[2].name: expected a name not used by runs[0], got 'a'"),
])
def test_every_rejection_names_the_file_the_key_and_the_expectation(here: Path, text: str, message: str) -> None:
    write(text)
    with pytest.raises(SpecError) as err:
        load(Path("babysit.toml"))
    assert str(err.value).startswith(message)
    if not message.endswith(": "):
        assert str(err.value) == message
    assert err.value.exit_code == EXIT_BAD_INPUT


def test_an_unknown_key_hint_suggests_the_close_one(here: Path) -> None:
    write("[daemon]\nchanel = '#x'\n")
    with pytest.raises(SpecError) as err:
        load(Path("babysit.toml"))
    assert err.value.hint == "did you mean 'channel'?"


@pytest.mark.parametrize(("text", "message"), [
    (f"[[runs]]\nname = 'a'\nspec = 'a.toml'\nregisterd_at = '{WHEN}'\n",
     'babysit.toml: runs[0].registerd_at: unknown key — did you mean "registered_at"?'),
    (f"[[runs]]\nnam = 'a'\nspec = 'a.toml'\nregistered_at = '{WHEN}'\n",
     'babysit.toml: runs[0].nam: unknown key — did you mean "name"?'),
    (f"[[runs]]\nname = 'a'\nspecs = 'a.toml'\nregistered_at = '{WHEN}'\n",
     'babysit.toml: runs[0].specs: unknown key — did you mean "spec"?'),
])
def test_a_misspelt_required_key_is_named_as_the_typo(here: Path, text: str, message: str) -> None:
    write(text)
    with pytest.raises(SpecError) as err:
        load(Path("babysit.toml"))
    assert str(err.value) == message
    assert err.value.exit_code == EXIT_BAD_INPUT and "rename it to" in (err.value.hint or "")


def test_an_unknown_run_lists_the_registered_ones(here: Path) -> None:
    reg = load(write(GOOD))
    with pytest.raises(UnknownRun) as err:
        reg.get("something_else")
    assert err.value.message.endswith("; registered: grasp_sft_v2_demosonly_1gpu_disc, plain.run-2")
    many = Registry(here / "babysit.toml", runs=tuple(entry(f"run_{i:02d}") for i in range(15)))
    with pytest.raises(UnknownRun) as err:
        many.get("zzz")
    assert "run_11 and 3 more (`babysit status` lists all)" in err.value.message


def test_a_directory_in_place_of_the_file_is_refused(here: Path) -> None:
    Path("babysit.toml").mkdir()
    with pytest.raises(SpecError, match=r"^babysit.toml: expected a readable UTF-8 TOML file"):
        load(Path("babysit.toml"))


def test_get_of_an_unknown_run_lists_close_names_and_says_how_to_register(here: Path) -> None:
    reg = load(write(GOOD))
    with pytest.raises(UnknownRun) as err:
        reg.get("grasp_sft_v2_demosonly_1gpu_dsc")
    assert "no run named 'grasp_sft_v2_demosonly_1gpu_dsc'" in err.value.message
    assert "did you mean 'grasp_sft_v2_demosonly_1gpu_disc'?" in err.value.message
    assert "babysit register RUN.toml" in (err.value.hint or "")
    assert err.value.exit_code == EXIT_BAD_INPUT
    with pytest.raises(UnknownRun, match="no runs are registered"):
        load(Path("nothing.toml")).get("x")


def test_resolve_registry_path_prefers_the_argument_then_the_environment() -> None:
    assert resolve_registry_path("a/b.toml", {"BABYSIT_REGISTRY": "env.toml"}) == Path("a/b.toml")
    assert resolve_registry_path(None, {"BABYSIT_REGISTRY": "env.toml"}) == Path("env.toml")
    assert resolve_registry_path(None, {"BABYSIT_REGISTRY": ""}) == Path("babysit.toml")
    assert resolve_registry_path(None, {}) == Path("babysit.toml")


def test_spec_ref_is_relative_under_the_registry_directory_else_absolute(here: Path) -> None:
    reg = load(Path("babysit.toml"))
    assert reg.spec_ref(Path("runs/x.toml")) == "runs/x.toml"
    assert reg.spec_ref(here / "runs" / "x.toml") == "runs/x.toml"
    assert reg.spec_ref(Path("/elsewhere/x.toml")) == "/elsewhere/x.toml"


# --- with_run (pure) ---------------------------------------------------------------------------


def test_with_run_adds_then_is_idempotent_and_keeps_the_original_registered_at(here: Path) -> None:
    reg0 = load(Path("babysit.toml"))
    reg1, what = with_run(reg0, entry())
    assert what == "added" and reg1.runs == (entry(),)
    reg2, what = with_run(reg1, entry(spec="./runs/../runs/a.toml", when=LATER))
    assert what == "unchanged" and reg2 is reg1 and reg2.get("run_a").registered_at == WHEN


def test_with_run_updates_a_moved_spec_and_keeps_the_original_registered_at(here: Path) -> None:
    reg, _ = with_run(load(Path("babysit.toml")), entry())
    reg, _ = with_run(reg, entry(name="run_b"))
    moved, what = with_run(reg, entry(spec="moved/a.toml", when=LATER))
    assert what == "updated"
    assert moved.names == ("run_a", "run_b")  # registration order kept
    assert moved.get("run_a") == entry(spec="moved/a.toml", when=WHEN)


@pytest.mark.parametrize(("old", "new"), [(SHA_A, SHA_B), (None, SHA_A), (SHA_A, None)])
def test_a_different_prereg_under_the_same_name_is_refused(here: Path, old: str | None, new: str | None) -> None:
    reg, _ = with_run(load(Path("babysit.toml")), entry(sha=old))
    with pytest.raises(RegistryError) as err:
        with_run(reg, entry(sha=new, when=LATER))
    assert "run 'run_a' is already registered with" in err.value.message
    assert err.value.message.endswith("a different experiment needs a different name")
    assert "run_a_v2" in (err.value.hint or "")
    assert err.value.exit_code == EXIT_BAD_INPUT


@pytest.mark.parametrize("bad", [
    entry(name="Bad"), entry(spec=""), entry(when="yesterday"), entry(sha="xyz"),
])
def test_with_run_refuses_an_entry_that_could_not_be_read_back(here: Path, bad: RunEntry) -> None:
    with pytest.raises(RegistryError, match="cannot register run"):
        with_run(load(Path("babysit.toml")), bad)


# --- update: the one writer --------------------------------------------------------------------


def add(e: RunEntry):
    return lambda reg: with_run(reg, e)


def test_update_creates_the_file_0644_with_a_0600_lock_and_reports_what_happened(here: Path) -> None:
    path = Path("babysit.toml")
    assert update(path, add(entry())) == "added"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat("babysit.toml.lock").st_mode) == 0o600
    assert load(path).runs == (entry(),)
    text = path.read_text()
    assert text.startswith("# babysit registry") and "[daemon]" in text and "[[runs]]" in text


def test_an_unchanged_registration_does_not_rewrite_the_file(here: Path) -> None:
    path = write(GOOD)
    before = path.read_bytes()
    mtime = os.stat(path).st_mtime_ns
    same = entry("grasp_sft_v2_demosonly_1gpu_disc", "runs/disc.toml", SHA_A, LATER)
    assert update(path, add(same)) == "unchanged"
    assert path.read_bytes() == before and os.stat(path).st_mtime_ns == mtime


def test_a_refused_or_failing_change_leaves_the_file_byte_identical(here: Path) -> None:
    path = write(GOOD)
    before = path.read_bytes()
    with pytest.raises(RegistryError):
        update(path, add(entry("grasp_sft_v2_demosonly_1gpu_disc", "runs/disc.toml", SHA_B)))
    assert path.read_bytes() == before

    def boom(reg: Registry) -> tuple[Registry, None]:
        raise RuntimeError("change failed")

    with pytest.raises(RuntimeError):
        update(path, boom)
    assert path.read_bytes() == before
    assert [p.name for p in here.iterdir() if p.name.endswith(".tmp")] == []


def test_update_preserves_the_mode_and_writes_through_a_symlink(here: Path) -> None:
    real = here / "real.toml"
    real.write_text(GOOD)
    real.chmod(0o600)
    link = here / "babysit.toml"
    link.symlink_to(real)
    assert update(link, add(entry("new_run"))) == "added"
    assert link.is_symlink() and stat.S_IMODE(os.stat(real).st_mode) == 0o600
    assert load(link).names[-1] == "new_run"


def test_update_in_a_missing_directory_is_a_registry_error(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="cannot open the registry lock"):
        update(tmp_path / "no" / "babysit.toml", add(entry()))


def _add_many(path: str, prefix: str, count: int) -> None:
    for i in range(count):
        update(Path(path), add(entry(f"{prefix}_{i}", f"runs/{prefix}_{i}.toml")))


def test_concurrent_writers_in_real_processes_lose_nothing(here: Path) -> None:
    path = str(here / "babysit.toml")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_add_many, args=(path, f"w{w}", 15)) for w in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    names = load(Path(path)).names
    assert sorted(names) == sorted(f"w{w}_{i}" for w in range(6) for i in range(15))
    for w in range(6):  # each writer's own runs stay in its registration order
        mine = [n for n in names if n.startswith(f"w{w}_")]
        assert mine == [f"w{w}_{i}" for i in range(15)]


KILLED_BEFORE_REPLACE = """
import sys, time
from pathlib import Path
from babysit.runtime import registry

def stop(tmp):
    print("READY", tmp, flush=True)
    time.sleep(600)

registry._before_replace = stop
registry.update(Path(sys.argv[1]), lambda reg: registry.with_run(
    reg, registry.RunEntry("late_run", "late.toml", "2026-08-17T18:41:02Z", None)))
"""


def test_a_writer_killed_between_write_and_replace_leaves_the_old_file_and_its_temp_is_cleaned(here: Path) -> None:
    path = write(GOOD)
    before = path.read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BEFORE_REPLACE, str(path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline() if proc.stdout else ""
        assert ready.startswith("READY")
        tmp = Path(ready.split(maxsplit=1)[1].strip())
        assert tmp.parent == here and tmp.name.startswith(".babysit.toml.") and tmp.name.endswith(".tmp")
        assert "late_run" in tmp.read_text()  # the new content was fully written, just not renamed
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert path.read_bytes() == before
    assert tmp.exists()
    assert update(path, add(entry("next_run"))) == "added"  # the lock died with its holder
    assert not tmp.exists()
    assert load(path).names[-1] == "next_run" and "late_run" not in load(path).names


LOOPING_WRITER = """
import sys
from pathlib import Path
from babysit.runtime import registry

path, version = Path(sys.argv[1]), 0
while True:
    version += 1
    runs = tuple(registry.RunEntry(f"run_{i}", f"v{version}/spec_{i}.toml", "2026-08-17T18:41:02Z", "c" * 64)
                 for i in range(2000))
    registry.update(path, lambda reg, runs=runs: (registry.Registry(reg.path, reg.daemon, runs), None))
    if version == 1:
        print("WROTE", flush=True)
"""


def assert_whole(reg: Registry) -> None:
    """One whole version written by LOOPING_WRITER, never a mix or a torn tail."""
    assert len(reg.runs) == 2000
    assert len({r.spec.split("/")[0] for r in reg.runs}) == 1


def test_a_writer_killed_at_random_instants_never_leaves_a_partial_file(here: Path) -> None:
    path = write(GOOD)
    for round_ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", LOOPING_WRITER, str(path)], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().startswith("WROTE")
            deadline = time.monotonic() + 0.05 + 0.07 * round_  # land somewhere inside one of the writes
            while time.monotonic() < deadline:  # meanwhile a reader never sees a torn file (cheap check, often)
                data = path.read_bytes()
                assert data.count(b"[[runs]]\n") == 2000 and data.endswith(b'registered_at = "2026-08-17T18:41:02Z"\n')
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        assert_whole(load(path))  # parseable and validated, whatever instant the kill hit
    update(path, add(entry("after")))
    assert [p for p in here.iterdir() if p.name.endswith(".tmp")] == []
    assert load(path).names[-1] == "after"


def test_store_url_and_host_name_are_read_validated_and_kept_by_a_registration(tmp_path: Path) -> None:
    path = tmp_path / "babysit.toml"
    path.write_text('[store]\nurl = "postgresql://babysit@db.lab/babysit"\ndeadline_seconds = 30\n'
                    'read_deadline_seconds = 1.5\n[host]\nname = "box-a"\n')
    reg = registry.load(path)
    assert (reg.store.url, reg.host.name) == ("postgresql://babysit@db.lab/babysit", "box-a")
    assert (reg.store.deadline_seconds, reg.store.read_deadline_seconds) == (30.0, 1.5)
    entry = registry.RunEntry(name="r", spec="r.toml", registered_at="2026-08-17T18:41:02Z")
    registry.update(path, lambda r: registry.with_run(r, entry))  # the file is rewritten: both stay
    again = registry.load(path)
    assert (again.store, again.host, again.names) == (reg.store, reg.host, ("r",))
    assert registry.StoreSettings().deadline_seconds == 15.0 and registry.StoreSettings().read_deadline_seconds == 3.0
    for text, key in (('[store]\nurl = "mysql://x"\n', "store.url"), ('[host]\nname = "a b"\n', "host.name"),
                      ("[store]\ndeadline_seconds = 0\n", "store.deadline_seconds"),
                      ('[store]\nread_deadline_seconds = "3"\n', "store.read_deadline_seconds")):
        path.write_text(text)
        with pytest.raises(SpecError) as info:
            registry.load(path)
        assert key in str(info.value)
