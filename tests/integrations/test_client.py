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
from babysit.core.classify import classify_exit
from babysit.core.records import metric_series
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
    got = classify_exit(exit_code=1, signal=None, stderr_tail="", last_records=records, rules=(),
                        stop_requested=False)
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


def test_the_fast_line_is_byte_for_byte_what_json_writes() -> None:
    """Plain ints and floats skip json's encoder (bench/logger_cost.py); the bytes must not change."""
    import random

    random.seed(0)
    values = [0.1, 1e-320, 1.7e308, math.nan, math.inf, -math.inf, -0.0, 3, -7, 2**70, 1 / 3, 5e-324]
    keys = ["loss", "eval/loss", "ü", 'a"b', "lr", "tab\tkey"]
    for _ in range(5000):
        record = {random.choice(keys): random.choice(values) for _ in range(3)}
        step, ts = random.randint(-2**63, 2**63 - 1), random.random() * 2e9
        expected = (json.dumps({"step": step, "ts": ts, **record}, allow_nan=True, default=str) + "\n").encode()
        assert client._line(step, ts, record) == expected
    assert client._line(1, 1.0, {"note": "text"}) is None  # anything else: json's encoder, as before
    assert client._line(1, 1.0, {"flag": True}) is None


def test_records_of_keys_seen_before_are_byte_for_byte_what_json_writes(tmp_path: Path) -> None:
    """The second record of a key set takes the one-pass template (`client.write`); its bytes, and those of
    records that leave it (NaN, a bool, a numpy-like value, a key with `%`), must equal json's."""
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
    """$BABYSIT_LOG and the rank are read once, again after os.environ changed: each way it changes."""
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


_REFUSING_HOOK = """
import os, sys
def refuse(event, args):
    if event == "sys.addaudithook":
        raise RuntimeError("no more hooks")
sys.addaudithook(refuse)
import babysit
from babysit.integrations import client
assert babysit.log(1, loss=1.0)
os.environ["BABYSIT_LOG"] = sys.argv[1]
assert babysit.log(2, loss=1.0)
print(client._env.hooked, client._env.read_at)
"""


def test_without_its_audit_hook_the_client_reads_the_environment_at_every_record(tmp_path: Path) -> None:
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    env = {**os.environ, "BABYSIT_LOG": str(first), "PYTHONPATH": str(REPO)}
    env.pop("RANK", None)
    env.pop("SLURM_PROCID", None)
    out = subprocess.run([sys.executable, "-c", _REFUSING_HOOK, str(second)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "-1"]  # no hook: nothing cached
    assert [r["step"] for r in lines(first)] == [1] and [r["step"] for r in lines(second)] == [2]


# -- the descriptor kept open a path (client._Sinks): what opening the file at each record gave, kept --------

def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


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
def test_one_descriptor_is_kept_a_path_close_on_exec_and_bounded(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    monkeypatch.setattr(client, "_SINKS", {})  # this process's earlier tests hold their paths' slots
    log = tmp_path / "log.jsonl"
    w = JsonlWriter(log)
    assert w.log(0, loss=1.0)
    before = _fds()
    for i in range(1, 200):
        assert w.log(i, loss=1.0 / i)
    assert _fds() == before  # no descriptor opened (or left) per record
    fd, _dev, _ino = client._SINKS[str(log)]
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC  # a program the trainer spawns does not hold it
    assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND
    log.rename(tmp_path / "moved.jsonl")
    assert w.log(200, loss=1.0)
    assert client._SINKS[str(log)][0] == fd  # the path's new file under the same number (dup2)
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    assert len(lines(log)) == 1 and len(lines(tmp_path / "moved.jsonl")) == 200
    many = _fds()
    for k in range(3 * client._MAX_SINKS):  # a process writing ever new logs holds at most _MAX_SINKS open
        assert JsonlWriter(tmp_path / f"run{k}.jsonl").log(1, loss=1.0)
    assert len(_fds() - many) <= client._MAX_SINKS
    assert all(len(lines(tmp_path / f"run{k}.jsonl")) == 1 for k in range(3 * client._MAX_SINKS))


def test_a_descriptor_closed_under_the_writer_is_opened_again(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "_SINKS", {})
    log = tmp_path / "log.jsonl"
    w = JsonlWriter(log)
    assert w.log(1, loss=1.0)
    os.close(client._SINKS[str(log)][0])  # a library closing every descriptor it did not open
    assert w.log(2, loss=1.0)
    assert w.log(3, loss=1.0)
    os.close(client._SINKS[str(log)][0])
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
    """A hook's batch (`encode_many`: the common record in one pass) against `encode`, record by record, and
    json: ints, bools, huge and tiny floats, -0.0, NaN/Infinity as json writes them, unicode and `%` keys,
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


def test_encode_many_runs_of_one_key_set_are_what_encode_writes_whatever_a_value_is(tmp_path: Path) -> None:
    """A batch of step records with the same keys is formatted in one `%` a run (`_encode_run`); a value its
    check must refuse anywhere in a run — NaN, an infinity, a bool, a float subclass, an int too large for a
    float, two floats whose sum overflows, None — sends that run record by record, the same bytes."""

    class Sub(float):
        pass

    w = JsonlWriter(tmp_path / "log.jsonl")
    keys = ("loss", "grad_norm", "learning_rate", "epoch", "total_steps")
    w.write(0, dict.fromkeys(keys, 1.0))  # the key set's template made, as the first record makes it

    def run(odd: object | None = None, at: int = 37, n: int = 100) -> list[tuple[int, float, dict[str, object]]]:
        out = []
        for i in range(n):
            fields: dict[str, object] = {"loss": round(3.9 / (1 + i / 400), 4), "grad_norm": 0.8731 + i * 1.37e-7,
                                         "learning_rate": 1e-3 * (1 - i / 1600), "epoch": i / 48, "total_steps": 400}
            if i == at and odd is not None:
                fields["grad_norm"] = odd
            out.append((i, 1.7e9 + i * 0.01, fields))
        return out

    odd_values = [None, math.nan, math.inf, -math.inf, True, Sub(0.5), 2**1100, 1.7976931348623157e308, -0.0, 2**70]
    for odd in odd_values:
        batch = run(odd)
        if odd == 1.7976931348623157e308:
            batch[38][2]["grad_norm"] = odd  # two of them: their sum overflows, each is finite
        got = w.encode_many(batch)
        assert got == b"".join(w.encode(step, fields, ts) for step, ts, fields in batch), odd
        assert [json.loads(line)["step"] for line in got.splitlines()] == list(range(100))
    # runs of two key sets interleaved, a new key set, a bad step between them: each run as encode writes it
    mixed = [*run()[:10], (10, 2.0, {"eval_loss": 3.0}), *run()[10:20], ("x", 3.0, {"loss": 1.0}), *run()[20:]]
    kept = [r for r in mixed if r[0] != "x"]
    assert w.encode_many(mixed) == b"".join(w.encode(step, fields, ts) for step, ts, fields in kept)


def test_checked_lines_are_what_encode_writes_in_runs_and_between_records(tmp_path: Path) -> None:
    """A hook's checked line (`line_template`'s template and the values it checked plain: `DeferredWriter.
    put_line`) is formatted as it is, a run of them in one `%`; mixed with (step, ts, fields) records of the same
    or other keys, in any order, the batch is what `encode` writes record by record."""
    import random

    random.seed(5)
    w = JsonlWriter(tmp_path / "log.jsonl")
    key_sets = [("loss", "grad_norm", "learning_rate", "epoch", "total_steps"), ("loss", "total_steps"),
                ("eval/loss", "100%", "ü", "total_steps")]
    templates = {keys: client.line_template(keys) for keys in key_sets}
    assert all(t is not None for t in templates.values())
    plain_values = [0.1, 1 / 3, -0.0, 0.0, 5e-324, 1.7976931348623157e308, 3, -7, 0, 2**70, -2**63, 2**1100]
    batch: list[tuple] = []
    expected = []
    for i in range(3000):
        keys = random.choice(key_sets)
        fields = {key: random.choice(plain_values) for key in keys}
        ts = 1.7e9 + i * 0.013
        if random.random() < 0.7:
            batch.append((templates[keys], (i, ts, *fields.values())))  # checked: plain ints and finite floats
        else:
            if random.random() < 0.1:
                fields[keys[0]] = random.choice([math.nan, True, None, "text"])  # the careful way
            batch.append((i, ts, fields))
        expected.append(w.encode(i, fields, ts))
    assert w.encode_many(batch) == b"".join(expected)
    assert w.encode_many(batch[:1]) == expected[0] and w.encode_many([]) == b""


def test_line_template_is_none_for_keys_encode_writes_otherwise() -> None:
    """No template for a key `encode` renames or drops (`step`, `ts`, a key that is not a string): those records
    take the careful way."""
    assert client.line_template(("loss", "step")) is None and client.line_template(("ts",)) is None
    assert client.line_template(("loss", 3)) is None
    template = client.line_template(("loss", "total_steps"))
    assert template is not None and template is client.line_template(("loss", "total_steps"))  # made once
    assert template % (7, 1.5, 0.25, 10) == JsonlWriter(None).encode(7, {"loss": 0.25, "total_steps": 10}, 1.5)
