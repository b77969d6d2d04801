"""`babysit.log`: whole lines under concurrency, full precision, NaN kept, never a raise into training."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import babysit
from babysit.core.classify import ExitFacts, classify_exit
from babysit.core.reading.log_records import metric_series
from babysit.integrations import client
from babysit.integrations.client import JsonlWriter
from babysit.sources.logtail import read_all

REPO = Path(__file__).resolve().parents[2]


def lines(path: Path) -> list[dict]:
    return [json.loads(raw) for raw in path.read_text().splitlines()]


def test_babysit_log_appends_one_record_to_the_file_babysit_log_names(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "outputs" / "run" / "train_log.jsonl"  # the folder does not exist yet
    monkeypatch.setenv("BABYSIT_LOG", str(log))
    assert babysit.log(3, loss=2.5, eval_acc=0.75) is True
    assert babysit.log(4, loss=2.25) is True
    got = lines(log)
    assert [r["step"] for r in got] == [3, 4]
    assert got[0]["loss"] == 2.5 and got[0]["eval_acc"] == 0.75 and got[1]["loss"] == 2.25
    assert all(isinstance(r["ts"], float) and abs(r["ts"] - got[0]["ts"]) < 60 for r in got)
    assert list(got[0]) == ["step", "ts", "loss", "eval_acc"]


def test_floats_keep_full_precision(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    values = {"third": 1 / 3, "sum": 0.1 + 0.2, "tiny": 5e-324, "subnormal": 1e-320, "big": 1.7976931348623157e308,
              "neg": -123456.78901234567, "int": 2**62}
    assert JsonlWriter(log).log(1, **values)
    (record,), garbage = read_all(log)
    assert garbage == 0
    for key, value in values.items():
        assert record.metrics[key] == value, key  # bit-exact: repr round-trips


def test_nonfinite_values_are_json_nan_infinity_and_babysit_reads_them_as_divergence(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    w = JsonlWriter(log)
    w.log(10, loss=1.5)
    w.log(20, loss=float("nan"), grad_norm=float("inf"), eval_loss=float("-inf"))
    raw = log.read_text().splitlines()[1]
    assert '"loss": NaN' in raw and '"grad_norm": Infinity' in raw and '"eval_loss": -Infinity' in raw
    records, garbage = read_all(log)
    assert garbage == 0 and len(records) == 2
    assert set(records[1].nonfinite) == {"loss", "grad_norm", "eval_loss"}
    assert math.isnan(records[1].fields["loss"]) and records[1].fields["eval_loss"] == -math.inf
    assert metric_series(records, "loss") == ((10, 1.5),)  # a NaN is never a finite reading
    # a trainer that logged NaN and then crashed (exit 1) is classified diverged from these records
    got = classify_exit(ExitFacts(exit_code=1, signal=None, stderr_tail="", last_records=records, rules=(),
                        stop_requested=False))
    assert got.outcome == "diverged" and got.detail["diverged_step"] == 20


def test_numpy_and_torch_scalars_are_written_as_plain_numbers(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy", reason="numpy is not installed")
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[trainer]')")
    log = tmp_path / "log.jsonl"
    x = torch.tensor(0.1, dtype=torch.float32)
    assert JsonlWriter(log).log(
        np.int64(7),
        f32=np.float32(0.1), f64=np.float64(1 / 3), i64=np.int64(-5), flag=np.bool_(True), arr0=np.array(2.5),
        t_float=x, t_int=torch.tensor(3), t_grad=(torch.ones(1, requires_grad=True) * 2).sum(),
        t_nan=torch.tensor(float("nan")), t_half=torch.tensor(1.5, dtype=torch.float16),
        vector=torch.arange(3))
    record = lines(log)[0]
    assert record["step"] == 7
    assert record["f32"] == float(np.float32(0.1)) == x.item()  # the float32's exact value, not "0.1"
    assert record["f64"] == 1 / 3 and record["i64"] == -5 and record["flag"] is True and record["arr0"] == 2.5
    assert record["t_float"] == x.item() and record["t_int"] == 3 and record["t_grad"] == 2.0
    assert math.isnan(record["t_nan"]) and record["t_half"] == 1.5
    assert isinstance(record["vector"], str)  # not a scalar: kept as text, never a raise


def test_threads_writing_at_once_never_interleave_or_tear_lines(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    w = JsonlWriter(log)
    pad = "x" * 6000  # longer than PIPE_BUF and a page: atomicity must not depend on a small size

    def writer(k: int) -> None:
        for i in range(300):
            assert w.log(i, writer=k, pad=pad)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = lines(log)  # json.loads raises on a torn or interleaved line
    assert len(got) == 1800
    assert sorted((r["writer"], r["step"]) for r in got) == [(k, i) for k in range(6) for i in range(300)]
    assert all(r["pad"] == pad for r in got)


_PROC_SCRIPT = """
import sys, babysit
pad = "y" * 6000
for i in range(200):
    assert babysit.log(i, proc=int(sys.argv[1]), pad=pad)
"""


def test_processes_writing_at_once_never_interleave_or_tear_lines(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "BABYSIT_LOG": str(log), "PYTHONPATH": str(REPO)}
    env.pop("RANK", None)
    procs = [subprocess.Popen([sys.executable, "-c", _PROC_SCRIPT, str(k)], env=env) for k in range(4)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    got = lines(log)
    assert len(got) == 800
    assert sorted((r["proc"], r["step"]) for r in got) == [(k, i) for k in range(4) for i in range(200)]


_FORK_WRITER: JsonlWriter | None = None


def _forked_child() -> None:
    assert _FORK_WRITER is not None
    for i in range(50):
        _FORK_WRITER.log(i, side="child")


def test_a_forked_child_and_its_parent_both_keep_writing(tmp_path: Path) -> None:
    global _FORK_WRITER
    log = tmp_path / "log.jsonl"
    _FORK_WRITER = w = JsonlWriter(log)
    w.log(0, side="parent")  # the parent writes before and after the fork (a DataLoader worker's case)
    child = multiprocessing.get_context("fork").Process(target=_forked_child)
    child.start()
    for i in range(1, 51):
        w.log(i, side="parent")
    child.join(timeout=30)
    assert child.exitcode == 0
    got = lines(log)
    assert sum(r["side"] == "child" for r in got) == 50 and sum(r["side"] == "parent" for r in got) == 51


def test_an_unwritable_log_never_raises_and_warns_once(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    w = JsonlWriter(blocker / "train_log.jsonl")  # its "folder" is a file: no one can create it, root neither
    assert [w.log(i, loss=1.0) for i in range(5)] == [False] * 5
    err = capfd.readouterr().err
    assert err.count("babysit.log: cannot open") == 1 and "training goes on" in err


def test_a_full_disk_never_raises_and_warns_once(capfd: pytest.CaptureFixture[str]) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    w = JsonlWriter("/dev/full")  # every write fails with ENOSPC
    assert [w.log(i, loss=1.0) for i in range(5)] == [False] * 5
    err = capfd.readouterr().err
    assert err.count("babysit.log: cannot write /dev/full") == 1 and "No space left" in err


def test_without_babysit_log_it_is_a_noop_that_warns_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("BABYSIT_LOG", raising=False)
    monkeypatch.chdir(tmp_path)
    w = JsonlWriter()
    assert [w.log(i, loss=1.0) for i in range(3)] == [False] * 3
    assert list(tmp_path.iterdir()) == []
    err = capfd.readouterr().err
    assert err.count("BABYSIT_LOG is not set") == 1
    monkeypatch.setenv("BABYSIT_LOG", str(tmp_path / "late.jsonl"))  # set later: followed from then on
    assert w.log(3, loss=1.0) and lines(tmp_path / "late.jsonl")[0]["step"] == 3


def test_bad_input_never_raises(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log.jsonl"
    w = JsonlWriter(log)
    assert w.log("ten", loss=1.0) is False
    assert w.log(float("nan"), loss=1.0) is False
    assert w.log(2.5, loss=1.0) is False
    assert w.write(4, {"step": 99, "ts": 0, "eval/loss": 0.5, 7: "x"}) is True  # odd keys: named or ignored
    assert w.log(5.0, obj=object(), path=tmp_path, nested={"a": [1, float("inf")]}) is True
    got = lines(log)
    assert got[0]["step"] == 4 and got[0]["ts"] != 0 and got[0]["eval/loss"] == 0.5 and got[0]["7"] == "x"
    assert got[1]["step"] == 5 and got[1]["path"] == str(tmp_path) and got[1]["nested"]["a"][1] == math.inf
    err = capfd.readouterr().err
    assert "step must be an integer" in err and "a metric named 'step' is ignored" in err


def test_only_rank_zero_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("RANK", "3")
    assert JsonlWriter(log).log(1, loss=1.0) is False
    assert JsonlWriter(log, all_ranks=True).log(2, loss=1.0) is True
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("SLURM_PROCID", "5")  # torchrun's RANK wins over the Slurm task id
    assert JsonlWriter(log).log(3, loss=1.0) is True
    assert [r["step"] for r in lines(log)] == [2, 3]


def test_importing_babysit_and_its_integrations_package_imports_no_ml_framework() -> None:
    code = ("import sys, babysit, babysit.integrations, babysit.integrations.client; babysit.log(1, x=1.0); "
            "print(sorted(m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning', 'numpy', "
            "'accelerate') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("BABYSIT_LOG", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert babysit.log is client.log


def test_records_are_byte_for_byte_what_json_writes(tmp_path: Path) -> None:
    """Every record, whatever its values (NaN, a bool, None, a huge int) and keys (unicode, quotes, `%`), is
    the line json writes for it."""
    import random

    random.seed(1)
    log = tmp_path / "log.jsonl"
    w = JsonlWriter(log)
    values = [0.1, 1e-320, 1.7e308, math.nan, math.inf, -math.inf, -0.0, 3, -7, 2**70, 1 / 3, True, None]
    keys = ["loss", "eval/loss", "ü", 'a"b', "100%", "%r", "%%s", "tab\tkey"]
    sent = []
    for i in range(3000):
        record = {random.choice(keys): random.choice(values) for _ in range(random.randint(1, 3))}
        assert w.write(i, record)
        sent.append(record)
    raw = log.read_bytes().splitlines(keepends=True)
    assert len(raw) == len(sent)
    for i, (line, record) in enumerate(zip(raw, sent, strict=True)):
        ts = json.loads(line)["ts"]
        assert line == (json.dumps({"step": i, "ts": ts, **record}, allow_nan=True) + "\n").encode(), line


def test_an_environment_change_is_followed_at_the_next_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$BABYSIT_LOG and the rank are read at each record: each way os.environ changes is followed."""
    import unittest.mock

    first, second, third = (tmp_path / f"{n}.jsonl" for n in ("first", "second", "third"))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    monkeypatch.setenv("BABYSIT_LOG", str(first))
    assert babysit.log(1, loss=1.0)
    os.environ["BABYSIT_LOG"] = str(second)  # a plain assignment (monkeypatch restores it after)
    assert babysit.log(2, loss=1.0)
    with unittest.mock.patch.dict(os.environ, {"BABYSIT_LOG": str(third)}):
        assert babysit.log(3, loss=1.0)
    assert babysit.log(4, loss=1.0)  # patch.dict put `second` back
    os.environ.update(RANK="1")
    assert babysit.log(5, loss=1.0) is False
    del os.environ["RANK"]
    monkeypatch.setenv("SLURM_PROCID", "2")
    assert babysit.log(6, loss=1.0) is False
    os.environ.pop("SLURM_PROCID")
    assert babysit.log(7, loss=1.0)
    # os.environ itself replaced, by a plain dict its writes do not reach os.putenv: read at every record
    fake = {"BABYSIT_LOG": str(first)}
    with unittest.mock.patch("os.environ", fake):
        assert babysit.log(8, loss=1.0)
        fake["BABYSIT_LOG"] = str(third)
        assert babysit.log(9, loss=1.0)
    assert babysit.log(10, loss=1.0)
    assert [r["step"] for r in lines(first)] == [1, 8]
    assert [r["step"] for r in lines(second)] == [2, 4, 7, 10]
    assert [r["step"] for r in lines(third)] == [3, 9]


def _child_logs(step: int) -> None:
    babysit.log(step, side="child")


def test_a_worker_forked_after_a_change_writes_where_the_change_says(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent read $BABYSIT_LOG, then changed it and forked before its next record (a DataLoader's
    workers started after a launcher's change): the child's records go where the variable says now."""
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("BABYSIT_LOG", str(old))
    assert babysit.log(0, side="parent")
    monkeypatch.setenv("BABYSIT_LOG", str(new))
    child = multiprocessing.get_context("fork").Process(target=_child_logs, args=(1,))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert babysit.log(2, side="parent")
    assert [r["step"] for r in lines(old)] == [0]
    assert [(r["step"], r["side"]) for r in lines(new)] == [(1, "child"), (2, "parent")]


def test_a_log_moved_away_is_created_again(tmp_path: Path) -> None:
    log = tmp_path / "run" / "train_log.jsonl"
    w = JsonlWriter(log)
    assert w.log(1, loss=1.0) and w.log(2, loss=1.0)
    log.rename(tmp_path / "moved.jsonl")
    assert w.log(3, loss=1.0)
    (tmp_path / "run").rename(tmp_path / "run-old")  # its folder too
    assert w.log(4, loss=1.0)
    assert [r["step"] for r in lines(tmp_path / "moved.jsonl")] == [1, 2]
    assert [r["step"] for r in lines(tmp_path / "run-old" / "train_log.jsonl")] == [3]
    assert [r["step"] for r in lines(log)] == [4]


_AUDIT_WATCH = """
import os, sys
added = []
sys.addaudithook(lambda event, args: added.append(event) if event == "sys.addaudithook" else None)
import babysit
assert babysit.log(1, loss=1.0)
os.environ["BABYSIT_LOG"] = sys.argv[1]
assert babysit.log(2, loss=1.0)
print(len(added))
"""


def test_the_client_adds_no_audit_hook_to_the_trainers_process(tmp_path: Path) -> None:
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    env = {**os.environ, "BABYSIT_LOG": str(first), "PYTHONPATH": str(REPO)}
    env.pop("RANK", None)
    env.pop("SLURM_PROCID", None)
    out = subprocess.run([sys.executable, "-c", _AUDIT_WATCH, str(second)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0"]
    assert [r["step"] for r in lines(first)] == [1] and [r["step"] for r in lines(second)] == [2]


# -- the one descriptor kept open: what opening the file at each record gave, kept ----------------------------

def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _fd_on(path: Path) -> int:
    """The descriptor this process holds open on `path` (one, or the test fails)."""
    (fd,) = [int(fd) for fd in _fds() if os.path.realpath(f"/proc/self/fd/{fd}") == str(path.resolve())]
    return fd


def test_a_log_replaced_by_another_file_is_followed_and_a_deleted_one_created_again(tmp_path: Path) -> None:
    log = tmp_path / "train_log.jsonl"
    w = JsonlWriter(log)
    assert w.log(1, loss=1.0) and w.log(2, loss=1.0)
    log.rename(tmp_path / "old.jsonl")
    log.write_text('{"step": 0, "ts": 1.0, "note": "another writer made this file"}\n')  # a new inode at the path
    assert w.log(3, loss=1.0)
    assert [r["step"] for r in lines(tmp_path / "old.jsonl")] == [1, 2]
    assert [r["step"] for r in lines(log)] == [0, 3]
    log.unlink()
    assert w.log(4, loss=1.0)
    assert [r["step"] for r in lines(log)] == [4]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_one_descriptor_is_kept_open_close_on_exec_and_append_only(tmp_path: Path) -> None:
    import fcntl

    log = tmp_path / "log.jsonl"
    w = JsonlWriter(log)
    assert w.log(0, loss=1.0)
    before = _fds()
    for i in range(1, 200):
        assert w.log(i, loss=1.0 / i)
    assert _fds() == before  # no descriptor opened (or left) per record
    fd = _fd_on(log)
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC  # a program the trainer spawns does not hold it
    assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND
    log.rename(tmp_path / "moved.jsonl")
    assert w.log(200, loss=1.0)
    assert fcntl.fcntl(_fd_on(log), fcntl.F_GETFD) & fcntl.FD_CLOEXEC  # the path's new file, opened the same way
    assert len(lines(log)) == 1 and len(lines(tmp_path / "moved.jsonl")) == 200
    many = _fds()
    for k in range(3 * 16):  # a process writing ever new logs holds one of them open, not one each
        assert JsonlWriter(tmp_path / f"run{k}.jsonl").log(1, loss=1.0)
    assert len(_fds() - many) <= 1
    assert all(len(lines(tmp_path / f"run{k}.jsonl")) == 1 for k in range(3 * 16))


def test_writers_taking_turns_on_two_logs_each_write_to_their_own(tmp_path: Path) -> None:
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    a, b = JsonlWriter(first), JsonlWriter(second)
    for i in range(20):
        assert a.log(i, side="a") and b.log(i, side="b")
    assert [r["side"] for r in lines(first)] == ["a"] * 20 and [r["side"] for r in lines(second)] == ["b"] * 20


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_descriptor_closed_under_the_writer_is_opened_again(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    w = JsonlWriter(log)
    assert w.log(1, loss=1.0)
    os.close(_fd_on(log))  # a library closing every descriptor it did not open
    assert w.log(2, loss=1.0)
    assert w.log(3, loss=1.0)
    os.close(_fd_on(log))
    assert w.append(w.encode(4, {"loss": 1.0}) + w.encode(5, {"loss": 1.0}))  # a hook's batch (DeferredWriter)
    assert [r["step"] for r in lines(log)] == [1, 2, 3, 4, 5]


def test_threads_writing_while_the_log_is_replaced_lose_and_tear_nothing(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    w = JsonlWriter(log)
    done = threading.Event()
    moved: list[Path] = []

    def rotate() -> None:
        k = 0
        while not done.is_set():
            if log.exists():
                k += 1
                target = tmp_path / f"rotated-{k}.jsonl"
                log.rename(target)
                moved.append(target)
            done.wait(0.002)

    def writer(t: int) -> None:
        for i in range(400):
            assert w.log(i, writer=t, loss=1.0 / (i + 1))
            if i % 40 == 0:
                time.sleep(0.005)  # the rotator's turn, however fast the box

    rotator = threading.Thread(target=rotate)
    rotator.start()
    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    rotator.join()
    got = [r for path in [*moved, log] if path.exists() for r in lines(path)]  # json.loads: no torn line
    assert sorted((r["writer"], r["step"]) for r in got) == [(t, i) for t in range(4) for i in range(400)]
    assert len(moved) >= 3  # the files did change under the writers


_FORK_AFTER_MOVE = """
import os, sys
from babysit.integrations.client import JsonlWriter
log = sys.argv[1]
w = JsonlWriter(log)
assert w.log(1, side="parent")
os.rename(log, log + ".old")
pid = os.fork()
if pid == 0:
    ok = w.log(2, side="child")  # the child's own descriptor, on the path's new file
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
assert w.log(3, side="parent")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_opens_its_own_descriptor_on_the_paths_file(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _FORK_AFTER_MOVE, str(log)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [(r["step"], r["side"]) for r in lines(tmp_path / "log.jsonl.old")] == [(1, "parent")]
    assert [(r["step"], r["side"]) for r in lines(log)] == [(2, "child"), (3, "parent")]


def test_encode_many_is_byte_for_byte_what_encode_and_json_write(tmp_path: Path,
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    """A hook's batch (`encode_many`) against `encode`, record by record, and json: ints, bools, huge and tiny floats, -0.0, NaN/Infinity as json writes them, unicode and `%` keys,
    nested values, None, a string, a float subclass; a record with a bad step is dropped, the rest kept."""
    import random

    random.seed(2)

    class Sub(float):
        pass

    values = [0.1, 1e-320, 5e-324, 1.7976931348623157e308, -0.0, 0.0, math.nan, math.inf, -math.inf, 3, -7, 0,
              2**70, -2**63, 1 / 3, True, False, None, "text", [1, 2.5], {"a": [float("inf")]}, Sub(0.25)]
    keys = ["loss", "eval/loss", "ü", "日本", 'a"b', "100%", "%r", "tab\tkey", "total_steps"]
    w = JsonlWriter(tmp_path / "log.jsonl")
    batch = []
    for _n in range(3000):
        fields = {random.choice(keys): random.choice(values) for _ in range(random.randint(1, 4))}
        batch.append((random.randint(-2**63, 2**63 - 1), random.random() * 2e9, fields))
    batch.insert(7, ("ten", 1.0, {"loss": 1.0}))  # not a step: dropped, said once
    got = w.encode_many(batch)
    kept = [b for b in batch if b[0] != "ten"]
    assert got == b"".join(w.encode(step, fields, ts) for step, ts, fields in kept)
    expected = b"".join((json.dumps({"step": step, "ts": ts, **fields}, allow_nan=True, default=str) + "\n").encode()
                        for step, ts, fields in kept)
    assert got == expected
    assert "step must be an integer" in capfd.readouterr().err
