"""One base class for user-facing errors (mathrl/errors.py): every stage's error derives from InputError
(exit 2) or RunStopped (exit 3), and the entry point reports any of them as one line by class."""

from __future__ import annotations

import pytest

from mathrl import cli
from mathrl.errors import InputError, MathrlError, RunStopped


def test_every_user_facing_error_derives_from_the_base():
    from mathrl.config import ConfigError
    from mathrl.data.errors import DataError
    from mathrl.models.errors import ModelError
    from mathrl.train.errors import CheckpointError, TrainingError

    for cls in (ConfigError, DataError, ModelError, cli.UserError):
        assert issubclass(cls, InputError), cls
    for cls in (CheckpointError, TrainingError):
        assert issubclass(cls, RunStopped), cls
    assert issubclass(ConfigError, ValueError) and issubclass(DataError, ValueError)  # callers catching those
    assert issubclass(ModelError, RuntimeError) and issubclass(TrainingError, RuntimeError)


@pytest.mark.parametrize("base, code, verb", [(InputError, 2, "error"), (RunStopped, 3, "stopped")])
def test_the_entry_point_reports_by_class(monkeypatch, capsys, base, code, verb):
    """A new error class of any stage is reported as one line with its exit status, without registering it."""
    class StageError(base, RuntimeError):
        pass

    def command(argv):
        raise StageError("data/x.jsonl:3: key 'answer' is missing")

    monkeypatch.setitem(cli.COMMANDS, "data", command)
    assert cli.main(["data"]) == code
    err = capsys.readouterr().err
    assert err == f"mathrl data: {verb}: data/x.jsonl:3: key 'answer' is missing\n"


def test_other_exceptions_are_not_swallowed(monkeypatch):
    def command(argv):
        raise KeyError("a bug")

    monkeypatch.setitem(cli.COMMANDS, "data", command)
    with pytest.raises(KeyError):
        cli.main(["data"])
    assert not issubclass(KeyError, MathrlError)
