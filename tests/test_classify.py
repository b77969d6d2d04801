"""Exit classification as tables: built-in texts and codes, parsed OOM sizes, rule precedence."""

from __future__ import annotations

import math
import signal

import pytest

from babysit.core.classify import ExitFacts, classify_exit, parse_size
from babysit.core.reading.log_records import LogRecord
from babysit.core.spec.run_toml import ClassifyRule

GIB = 2**30

TORCH_OOM = (
    "Traceback (most recent call last):\n"
    '  File "trainer/train.py", line 210, in step\n'
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.62 GiB. GPU 0 has a total capacity of "
    "178.35 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 176.87 GiB memory in "
    "use. Of the allocated memory 170.10 GiB is allocated by PyTorch, and 5.20 GiB is reserved by PyTorch but "
    "unallocated."
)
OLD_TORCH_OOM = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
                 "14.50 GiB already allocated; 3.19 MiB free; 14.60 GiB reserved in total by PyTorch)")
CPU_OOM = ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
           "you tried to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)")
NCCL = ("[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600351 milliseconds before timing out.")


def rec(step: int, event: str | None = None, **values) -> LogRecord:
    metrics = {k: float(v) for k, v in values.items() if math.isfinite(v)}
    fields = {k: float(v) for k, v in values.items() if not math.isfinite(v)}
    return LogRecord(step, 1.0, metrics, event, fields)


def run(exit_code=1, sig=None, stderr="", records=(), rules=(), stop=False, **kw):
    return classify_exit(ExitFacts(exit_code=exit_code, signal=sig, stderr_tail=stderr, last_records=list(records),
                         rules=list(rules), stop_requested=stop, **kw))


@pytest.mark.parametrize(("kwargs", "outcome"), [
    pytest.param(dict(exit_code=0), "completed", id="exit-0"),
    pytest.param(dict(exit_code=0, stderr="Xid 79 warning"), "completed", id="exit-0-despite-scary-stderr"),
    pytest.param(dict(exit_code=10, stop=True), "stopped", id="trainer-stopped-on-request"),
    pytest.param(dict(exit_code=None, sig=signal.SIGTERM, stop=True), "stopped", id="sigterm-on-request"),
    pytest.param(dict(exit_code=None, sig=signal.SIGKILL, stop=True), "stopped", id="sigkill-after-grace"),
    pytest.param(dict(exit_code=-15, stop=True), "stopped", id="negative-returncode-is-a-signal"),
    pytest.param(dict(exit_code=12, stop=True, stderr=TORCH_OOM), "oom", id="an-oom-while-stopping-is-an-oom"),
    pytest.param(dict(exit_code=10, stop=True, stop_reason="stalled"), "stalled", id="stall-stop-keeps-class"),
    pytest.param(dict(exit_code=None, sig=9, stop=True, stop_reason="gpu-fault"), "gpu-fault", id="fault-stop"),
    pytest.param(dict(exit_code=10), "stopped", id="exit-10-unrequested-still-stopped"),
    pytest.param(dict(exit_code=12), "oom", id="trainer-oom-code"),
    pytest.param(dict(exit_code=11), "diverged", id="trainer-diverged-code"),
    pytest.param(dict(stderr=TORCH_OOM), "oom", id="torch-oom-text"),
    pytest.param(dict(stderr=OLD_TORCH_OOM), "oom", id="old-torch-oom-text"),
    pytest.param(dict(stderr="RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"),
                 "oom", id="cublas-alloc"),
    pytest.param(dict(stderr=CPU_OOM), "oom", id="cpu-allocator"),
    pytest.param(dict(stderr="Traceback\nMemoryError"), "oom", id="python-memoryerror"),
    pytest.param(dict(stderr=TORCH_OOM + "\n" + NCCL), "oom", id="oom-is-the-root-cause-of-nccl-timeouts"),
    pytest.param(dict(records=[rec(5, "diverged", train_loss=math.nan)]), "diverged", id="diverged-event"),
    pytest.param(dict(records=[rec(5, train_loss=math.inf)]), "diverged", id="nonfinite-loss-record"),
    pytest.param(dict(records=[rec(5, grad_norm=math.inf)]), "crashed", id="one-inf-grad-norm-may-be-a-skipped-step"),
    pytest.param(dict(records=[rec(5, grad_norm=math.inf), rec(6, loss=2.0), rec(7, grad_norm=math.nan)]), "diverged",
                 id="a-grad-norm-non-finite-twice-in-a-row-is-divergence"),
    pytest.param(dict(records=[rec(5, grad_norm=math.inf)], nonfinite_metrics=("grad_norm",)), "diverged",
                 id="a-declared-grad-norm-counts-at-once"),
    pytest.param(dict(records=[rec(5, grad_norm=math.inf)], nonfinite_metrics=("train_loss",)), "crashed",
                 id="inf-grad-norm-undeclared-is-not-divergence"),
    pytest.param(dict(stderr="ValueError: loss is nan at step 300"), "diverged", id="loss-is-nan-text"),
    pytest.param(dict(stderr="RuntimeError: non-finite loss"), "diverged", id="non-finite-loss-text"),
    pytest.param(dict(stderr=NCCL), "crashed", id="nccl-timeout"),
    pytest.param(dict(stderr="NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus"), "gpu-fault", id="xid"),
    pytest.param(dict(stderr="RuntimeError: CUDA error: uncorrectable ECC error encountered"), "gpu-fault",
                 id="ecc"),
    pytest.param(dict(stderr="RuntimeError: CUDA error: an illegal memory access was encountered"), "crashed",
                 id="illegal-access-is-a-bug"),
    pytest.param(dict(stderr="NVRM: Xid (PCI:0000:18:00): 13, Graphics SM Warp Exception"), "crashed",
                 id="trainers-xid-in-stderr"),
    pytest.param(dict(gpu_evidence=[{"gpu": 0, "kind": "xid", "code": 31, "xid": 31, "side": "application",
                                     "name": "Xid 31 (GPU memory page fault)"}]), "crashed",
                 id="trainers-xid-seen-by-nvml"),
    pytest.param(dict(gpu_evidence=[{"gpu": 1, "uuid": "GPU-1", "kind": "xid", "code": 79, "xid": 79,
                                     "side": "machine", "name": "Xid 79", "action_words": "reboot"}]), "gpu-fault",
                 id="machine-xid-seen-by-nvml"),
    pytest.param(dict(stderr=NCCL, gpu_evidence=[{"gpu": 1, "kind": "ecc-dbe", "side": "machine"}]), "gpu-fault",
                 id="nccl-timeout-after-a-machine-fault"),
    pytest.param(dict(exit_code=None, sig=signal.SIGKILL), "crashed", id="sigkill-unrequested"),
    pytest.param(dict(exit_code=137), "crashed", id="exit-137"),
    pytest.param(dict(exit_code=None, sig=signal.SIGKILL, host_memory_pressure=True), "oom", id="host-oom-killer"),
    pytest.param(dict(exit_code=1, stderr="KeyError: 'x'"), "crashed", id="plain-crash"),
    pytest.param(dict(exit_code=None, sig=None), "crashed", id="unknown-status"),
])
def test_builtin_outcomes(kwargs, outcome):
    assert run(**kwargs).outcome == outcome


def test_torch_oom_sizes_are_parsed_into_bytes():
    got = run(stderr=TORCH_OOM)
    assert got.summary == "CUDA OOM: tried to allocate 1.62 GiB (176.87 GiB in use)"
    assert got.detail["failed_alloc_bytes"] == round(1.62 * GIB)
    assert got.detail["in_use_bytes"] == round(176.87 * GIB)
    assert got.detail["free_bytes"] == round(1.06 * GIB)
    assert got.detail["total_bytes"] == round(178.35 * GIB)
    assert got.detail["gpu"] == 0
    assert got.retry is None


def test_old_format_oom_reports_the_allocation():
    got = run(stderr=OLD_TORCH_OOM)
    assert got.detail["failed_alloc_bytes"] == 20 * 2**20
    assert "20.00 MiB" in got.summary


def test_cpu_oom_reports_plain_bytes():
    got = run(stderr=CPU_OOM)
    assert got.detail["failed_alloc_bytes"] == 8589934592
    assert got.summary.startswith("CPU OOM: tried to allocate 8.00 GiB")


@pytest.mark.parametrize(("number", "unit", "expected"), [
    ("1.62", "GiB", round(1.62 * 2**30)), ("20.00", "MiB", 20 * 2**20), ("3", "KiB", 3072), ("1", "TiB", 2**40),
    ("512", "B", 512), ("512", "bytes", 512), ("512", None, 512), ("2", "GB", 2 * 10**9), ("1.5", "MB", 1_500_000),
])
def test_parse_size(number, unit, expected):
    assert parse_size(number, unit) == expected


def test_nccl_detail_flag():
    assert run(stderr=NCCL).detail["nccl_timeout"] is True


def test_sigkill_note_suggests_the_oom_killer():
    got = run(exit_code=None, sig=signal.SIGKILL)
    assert got.detail["note"] == "killed (OOM killer?)"
    assert got.detail["signal_name"] == "SIGKILL"


def test_crash_summary_carries_the_last_stderr_line_and_tail_is_bounded():
    stderr = "\n".join(f"line {i}" for i in range(100)) + "\nKeyError: 'batch'"
    got = run(exit_code=1, stderr=stderr)
    assert got.summary == "crashed (exit 1): KeyError: 'batch'"
    assert got.detail["stderr_tail"].splitlines()[-1] == "KeyError: 'batch'"
    assert len(got.detail["stderr_tail"].splitlines()) == 20


def test_diverged_record_step_is_reported():
    got = run(records=[rec(4, train_loss=1.0), rec(5, "diverged", train_loss=math.nan)])
    assert got.detail["diverged_step"] == 5


ECC_RULE = ClassifyRule("uncorrectable ECC error", "crashed", retry=False)
OOM_RETRY = ClassifyRule(r"Tried to allocate", "oom", retry=True)


@pytest.mark.parametrize(("rules", "stderr", "records", "outcome", "retry", "matched"), [
    pytest.param([ECC_RULE], "CUDA error: uncorrectable ECC error encountered", [], "crashed", False,
                 "uncorrectable ECC error", id="user-rule-beats-builtin-gpu-fault"),
    pytest.param([ClassifyRule("CUDA out of memory", "crashed")], TORCH_OOM, [], "crashed", None,
                 "CUDA out of memory", id="user-rule-beats-builtin-oom"),
    pytest.param([ECC_RULE, OOM_RETRY], TORCH_OOM, [], "oom", True, "Tried to allocate", id="rules-in-order"),
    pytest.param([ClassifyRule(r"event=eval_hang", "stalled", retry=True)], "", [rec(3, "eval_hang")],
                 "stalled", True, "event=eval_hang", id="rule-over-log-records"),
    pytest.param([ClassifyRule(r"grad_norm=inf", "diverged")], "", [rec(3, grad_norm=math.inf)],
                 "diverged", None, "grad_norm=inf", id="rule-over-record-fields"),
    pytest.param([ECC_RULE], "KeyError", [], "crashed", None, None, id="no-match-falls-through"),
])
def test_user_rules_come_first(rules, stderr, records, outcome, retry, matched):
    got = run(exit_code=1, stderr=stderr, records=records, rules=rules)
    assert (got.outcome, got.retry, got.detail["matched_rule"]) == (outcome, retry, matched)


@pytest.mark.parametrize(("exit_code", "stop"), [(0, False), (10, True)])
def test_rules_never_turn_success_or_requested_stop_into_failure(exit_code, stop):
    got = run(exit_code=exit_code, stop=stop, stderr="uncorrectable ECC error", rules=[ECC_RULE])
    assert got.outcome in ("completed", "stopped")
    assert got.detail["matched_rule"] is None


def test_a_diverged_exit_names_the_metric_and_its_value():
    """HF's BabysitCallback diverged on grad_norm: exit 11 and its `diverged` record; the summary said
    "non-finite loss", and its tail was tqdm fragments."""
    bar = "".join(f"\r  {i}%|{'#' * (i // 10)}| {i}/100 [00:0{i // 50}<00:01]" for i in range(0, 101, 5))
    stderr = (f"{bar}\n"
              "babysit: diverged: non-finite grad_norm (grad_norm = nan) at step 150; training stops after this step\n"
              f"{bar}\n{bar}\n")
    diverged = LogRecord(150, 1.0, {}, "diverged", {"reason": "non-finite grad_norm", "grad_norm": math.nan})
    got = run(exit_code=11, stderr=stderr, records=[rec(150, loss=2.0), diverged])
    assert got.outcome == "diverged"
    assert got.summary == "diverged: grad_norm = nan at step 150 (exit 11)"
    assert got.detail["stderr_tail"] == ("  100%|##########| 100/100 [00:02<00:01]\n"
                                         "babysit: diverged: non-finite grad_norm (grad_norm = nan) at step 150; "
                                         "training stops after this step\n"
                                         "  100%|##########| 100/100 [00:02<00:01]")


@pytest.mark.parametrize(("records", "declared", "summary"), [
    ([rec(7, train_loss=math.inf)], None, "diverged: train_loss = inf at step 7 (exit 1)"),
    ([rec(7, eval_acc=math.nan)], ("eval_acc",), "diverged: eval_acc = nan at step 7 (exit 1)"),
])
def test_a_nonfinite_record_names_the_metric_and_its_value(records, declared, summary):
    assert run(records=records, nonfinite_metrics=declared).summary == summary


def test_exit_11_with_what_the_daemon_saw_names_it():
    assert run(exit_code=11, nonfinite_seen="grad_norm = inf at step 9").summary == \
        "diverged: grad_norm = inf at step 9 (exit 11)"


TORCHRUN_SIGTERM = ("W1201 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal, shutting down "
                    "workers\ntorch.distributed.elastic.multiprocessing.api.SignalException: Process 23501 got signal: 15")
TORCHRUN_KILLED = TORCHRUN_SIGTERM.replace("\ntorch", "\nW1201 api.py:1046] Unable to shutdown process 23648 via "
                                           "Signals.SIGTERM, forcefully exiting via Signals.SIGKILL\ntorch")


def stopped_record(step: int, ts: float) -> LogRecord:
    return LogRecord(step, ts, {}, "stopped", {"reason": "SIGTERM"})


@pytest.mark.parametrize(("kwargs", "clean", "by", "said"), [
    pytest.param(dict(records=[stopped_record(351, 100.2)]), True, "stop-record",
                 "exit 1: a clean stop, shown by the trainer's stop record at step 351", id="stop-record"),
    pytest.param(dict(checkpoint_after_stop=("step_000351.pt", 0.4)), True, "checkpoint",
                 "a clean stop, shown by checkpoint step_000351.pt written 0.4 s after the stop signal",
                 id="checkpoint-after-the-signal"),
    pytest.param(dict(records=[stopped_record(351, 100.2)], checkpoint_after_stop=("step_000351.pt", 0.4)), True,
                 "stop-record", "the trainer's stop record at step 351 and checkpoint step_000351.pt", id="both"),
    pytest.param(dict(records=[stopped_record(120, 50.0)]), False, None,
                 "(it did not exit cleanly: no stop record in the log and no checkpoint written after the stop "
                 "signal; check the checkpoint)", id="a-stop-record-from-before-the-signal-is-not-this-stop"),
    pytest.param(dict(), False, None, "it did not exit cleanly: no stop record", id="nothing-shows-a-save"),
    pytest.param(dict(stderr=TORCHRUN_KILLED, records=[stopped_record(351, 100.2)]), False, "launcher",
                 "the launcher SIGKILLed rank pid 23648 when it outlived the stop signal", id="a-rank-killed"),
])
def test_a_stop_behind_a_launcher_that_exits_1_is_told_clean_or_not_from_what_the_run_shows(kwargs, clean, by, said):
    kwargs = {"stderr": TORCHRUN_SIGTERM, **kwargs}
    got = run(exit_code=1, stop=True, stop_reason="abort", stop_sent_at=100.0, **kwargs)
    assert got.outcome == "stopped"
    assert got.summary.startswith("stopped on request (abort), exit 1")
    assert said in got.summary, got.summary
    assert (got.detail["clean_stop"]["clean"], got.detail["clean_stop"]["by"]) == (clean, by)


def test_a_stop_the_exit_status_shows_clean_needs_no_other_evidence():
    got = run(exit_code=10, stop=True, stop_reason="abort")
    assert got.summary == "stopped on request (abort), exit 10" and got.detail["clean_stop"]["by"] == "exit"


def test_machine_evidence_names_the_gpu_the_fault_and_the_catalogs_action():
    got = run(gpu_evidence=[{"gpu": 1, "uuid": "GPU-8f", "kind": "xid", "code": 79, "xid": 79, "side": "machine",
                             "name": "Xid 79 (GPU has fallen off the bus)", "action_words": "reboot the machine"}])
    assert got.summary == ("GPU fault, the machine's: GPU 1 (GPU-8f): Xid 79 (GPU has fallen off the bus) — "
                           "reboot the machine (exit 1)")
    assert got.detail["gpu_evidence"][0]["uuid"] == "GPU-8f"


def test_the_trainers_xid_is_said_as_the_trainers_with_a_healthy_gpu():
    got = run(stderr="RuntimeError: CUDA error: an illegal memory access was encountered",
              gpu_evidence=[{"gpu": 0, "kind": "xid", "code": 31, "xid": 31, "side": "application",
                             "name": "Xid 31 (GPU memory page fault)"}])
    assert got.outcome == "crashed"
    assert "the trainer's own GPU error: Xid 31 (GPU memory page fault) on GPU 0 — the GPU stays healthy" in got.summary


@pytest.mark.parametrize("reason", ["gpu-fault", "gpu-held", "abort"])
def test_a_stop_that_reached_a_trainer_which_had_logged_its_completion_is_completed(reason):
    """Killed by the stop's SIGTERM while exiting after its completion record: its work was done."""
    done = LogRecord(60, 100.0, {}, "completed", {})
    got = run(exit_code=None, sig=15, stop=True, stop_reason=reason, stop_sent_at=101.0, records=[done])
    assert got.outcome == "completed", got
    assert got.summary == (f"completed: the trainer logged its completion at step 60 before the stop (stop: "
                           f"{reason}) reached it while it exited (killed by SIGTERM)")
    assert got.detail["completed_before_stop"] == reason
    assert run(exit_code=None, sig=15, stop=True, stop_reason=reason, records=[rec(60)]).outcome != "completed"


@pytest.mark.parametrize(("reason", "outcome"), [("abort", "stopped"), ("gpu-held", "stopped"),
                                                 ("stalled", "stalled")])
def test_an_exit_0_after_babysit_s_stop_before_the_end_step_is_the_stop_not_a_completion(reason, outcome):
    """A trainer that saves and exits 0 on babysit's SIGTERM (an abort, a guard stop): before, `completed` ✅,
    the stop shown as a success and the run as done."""
    got = run(exit_code=0, stop=True, stop_reason=reason, records=[rec(40)], end_step=100)
    assert got.outcome == outcome, got
    assert got.summary.startswith(f"{outcome} on request") and got.summary.endswith("exit 0"), got.summary
    assert got.detail["clean_stop"]["clean"] is True
    assert run(exit_code=0, stop=True, stop_reason=reason, records=[rec(40)]).outcome == outcome  # no end known


def test_an_exit_0_after_a_stop_is_completed_once_the_run_had_reached_its_end_step():
    assert run(exit_code=0, stop=True, stop_reason="abort", records=[rec(100)], end_step=100).outcome == "completed"
    done = LogRecord(60, 100.0, {}, "completed", {})
    assert run(exit_code=0, stop=True, stop_reason="abort", records=[done], end_step=100).outcome == "completed"
    assert run(exit_code=0, records=[rec(40)], end_step=100).outcome == "completed"  # no stop asked: its own end
