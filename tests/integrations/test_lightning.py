"""`BabysitLogger` on a real Lightning `Trainer` and a real `LightningCLI` (CPU, tiny data made here)."""

from __future__ import annotations

import csv
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from babysit.core.classify import ExitFacts, classify_exit
from babysit.core.reading.log_records import metric_series
from babysit.integrations import Diverged
from babysit.sources.logtail import read_all
from tests.conftest import Lazy, missing

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.skipif(missing("lightning"), reason="lightning is not installed (pip install '.[lightning]')"),
              pytest.mark.usefixtures("one_thread")]
pl = Lazy("lightning.pytorch")
loggers = Lazy("lightning.pytorch.loggers")
bl = Lazy("babysit.integrations.lightning")
tiny = Lazy("tests.integrations.lightning_tiny")


def raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_are_the_logged_values_at_the_trainers_global_step(tmp_path: Path, babysit_log: Path) -> None:
    model = tiny.TinyRegression()
    csv_logger = loggers.CSVLogger(tmp_path / "csv", name="", version="")
    trainer = pl.Trainer(**tiny.trainer_kwargs(30, 10), logger=[bl.BabysitLogger(), csv_logger],
                         default_root_dir=tmp_path, enable_checkpointing=False)
    trainer.fit(model, datamodule=tiny.TinyData())
    records, garbage = read_all(babysit_log)
    assert garbage == 0
    # the module's own view: the train loss of the step it computed at global_step k is the (k+1)-th
    # step's (HF's convention: logged at step k+1); a validation after N steps runs at global_step N
    train = {k + 1: v for name, k, v in model.logged if name == "train_loss"}
    val = {k: v for name, k, v in model.logged if name == "val_loss"}
    assert metric_series(records, "train_loss") == tuple((s, train[s]) for s in (5, 10, 15, 20, 25, 30))
    assert metric_series(records, "val_loss") == tuple((s, val[s]) for s in (10, 20, 30))
    assert all(r.metrics["total_steps"] == 30 for r in records)
    # Lightning's own CSV has the same values one step earlier (the `step_offset` a csv source needs)
    with open(tmp_path / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    ours = {(r.step, k): v for r in records for k, v in r.metrics.items() if k in ("train_loss", "val_loss")}
    theirs = {(int(row["step"]) + 1, k): float(row[k]) for row in rows for k in ("train_loss", "val_loss") if row[k]}
    assert ours == theirs


def test_a_nan_loss_stops_training_writes_diverged_and_ends_with_exit_11(tmp_path: Path, babysit_log: Path,
                                                                         capfd: pytest.CaptureFixture[str]) -> None:
    trainer = pl.Trainer(**tiny.trainer_kwargs(30, 10), logger=bl.BabysitLogger(), default_root_dir=tmp_path,
                         enable_checkpointing=False)
    with pytest.raises(Diverged) as stopped:
        trainer.fit(tiny.TinyRegression(nan_at=12), datamodule=tiny.TinyData())
    assert stopped.value.code == 11
    assert trainer.global_step == 15  # the first log after the NaN (every 5 steps), not max_steps
    records, _ = read_all(babysit_log)
    (event,) = [r for r in records if r.event == "diverged"]
    assert event.step == 15 and "train_loss" in event.nonfinite
    assert "babysit: diverged: non-finite train_loss" in capfd.readouterr().err
    for exit_code in (11, 1):
        got = classify_exit(ExitFacts(exit_code=exit_code, signal=None, stderr_tail="", last_records=records[-16:],
                            rules=(), stop_requested=False))
        assert got.outcome == "diverged", (exit_code, got.summary)


def test_with_exit_code_none_a_divergence_only_stops_training(tmp_path: Path, babysit_log: Path) -> None:
    logger = bl.BabysitLogger(exit_code=None)
    trainer = pl.Trainer(**tiny.trainer_kwargs(30, 10), logger=logger, default_root_dir=tmp_path,
                         enable_checkpointing=False)
    trainer.fit(tiny.TinyRegression(nan_at=3), datamodule=tiny.TinyData())
    assert trainer.global_step == 5 and logger.diverged is not None


def test_lightning_cli_takes_the_logger_from_a_flag_one_folder_an_attempt(tmp_path: Path, babysit_log: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    flags = ["fit", "--trainer.logger=babysit.integrations.lightning.BabysitLogger", "--trainer.max_steps=20",
             "--trainer.val_check_interval=10", "--trainer.check_val_every_n_epoch=null",
             "--trainer.log_every_n_steps=5", "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false",
             "--trainer.enable_model_summary=false"]
    cli = tiny.cli_main(flags)
    assert isinstance(cli.trainer.logger, bl.BabysitLogger)
    records, _ = read_all(babysit_log)
    assert [s for s, _ in metric_series(records, "val_loss")] == [10, 20]
    attempt1 = babysit_log.parent / "attempt-1"
    assert (attempt1 / "config.yaml").is_file() and list((attempt1 / "checkpoints").glob("*.ckpt"))
    # the retry (babysit sets BABYSIT_ATTEMPT=2) is not refused for the config the first attempt saved
    monkeypatch.setenv("BABYSIT_ATTEMPT", "2")
    tiny.cli_main(flags)
    assert (babysit_log.parent / "attempt-2" / "config.yaml").is_file()
    assert [r["step"] for r in raw(babysit_log) if "val_loss" in r] == [10, 20, 10, 20]  # a second attempt


@pytest.mark.slow
def test_a_lightning_cli_run_that_diverges_exits_11(tmp_path: Path) -> None:
    log = tmp_path / "train_log.jsonl"
    env = {**os.environ, "BABYSIT_LOG": str(log), "BABYSIT_ATTEMPT": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "tests.integrations.lightning_tiny", "fit", "--model.nan_at=7",
         "--trainer.logger=babysit.integrations.lightning.BabysitLogger", "--trainer.max_steps=30",
         "--trainer.log_every_n_steps=5", "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 11, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    records, _ = read_all(log)
    # NaN from the 7th step; the epoch-end validation after step 8 is the first log to show it
    assert [r.step for r in records if r.event == "diverged"] == [8]


def test_without_max_steps_total_steps_is_the_trainers_estimate(tmp_path: Path, babysit_log: Path) -> None:
    trainer = pl.Trainer(max_epochs=2, log_every_n_steps=4, accelerator="cpu", enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, logger=bl.BabysitLogger(),
                         default_root_dir=tmp_path)
    trainer.fit(tiny.TinyRegression(), datamodule=tiny.TinyData())  # 64 samples / 8 a batch = 8 steps an epoch
    records = raw(babysit_log)
    assert [r["step"] for r in records if "train_loss" in r] == [4, 8, 12, 16]
    assert {r["total_steps"] for r in records} == {16}


def test_the_logger_pickles_for_ddp_spawn(tmp_path: Path, babysit_log: Path) -> None:
    logger = bl.BabysitLogger()
    model = tiny.TinyRegression()
    trainer = pl.Trainer(**tiny.trainer_kwargs(5, 5), logger=logger, default_root_dir=tmp_path,
                         enable_checkpointing=False)
    trainer.fit(model, datamodule=tiny.TinyData())
    clone = pickle.loads(pickle.dumps(logger))
    assert clone._trainer() is None and clone.writer.log(99, x=1.0)
    assert raw(babysit_log)[-1]["step"] == 99


def test_without_the_trainer_it_writes_lightnings_step_and_says_so(tmp_path: Path, babysit_log: Path,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    trainer = pl.Trainer(**tiny.trainer_kwargs(10, 10), logger=bl.BabysitLogger(), default_root_dir=tmp_path,
                         enable_checkpointing=False, enable_autolog_hparams=False)
    trainer.fit(tiny.TinyRegression(), datamodule=tiny.TinyData())
    assert [s for s, _ in metric_series(read_all(babysit_log)[0], "train_loss")] == [4, 9]
    assert capfd.readouterr().err.count("did not get the trainer") == 1


def test_pytorch_lightning_has_its_own_logger_class(tmp_path: Path, babysit_log: Path) -> None:
    ptl = pytest.importorskip("pytorch_lightning", reason="pytorch_lightning is not installed")
    from babysit.integrations.pytorch_lightning import BabysitLogger as PTLLogger

    assert issubclass(PTLLogger, ptl.loggers.Logger)

    class Module(ptl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.inner = tiny.TinyRegression()

        def training_step(self, batch: object, batch_idx: int) -> object:
            x, y = batch  # type: ignore[misc]
            loss = ((self.inner.net(x) - y) ** 2).mean()
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> object:
            return self.inner.configure_optimizers()

    trainer = ptl.Trainer(max_steps=10, log_every_n_steps=5, accelerator="cpu", enable_progress_bar=False,
                          enable_model_summary=False, enable_checkpointing=False, logger=PTLLogger(),
                          default_root_dir=tmp_path)
    trainer.fit(Module(), tiny.TinyData().train_dataloader())
    assert [s for s, _ in metric_series(read_all(babysit_log)[0], "train_loss")] == [5, 10]
