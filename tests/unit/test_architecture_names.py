"""docs/architecture.md is true to the code: every file it names exists, every module, function, class,
attribute and config key it names in backticks resolves, and its layer picture matches the package imports.

Names are resolved by reading the source (no import of mathrl): ``train/loop.py`` is a file of mathrl,
``sampling.sample_step`` a name of a module whose dotted name ends in ``sampling``, ``Layout.plan`` a member
of a class ``Layout``, ``algo.advantage`` a config key; a name defined in the doc's own code blocks (the
worked examples) counts as defined. Text in backticks with spaces (messages, formulas) is not a name."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import keyword
import re
import sys
from pathlib import Path

from mathrl.config.help import describe_fields

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "mathrl"
DOC = ROOT / "docs" / "architecture.md"
REPO_DIRS = ("mathrl/", "tests/", "docs/", "scripts/", "configs/")
EXTERNAL = {"torch", "vllm", "deepspeed", "transformers", "peft"}
IDENT = r"[A-Za-z_]\w*"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_structure import _modules, import_graph  # noqa: E402


# ----------------------------------------------------------------------------- what the code defines


@dataclasses.dataclass
class Module:
    names: set[str]                # top-level definitions, assignments and imported names
    imports: dict[str, str]        # imported name -> the module it comes from
    classes: dict[str, set[str]]   # class -> its members (methods, fields, class attributes)
    instances: dict[str, str]      # a top-level ``NAME = Class(...)`` -> Class


def _module_index() -> dict[str, Module]:
    out = {}
    for dotted, path in _modules().items():
        tree = ast.parse(path.read_text())
        mod = Module(set(), {}, {}, {})
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                mod.names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {t.id for t in targets if isinstance(t, ast.Name)}
                mod.names |= names
                call = node.value
                if isinstance(call, ast.Subscript):  # Registry[EstimatorSpec](...) is a Call of a Subscript
                    call = call.value
                if isinstance(call, ast.Call):
                    func = call.func.value if isinstance(call.func, ast.Subscript) else call.func
                    if isinstance(func, ast.Name):
                        mod.instances.update(dict.fromkeys(names, func.id))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = dotted.split(".") if path.name == "__init__.py" else dotted.split(".")[:-1]
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                for a in node.names:
                    mod.names.add(a.asname or a.name)
                    mod.imports[a.asname or a.name] = f"{base}.{a.name}" if f"{base}.{a.name}" in _modules() else base
            elif isinstance(node, ast.Import):
                mod.names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                members = mod.classes.setdefault(node.name, set())
                for item in ast.walk(node):
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        members.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        members.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        members |= {t.id for t in item.targets if isinstance(t, ast.Name)}
                    elif isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) \
                            and item.value.id == "self":
                        members.add(item.attr)
        out[dotted] = mod
    return out


def _all_identifiers() -> set[str]:
    """Every name mathrl and its tests define anywhere: functions, classes, assignments, attributes,
    parameters."""
    names: set[str] = set()
    for path in [*PKG.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


# ----------------------------------------------------------------------------- what the doc mentions


def _doc_parts(text: str) -> tuple[str, list[str]]:
    """The prose (code blocks blanked) and the code blocks' contents."""
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
    return re.sub(r"```.*?```", "", text, flags=re.S), blocks


def _doc_defined(blocks: list[str]) -> set[str]:
    names: set[str] = set()
    for block in blocks:
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(IDENT, node.value):
                names.add(node.value)  # registered names: "median_baseline"
    return names


def _spans(prose: str) -> list[tuple[str, str, str]]:
    """(backticked text, the package its table row is about or "", the text before it on its line) for
    every span of the prose (a span may go over a line break)."""
    out = []
    for m in re.finditer(r"`([^`]+)`", prose):
        line_start = prose.rfind("\n", 0, m.start()) + 1
        row = re.match(r"\| `mathrl/(\w+)/`", prose[line_start:])
        out.append((" ".join(m.group(1).split()), row.group(1) if row else "", prose[line_start:m.start()]))
    return out


# ----------------------------------------------------------------------------- resolution


class Resolver:
    def __init__(self, doc_names: set[str]) -> None:
        self.mods = _module_index()
        self.classes: dict[str, set[str]] = {}
        for mod in self.mods.values():
            for cls, members in mod.classes.items():
                self.classes.setdefault(cls, set()).update(members)
        self.idents = _all_identifiers() | doc_names
        self.keys = {key for key, *_ in describe_fields()}
        self.sections = {k.split(".")[0] for k in self.keys}

    def config_key(self, text: str) -> bool:
        """``algo.advantage``; ``data.fields.question`` (a key of a mapping field); ``cfg.algo``."""
        parts = text.split(".")
        if parts[0] == "cfg":
            parts = parts[1:]
        return any(".".join(parts[:i]) in self.keys for i in range(2, len(parts) + 1)) or \
            (len(parts) == 1 and parts[0] in self.sections)

    def _member(self, cls: str, more: list[str]) -> bool:
        return len(more) == 1 and more[0] in self.classes.get(cls, set())

    def _in_module(self, dotted: str, rest: list[str], depth: int = 0) -> bool:
        if not rest:
            return True
        if f"{dotted}.{rest[0]}" in self.mods:  # a submodule
            return self._in_module(f"{dotted}.{rest[0]}", rest[1:], depth)
        mod = self.mods[dotted]
        name, more = rest[0], rest[1:]
        if name not in mod.names:
            return False
        if not more:
            return True
        if name in mod.classes:
            return self._member(name, more)
        if name in mod.instances:
            return self._member(mod.instances[name], more)
        src = mod.imports.get(name)
        if src in self.mods and depth < 5:  # an imported name: follow it to where it is defined
            return self._in_module(src, more if src.endswith("." + name) else rest, depth + 1)
        return self._member(name, more)

    def dotted(self, text: str) -> bool:
        parts = text.split(".")
        if parts[0] in EXTERNAL:
            return True
        if parts[0] == "ctx":  # a reward term's RewardContext
            return len(parts) == 2 and parts[1] in self.classes.get("RewardContext", set())
        for dotted in self.mods:  # a module named by its last segments, then names in it
            segs = dotted.split(".")
            for k in range(1, len(parts) + 1):
                if segs[-k:] == parts[:k] and self._in_module(dotted, parts[k:]):
                    return True
        if parts[0] in self.classes:  # Layout.plan
            return self._member(parts[0], parts[1:])
        for mod in self.mods.values():  # ROLLOUT_BACKENDS.register: a method of a module-level instance
            if parts[0] in mod.instances and self._member(mod.instances[parts[0]], parts[1:]):
                return True
        return self.config_key(text)

    def bare(self, name: str) -> bool:
        return name in self.idents or keyword.iskeyword(name) or hasattr(builtins, name)


def _path_ok(path: str, package: str) -> bool:
    if any(path.startswith(d) for d in REPO_DIRS):
        return (ROOT / path).exists()
    if "/" in path:
        return (PKG / path).exists()
    if package:
        return (PKG / package / path).exists()
    return any(PKG.rglob(path)) or any((ROOT / "tests").rglob(path))


def _problems(text: str) -> list[str]:
    prose, blocks = _doc_parts(text)
    res = Resolver(_doc_defined(blocks))
    bad = []
    for s, package, before in _spans(prose):
        if "<" in s or "NNN" in s:
            continue
        if before.endswith("Its test, "):  # the reader's new test file: its folder exists
            if not (ROOT / s).parent.is_dir():
                bad.append(s)
            continue
        m = re.fullmatch(r"([\w/.]+\.py): (\w+)", s)
        if m:  # "train/loop.py: train_step"
            path = m.group(1)
            mod = path.removesuffix(".py").replace("/", ".")
            mod = mod if mod.startswith("mathrl.") else f"mathrl.{mod}"
            if not _path_ok(path, package) or not res._in_module(mod, [m.group(2)]):
                bad.append(s)
            continue
        if re.fullmatch(r"[\w./-]+", s) and (s.endswith(".py") or any(s.startswith(d) for d in REPO_DIRS)):
            if not _path_ok(s.rstrip("/"), package):
                bad.append(s)
            continue
        if re.fullmatch(r"[\w.-]+\.(json|jsonl|yaml|pt|md|txt)", s):  # a file a run writes or reads
            continue
        if re.fullmatch(rf"({IDENT}(\.{IDENT})*=\S+\s*)+", s):  # config overrides, or a keyword argument
            bad += [k for k in re.findall(rf"({IDENT}(?:\.{IDENT})*)=", s)
                    if not (res.config_key(k) if "." in k else res.bare(k))]
            continue
        m = re.fullmatch(rf"@?({IDENT}(?:\.{IDENT})*)\(.*\).*", s)  # a call: its callee
        if m:
            callee = m.group(1)
            if not (res.dotted(callee) if "." in callee else res.bare(callee)):
                bad.append(s)
            continue
        if re.fullmatch(rf"{IDENT}(\.{IDENT})+", s):
            if not res.dotted(s):
                bad.append(s)
        elif re.fullmatch(IDENT, s) and ("_" in s.strip("_") or s[0].isupper()):
            if not res.bare(s):
                bad.append(s)
    return bad


def test_every_name_in_architecture_md_exists():
    bad = _problems(DOC.read_text())
    assert bad == [], "docs/architecture.md names what the code does not have: " + "; ".join(bad)


def test_the_name_check_finds_stale_names():
    # negative controls: a moved file, a renamed function, a member that is not there, a bad config key
    text = ("| `mathrl/train/` | `engines.py`, `trainer.py` |\n"
            "`train/engines.py` `mathrl/dist/collectives.py` `train/loop.py: train_step` `train/loop.py: step_once` "
            "`update.accumulate_and_step` `update.accumulate` `Layout.plan` `Layout.planned` "
            "`algo.advantage=grpo` `algo.advantages=grpo` `mathrl.registry.ESTIMATORS` `mathrl.registry.ESTIMATOR` "
            "`RLMethod` `RLMethods` `reward.GradeOptions` `sampling.sample_step` `sampling.sample_steps`\n"
            "```python\ndef median_baseline(): ...\n```\n`median_baseline`\n")
    assert _problems(text) == ["engines.py", "train/engines.py", "train/loop.py: step_once", "update.accumulate",
                               "Layout.planned", "algo.advantages", "mathrl.registry.ESTIMATOR", "RLMethods",
                               "sampling.sample_steps"]


# ----------------------------------------------------------------------------- the layer picture


def layers(text: str) -> list[list[str]]:
    """The rows of the picture under ``## Layers``, top first: the package names before the description."""
    section = text.split("## Layers", 1)[1]
    block = re.search(r"```\n(.*?)```", section, flags=re.S).group(1)
    return [re.split(r"\s{3,}", line.strip())[0].split() for line in block.splitlines() if line.strip()]


def layer_violations(rows: list[list[str]], edges: dict[str, set[str]]) -> list[str]:
    """Imports from a package to one on its own row or above (``mathrl.testing`` and the root package
    ``mathrl``, which imports nothing of mathrl, are not in the picture)."""
    level = {name: len(rows) - i for i, row in enumerate(rows) for name in row}

    def top(module: str) -> str:
        return module.split(".")[1] if module.count(".") else module

    bad = []
    for m, targets in edges.items():
        if m == "mathrl" or top(m) == "testing":
            continue
        for t in sorted(targets):
            if t == "mathrl" or top(t) == top(m):
                continue
            if top(m) not in level or top(t) not in level:
                bad.append(f"{m} -> {t} (not in the picture)")
            elif level[top(t)] >= level[top(m)]:
                bad.append(f"{m} -> {t}")
    return bad


def test_the_layer_picture_matches_the_imports():
    rows = layers(DOC.read_text())
    modules = _modules()
    packages = {m.split(".")[1] for m in modules if m.count(".")} - {"testing"}
    assert sorted(n for row in rows for n in row) == sorted(packages), "every package and top-level module once"
    assert layer_violations(rows, import_graph(modules)) == []


def test_the_layer_check_finds_an_upward_import():
    rows = [["train"], ["data", "reward"], ["config"]]
    edges = {"mathrl.train.loop": {"mathrl.data.splits", "mathrl.config"}, "mathrl.data.splits": {"mathrl.reward.api"},
             "mathrl.config.loader": {"mathrl.train.loop", "mathrl.errors"}, "mathrl.testing.tiny": {"mathrl.train"}}
    assert layer_violations(rows, edges) == ["mathrl.data.splits -> mathrl.reward.api",
                                             "mathrl.config.loader -> mathrl.errors (not in the picture)",
                                             "mathrl.config.loader -> mathrl.train.loop"]
