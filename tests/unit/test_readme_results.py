"""README's demo table re-derives from the files kept in docs/results/demo/.

The kept samples of both held-out evaluations are graded again by ``mathrl eval --regrade`` (the
product's verifier and metrics, on a copy; it discards the kept verdicts itself), and every before/after
figure README prints must equal the re-graded one at README's three decimals."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEPT = ROOT / "docs" / "results" / "demo"

os.environ.setdefault("OMP_NUM_THREADS", "1")


def readme_demo_table(text: str) -> dict[str, tuple[float, float]]:
    """{metric: (before, after)} from the table in README's printed `make demo` output."""
    block = text.split("Held-out evaluation before and after training:", 1)[1].split("```", 1)[0]
    rows = re.findall(r"^\| ([\w@]+) \| ([\d.]+) \| ([\d.]+) \|$", block, flags=re.M)
    return {m: (float(b), float(a)) for m, b, a in rows}


def regraded(folder: Path, tmp: Path) -> dict[str, float]:
    from mathrl.cli import main

    copy = tmp / folder.name
    shutil.copytree(folder, copy)
    assert main(["eval", "--regrade", str(copy)]) == 0  # drops the kept verdicts and grades every sample again
    bench = json.loads((copy / "summary.json").read_text())["benchmarks"]["heldout"]
    return {name: m["value"] for name, m in bench["metrics"].items()}


def test_readme_demo_table_matches_the_kept_samples(tmp_path):
    table = readme_demo_table((ROOT / "README.md").read_text(encoding="utf-8"))
    assert {"greedy", "pass@1", "pass@4", "maj@4"} <= set(table), table
    before = regraded(KEPT / "eval" / "step_000000", tmp_path / "a")
    after = regraded(KEPT / "eval" / "step_000012", tmp_path / "b")
    for metric in ("greedy", "pass@1", "pass@4", "maj@4"):
        assert table[metric] == (round(before[metric], 3), round(after[metric], 3)), (
            f"README's {metric} row {table[metric]} differs from the kept samples: "
            f"{before[metric]:.3f} -> {after[metric]:.3f}")


def test_table_reader_sees_a_changed_figure():
    """Negative control: one README figure changed is a different table."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme_demo_table(text)
    changed = readme_demo_table(text.replace(f"| greedy | 0.375 | {table['greedy'][1]:.3f} |",
                                             "| greedy | 0.375 | 0.906 |"))
    assert changed["greedy"] != table["greedy"]
