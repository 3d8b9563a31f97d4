"""Issue 39 point 4: one registry type (:class:`mathrl.registry.Registry`) for every kind of named part; the
schema's choices and ``--help`` read the registries, so no name list is written twice; ``mathrl.config`` is a
leaf that imports no other part of mathrl (it reads names through :mod:`mathrl.registry`, which imports a
registry's home module by name when the registry is read)."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from mathrl import registry as R
from mathrl.errors import InputError
from mathrl.registry import Registry, UnknownNameError

PKG = Path(__file__).resolve().parents[2] / "mathrl"
LEAF_ALLOWED = {"mathrl.config", "mathrl.errors", "mathrl.registry"}


def _mathrl_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a mathrl module in ``path``, at any depth (functions included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "mathrl"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "mathrl":
            if node.module == "mathrl":
                out += [(node.lineno, f"mathrl.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, node.module))
    return out


def _allowed(module: str, allowed: set[str]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


# ----------------------------------------------------------------------------- the package graph


def test_config_is_a_leaf():
    bad = [f"config/{p.name}:{line}: {mod}" for p in sorted((PKG / "config").glob("*.py"))
           for line, mod in _mathrl_imports(p) if not _allowed(mod, LEAF_ALLOWED)]
    assert bad == [], "mathrl/config imports upward (read names through mathrl.registry): " + "; ".join(bad)


def test_registry_is_a_leaf():
    bad = [mod for _, mod in _mathrl_imports(PKG / "registry.py") if mod != "mathrl.errors"]
    assert bad == []


def test_the_leaf_check_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("import mathrl.registry\n\ndef f():\n    from mathrl.algo.advantages import ESTIMATORS\n"
                 "    from mathrl import data\n    return ESTIMATORS, data\n")
    mods = [m for _, m in _mathrl_imports(f) if not _allowed(m, LEAF_ALLOWED)]
    assert mods == ["mathrl.algo.advantages", "mathrl.data"]


def test_loading_a_config_needs_only_the_leaves_until_a_registry_is_read():
    code = ("import sys\nimport mathrl.config\n"
            "print(sorted(m for m in sys.modules if m.startswith('mathrl.') and m.count('.') == 1))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(PKG.parent)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "['mathrl.config', 'mathrl.errors', 'mathrl.registry']"


# ----------------------------------------------------------------------------- the Registry type


def test_lookup_and_metadata():
    reg: Registry[int] = Registry("toy part", key="toy.part")

    @reg.register("double", doc="twice the input", cost=2)
    def double(x: int) -> int:
        """Return 2x."""
        return 2 * x

    assert reg.register("triple", lambda x: 3 * x) is not None
    assert reg.names() == ("double", "triple") and list(reg) == ["double", "triple"] and len(reg) == 2
    assert "double" in reg and "nope" not in reg
    assert reg.get("double") is double and reg["double"] is double
    assert reg.items() == [("double", double), ("triple", reg["triple"])]
    assert reg.meta("double") == {"doc": "twice the input", "cost": 2} and reg.meta("triple") == {}
    assert reg.doc("double") == "twice the input"
    assert reg.get("nope", None) is None


def test_an_unknown_name_names_the_kind_the_value_the_allowed_names_and_the_closest():
    reg: Registry[str] = Registry("policy loss")
    for name in ("ppo", "gspo", "cispo"):
        reg.register(name, name.upper())
    with pytest.raises(UnknownNameError) as info:
        reg.get("gpso")
    exc = info.value
    assert str(exc) == "unknown policy loss 'gpso'; allowed: ppo, gspo, cispo; did you mean 'gspo'?"
    assert isinstance(exc, InputError) and isinstance(exc, KeyError) and isinstance(exc, ValueError)
    assert exc.allowed == ("ppo", "gspo", "cispo")
    with pytest.raises(KeyError, match=r"^unknown policy loss 'xyz'; allowed: ppo, gspo, cispo$"):
        reg["xyz"]


def test_a_name_registered_twice_is_refused():
    reg: Registry[int] = Registry("toy part")
    reg.register("a", 1)
    with pytest.raises(ValueError, match="toy part 'a' is already registered"):
        reg.register("a", 2)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: None)
    assert reg["a"] == 1
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("", 3)


def test_removal_and_stand_ins_for_tests():
    reg: Registry[int] = Registry("toy part")
    reg.register("a", 1, doc="one")
    reg["a"] = 10  # a test standing in for an entry (monkeypatch.setitem)
    assert reg["a"] == 10 and reg.doc("a") == "one"
    assert reg.pop("a") == 10 and "a" not in reg and reg.pop("a", None) is None
    reg.register("b", 2)
    del reg["b"]
    assert reg.names() == ()


def test_the_home_module_is_imported_when_the_registry_is_read(tmp_path, monkeypatch):
    pkg = tmp_path / "toyhome"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "parts.py").write_text("from tests_toy_registry import REG\nREG.register('alpha', 1)\n"
                                  "REG.register('beta', 2)\n")
    (pkg / "more.py").write_text("from tests_toy_registry import REG\nREG.register('gamma', 3)\n"
                                 "SEEN = list(REG)  # a home may read its own registry while it is imported\n")
    reg: Registry[int] = Registry("toy part", home=("toyhome.parts", "toyhome.more"))
    mod = type(sys)("tests_toy_registry")
    mod.REG = reg
    monkeypatch.setitem(sys.modules, "tests_toy_registry", mod)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("toyhome", "toyhome.parts", "toyhome.more"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert "toyhome.parts" not in sys.modules
    assert reg.get("alpha") == 1  # imports the first home only: it has the name
    assert "toyhome.parts" in sys.modules and "toyhome.more" not in sys.modules
    assert reg.names() == ("alpha", "beta", "gamma") and "toyhome.more" in sys.modules
    assert sys.modules["toyhome.more"].SEEN == ["alpha", "beta", "gamma"]


def test_a_home_that_fails_to_import_is_tried_again(tmp_path, monkeypatch):
    reg: Registry[int] = Registry("toy part", home="toyhome_missing_module")
    with pytest.raises(ModuleNotFoundError):
        reg.names()
    with pytest.raises(ModuleNotFoundError):
        reg.get("x")


# ----------------------------------------------------------------------------- every name list written once


def _choices_by_field():
    """{config key: (its registry, the extra allowed values)} for the fields whose choices read a registry."""
    from mathrl.config.loader import section_classes

    out = {}
    for section, cls in section_classes().items():
        for f in dataclasses.fields(cls):
            fn = f.metadata.get("choices")
            if fn is not None:
                out[f"{section}.{f.name}"] = fn
    return out


FIELD_REGISTRIES = {"algo.advantage": (R.ESTIMATORS, ("auto",)), "algo.policy_loss": (R.POLICY_LOSSES, ()),
                    "algo.loss_agg": (R.LOSS_AGG_MODES, ("auto",)), "algo.kl_estimator": (R.KL_ESTIMATORS, ("auto",)),
                    "rollout.backend": (R.ROLLOUT_BACKENDS, ("auto",))}


def test_every_registry_is_covered():
    named = {id(r) for r, _ in FIELD_REGISTRIES.values()}
    assert set(map(id, R.REGISTRIES)) >= named
    assert {r.kind for r in R.REGISTRIES} == {"advantage estimator", "policy loss", "loss aggregation mode",
                                              "KL estimator", "reward term", "data source", "prompt template",
                                              "rollout backend", "ablation method"}


@pytest.mark.parametrize("key", sorted(FIELD_REGISTRIES))
def test_the_schema_choices_are_the_registry_names(key):
    from mathrl.config.loader import field_type_name, section_classes

    reg, extra = FIELD_REGISTRIES[key]
    assert set(_choices_by_field()) >= set(FIELD_REGISTRIES)
    assert tuple(_choices_by_field()[key]()) == (*extra, *reg.names())
    # and the field's type is a plain str: the names are not written again as a Literal
    section, name = key.split(".")
    assert typing.get_type_hints(section_classes()[section])[name] is str, f"{key} repeats its names in a Literal"
    assert field_type_name(str, {"choices": _choices_by_field()[key]}) == \
        "one of " + ", ".join(repr(n) for n in (*extra, *reg.names()))


def _help_section(text: str, reg: Registry) -> list[str]:
    """The names listed under ``reg``'s title in a help text."""
    title = f"{reg.plural[0].upper()}{reg.plural[1:]} ("
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    names = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        m = re.match(r"^  (\S+)", line)
        if m and not line.startswith("      "):
            names.append(m.group(1))
    return names


@pytest.mark.parametrize("reg", [r for r in R.REGISTRIES if r is not R.ABLATION_METHODS], ids=lambda r: r.kind)
def test_train_help_lists_exactly_each_registry(reg):
    from mathrl.cli import train_parser

    text = train_parser().format_help()
    assert _help_section(text, reg) == list(reg.names())
    for key, (freg, extra) in FIELD_REGISTRIES.items():
        if freg is reg:
            line = next(x for x in text.splitlines() if x.startswith(f"  {key} = "))
            assert line.endswith("(one of " + ", ".join(repr(n) for n in (*extra, *reg.names())) + ")"), line


def test_ablate_help_lists_exactly_the_methods():
    from mathrl.ablate.cli import build_parser

    assert _help_section(build_parser().format_help(), R.ABLATION_METHODS) == ["rft", "online_rft", "dpo", "online_dpo", "grpo", "grpo_ps",
                                                                                  "ppo"]


def test_a_study_method_is_looked_up_in_its_registry(monkeypatch):
    from mathrl.ablate import methods

    with pytest.raises(UnknownNameError, match="unknown ablation method 'grpoo'.*did you mean 'grpo'"):
        methods.run_method("grpoo", None)
    calls = []
    R.ABLATION_METHODS.register("toy_method", lambda opts: calls.append(opts) or "the method", presets={}, sft=False)
    try:
        monkeypatch.setattr(methods, "Trainer", lambda cfg, method, problems: type(
            "T", (), {"fit": staticmethod(lambda: (cfg, method, problems))}))
        assert methods.run_method("toy_method", "cfg", rft_opts={"dedup": False},
                                  task=methods.Task(train_problems=[1])) == ("cfg", "the method", [1])
        assert calls == [{"dedup": False}]
    finally:
        R.ABLATION_METHODS.pop("toy_method")
