"""Progress bars: drawn on a terminal only (off in CI and logs, forced by MATHRL_PROGRESS), and the
long phases (ablation runs, the embedded model's conversion) draw one."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import yaml

import mathrl.progress
from mathrl.progress import Progress, bars_enabled


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def _terminal(monkeypatch) -> _TTY:
    """stderr is an interactive terminal and nothing in the environment decides (set in the test
    itself: pytest's output capture replaces sys.stderr again after the fixtures)."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("MATHRL_PROGRESS", raising=False)
    tty = _TTY()
    monkeypatch.setattr(sys, "stderr", tty)
    return tty


def test_on_for_a_terminal(monkeypatch):
    terminal = _terminal(monkeypatch)
    assert bars_enabled()
    with Progress(3, "terminal phase", unit="step") as bar:
        assert bar.enabled
        bar.update()
    assert "terminal phase" in terminal.getvalue()


def test_off_in_ci(monkeypatch):
    terminal = _terminal(monkeypatch)
    monkeypatch.setenv("CI", "true")
    assert not bars_enabled()
    with Progress(3, "ci phase") as bar:
        assert not bar.enabled
        bar.update()
        bar.set_postfix("x")
    assert terminal.getvalue() == ""


def test_off_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("MATHRL_PROGRESS", raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not bars_enabled()
    assert not Progress(3, "log phase").enabled


def test_forced_on_writes_to_stderr(monkeypatch, capsys):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("MATHRL_PROGRESS", "1")
    with Progress(2, "forced phase", unit="case") as bar:
        assert bar.enabled
        bar.update(2)
    out, err = capsys.readouterr()
    assert out == "" and "forced phase" in err


def test_forced_off(monkeypatch):
    terminal = _terminal(monkeypatch)
    monkeypatch.setenv("MATHRL_PROGRESS", "0")
    assert not bars_enabled()
    with Progress(2, "quiet phase") as bar:
        bar.update(2)
    assert not bar.enabled and terminal.getvalue() == ""


def test_a_log_gets_a_line_every_30_s_after_the_first_10(monkeypatch):
    """Issue 38 point 10: in a log (no terminal) a long phase was silent for minutes."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("MATHRL_PROGRESS", raising=False)
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    now = [100.0]
    monkeypatch.setattr(mathrl.progress.time, "monotonic", lambda: now[0])
    bar = Progress(100, "[gsm8k] generating", unit="problem")
    assert not bar.enabled
    for t in (5, 9, 12, 20, 41, 45, 72, 80):  # 10 problems at each of these seconds
        now[0] = 100.0 + t
        bar.update(10)
    lines = log.getvalue().splitlines()
    assert lines == ["mathrl: [gsm8k] generating: 30/100 problem (30%), 12s, ~28s left",
                     "mathrl: [gsm8k] generating: 60/100 problem (60%), 45s, ~30s left",
                     "mathrl: [gsm8k] generating: 80/100 problem (80%), 1m20s, ~20s left"]
    # no lines on other ranks (enabled=False) or with MATHRL_PROGRESS=0
    for quiet in (Progress(10, "rank 1", enabled=False), None):
        if quiet is None:
            monkeypatch.setenv("MATHRL_PROGRESS", "0")
            quiet = Progress(10, "off")
        now[0] += 100
        quiet.update(5)
    assert len(log.getvalue().splitlines()) == 3


def test_a_slow_phase_says_so_in_the_log(monkeypatch, capsys):
    """A phase without countable progress (a checkpoint write) that outlasts LINE_AFTER says so while it runs and
    when it ends; a short one prints nothing."""
    import time

    from mathrl.progress import SlowPhase

    monkeypatch.delenv("MATHRL_PROGRESS", raising=False)
    monkeypatch.setattr(mathrl.progress, "LINE_AFTER", 0.2)
    monkeypatch.setattr(mathrl.progress, "LINE_EVERY", 0.3)
    with SlowPhase("quick phase"):
        pass
    with SlowPhase("writing the checkpoint of step 3"):
        time.sleep(0.65)
    with SlowPhase("on rank 1", enabled=False):
        time.sleep(0.3)
    lines = capsys.readouterr().err.splitlines()
    assert [x.split(": ")[1] for x in lines] == ["writing the checkpoint of step 3"] * 3, lines
    assert lines[0].endswith("so far") and lines[1].endswith("so far") and "done after" in lines[2], lines


class _Recorder:
    """Stands in for Progress: records what a phase asked of its bar."""

    made: list["_Recorder"] = []

    def __init__(self, total, desc, *, unit="it", enabled=None):
        self.total, self.desc, self.unit, self.asked = total, desc, unit, enabled
        self.enabled = enabled is not False
        self.n, self.postfixes, self.closed = 0, [], False
        _Recorder.made.append(self)

    def update(self, n=1):
        self.n += n

    def set_postfix(self, text):
        self.postfixes.append(text)

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def recorder(monkeypatch):
    _Recorder.made = []
    monkeypatch.setattr(mathrl.progress, "Progress", _Recorder)
    return _Recorder.made


def _two_run_study(tmp_path: Path) -> Path:
    study = {"study": {"name": "bars", "out": str(tmp_path / "out")},
             "base": {"model": {"name": str(tmp_path / "model")}, "train": {"steps": 1}},
             "runs": [{"method": "grpo"}, {"method": "online_rft"}]}
    path = tmp_path / "bars.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def test_ablation_runs_draw_a_bar(tmp_path, monkeypatch, recorder):
    from mathrl.ablate import driver

    done: list[str] = []
    monkeypatch.setattr(driver, "run_one", lambda study, run, task, log: done.append(run.name))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv(driver.CHILD_ENV, raising=False)
    driver.run_study(_two_run_study(tmp_path), isolate=False, report=False, log=lambda msg: None)

    (bar,) = recorder
    assert done == ["grpo", "online_rft"]
    assert (bar.total, bar.desc, bar.unit, bar.asked) == (2, "ablation bars", "run", None)
    assert bar.n == 2 and bar.closed
    assert bar.postfixes[:2] == ["grpo", "online_rft"]


def test_ablation_bar_only_on_the_main_process(tmp_path, monkeypatch, recorder):
    from mathrl.ablate import driver

    monkeypatch.setattr(driver, "run_one", lambda study, run, task, log: None)
    monkeypatch.setenv("RANK", "1")
    driver.run_study(_two_run_study(tmp_path), isolate=False, report=False, log=lambda msg: None)
    assert [b.asked for b in recorder] == [False]


def test_model_conversion_draws_a_bar(tmp_path, monkeypatch, recorder):
    import transformers
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    from mathrl.models import embedded

    seen: dict = {}

    class Saver:
        pad_token, eos_token, pad_token_id, eos_token_id = None, "</s>", 0, 0

        def save_pretrained(self, dest, **kwargs):
            Path(dest, "saved").write_text("x")

    class FakeModel(Saver):
        config = type("Config", (), {})()
        generation_config = type("GenerationConfig", (), {})()

    class AutoTok:
        from_pretrained = staticmethod(lambda *a, **k: Saver())

    class AutoModel:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            seen["tensor_loop"] = list(gguf_utils.tqdm(range(3), desc="transformers' own bar"))
            seen["hf_bars"] = hf_logging.is_progress_bar_enabled()
            return FakeModel()

    monkeypatch.setattr(transformers, "AutoTokenizer", AutoTok)
    monkeypatch.setattr(transformers, "AutoModelForCausalLM", AutoModel)
    own_tqdm, hf_bars = gguf_utils.tqdm, hf_logging.is_progress_bar_enabled()
    embedded.convert_gguf(tmp_path / "model.Q4_1.gguf", tmp_path)

    (bar,) = recorder
    assert "model.Q4_1.gguf" in bar.desc and bar.n == bar.total and bar.closed
    assert seen == {"tensor_loop": [0, 1, 2], "hf_bars": False}  # transformers' bars are off meanwhile
    assert gguf_utils.tqdm is own_tqdm and hf_logging.is_progress_bar_enabled() == hf_bars
