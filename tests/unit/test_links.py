"""Every link resolves: README's and docs/'s relative markdown links (and their #anchors into
markdown files), and the repo files the product's docstrings and messages point at (``docs/*.md``,
``README.md``-style names)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: repo files named in Python text: docs/..., data/README.md, or an upper-case NAME.md
PY_REF = re.compile(r"(?<![\w/.-])((?:docs|data)/[\w./-]+\.md|[A-Z][A-Z_]+\.md)\b")


def _anchors(md: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file."""
    out = set()
    for line in md.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower().replace("`", ""))
            out.add(text.replace(" ", "-"))
    return out


def broken_links(md: Path, root: Path = ROOT) -> list[str]:
    bad = []
    in_code = False
    for n, line in enumerate(md.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        for target in LINK.findall(line):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                bad.append(f"{md.relative_to(root)}:{n}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor.lower() not in _anchors(dest):
                bad.append(f"{md.relative_to(root)}:{n}: {target} (no heading #{anchor})")
    return bad


def broken_py_refs(py: Path, root: Path = ROOT) -> list[str]:
    bad = []
    for n, line in enumerate(py.read_text(encoding="utf-8").splitlines(), start=1):
        for ref in PY_REF.findall(line):
            if not (root / ref).exists() and not (py.parent / ref).exists():
                bad.append(f"{py.relative_to(root)}:{n}: {ref} (no such file)")
    return bad


def test_markdown_links_resolve():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "data").rglob("*.md"))]
    bad = [b for f in files for b in broken_links(f)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_files_named_by_the_product_exist():
    bad = [b for f in sorted((ROOT / "mathrl").rglob("*.py")) for b in broken_py_refs(f)]
    assert not bad, "the product names files that are not in the repo:\n" + "\n".join(bad)


def test_the_checks_find_broken_links(tmp_path):
    """Negative control: a missing file, a missing heading and a missing doc named in Python are found."""
    md = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Real heading\n")
    md.write_text("see [x](missing.md), [y](b.md#real-heading), [z](b.md#nope), [w](https://example.org)\n"
                  "```\n[not a link](nowhere.md)\n```\n")
    bad = broken_links(md, tmp_path)
    py = tmp_path / "m.py"
    py.write_text('"""see DESIGN.md and docs/architecture.md; writes report.md"""\n')
    refs = broken_py_refs(py, tmp_path)
    assert len(bad) == 2 and "missing.md" in bad[0] and "#nope" in bad[1]
    assert len(refs) == 2 and "DESIGN.md" in refs[0] and "docs/architecture.md" in refs[1]


def test_architecture_records_are_where_the_doc_says():
    """docs/architecture.md's table of records names, for each, the file that defines it."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text.split("## The records that flow", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| `([\w/]+\.py)` \|", table, flags=re.M)
    assert len(rows) >= 8, rows
    wrong = [f"{name} in {path}" for name, path in rows
             if not re.search(rf"^class {name}\b", (ROOT / "mathrl" / path).read_text(encoding="utf-8"), re.M)]
    assert not wrong, f"docs/architecture.md places records where they are not defined: {wrong}"
