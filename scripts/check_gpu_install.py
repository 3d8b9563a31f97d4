#!/usr/bin/env python3
"""Check that the GPU install (``pip install -e ".[gpu]"``, ``make demo GPU=1``) resolves, without a GPU.

``pyproject.toml``'s ``gpu`` extra pins torch, vLLM, transformers and DeepSpeed to versions that install
together (vLLM pins torch exactly and caps transformers). This asks pip to resolve mathrl's dependencies,
the ``gpu`` and ``dev`` extras, for a Linux x86_64 GPU machine (CPython 3.12 and glibc 2.35 by default,
i.e. Ubuntu 22.04 / the CUDA images) with ``pip install --dry-run --report``: nothing is installed.
``--use-feature=fast-deps`` makes pip read each wheel's metadata with HTTP range requests: without it,
an index that does not serve PEP 658 metadata files makes pip download every wheel in full (torch,
vLLM, triton and the CUDA libraries: 4.5 GB written to the temporary folder, measured; one CI run
failed on an interrupted 555 MB download), and with it the same 231 packages resolve from about
140 MB of reads. DeepSpeed is published as a source archive only, so
its declared requirements are read from the archive's ``PKG-INFO`` and resolved with the rest.

It fails (exit 1, one line per problem) when the set does not resolve, when pip picks another version
than a pin, or when a resolved engine is older than ``mathrl/versions.py`` needs; otherwise it prints the
resolved engines as a table. CI runs it (tests/unit/test_gpu_install.py).

Usage: python scripts/check_gpu_install.py [--python-version 3.12] [--glibc 2.35] [--report FILE] [--pyproject F]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
ENGINES = ("torch", "vllm", "transformers", "deepspeed", "triton", "tokenizers", "flashinfer-python", "numpy")


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~\[;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def project_requirements(extras: tuple[str, ...]) -> list[str]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    # an exact pin of the gpu extra replaces the base floor of the same package
    pinned = {_name(r) for r in project["optional-dependencies"]["gpu"]}
    return [r for r in reqs if _name(r) not in pinned] + list(project["optional-dependencies"]["gpu"])


def pins() -> dict[str, str]:
    try:
        import tomllib
    except ImportError:
        import tomli as tomllib
    gpu = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["gpu"]
    out = {}
    for r in gpu:
        name, _, version = r.partition("==")
        if not version:
            raise SystemExit(f"pyproject.toml: gpu extra entry {r!r} is not an exact pin (name==version)")
        out[_name(name)] = version.strip()
    return out


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def sdist_requirements(name: str, version: str, tmp: Path) -> list[str]:
    """Requires-Dist (no extras) of a source-only package, read from its archive's PKG-INFO."""
    res = pip("download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation", "-q", "-d", str(tmp),
              f"{name}=={version}")
    archives = sorted(tmp.glob(f"{name}-{version}.tar.gz"))
    if not archives:
        raise SystemExit(f"cannot download the {name}=={version} source archive: {res.stderr.strip()[-500:]}")
    with tarfile.open(archives[0]) as tf:
        member = next(m for m in tf.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
        text = tf.extractfile(member).read().decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]


def platforms(glibc: str) -> list[str]:
    major, minor = (int(x) for x in glibc.split("."))
    tags = [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 4, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def main(argv: list[str] | None = None) -> int:
    global PYPROJECT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python-version", default="3.12")
    ap.add_argument("--glibc", default="2.35")
    ap.add_argument("--report", help="also write pip's JSON report here")
    ap.add_argument("--pyproject", default=str(PYPROJECT), help="the pyproject.toml to check (tests: a mutated copy)")
    args = ap.parse_args(argv)
    PYPROJECT = Path(args.pyproject)

    want = pins()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        reqs = [r for r in project_requirements(("dev",)) if _name(r) != "deepspeed"]
        reqs += sdist_requirements("deepspeed", want["deepspeed"], tmp)
        report = Path(args.report) if args.report else tmp / "report.json"
        plat = [a for p in platforms(args.glibc) for a in ("--platform", p)]
        py = args.python_version.replace(".", "")
        target = [*plat, "--python-version", args.python_version, "--implementation", "cp", "--abi", f"cp{py}",
                  "--abi", "abi3", "--abi", "none", "--only-binary=:all:"]
        dry_run = ["install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), *target, *reqs]
        res = pip(*dry_run, "--use-feature=fast-deps")
        if res.returncode != 0 and "fast-deps" in res.stderr and "invalid choice" in res.stderr:  # a pip without it
            res = pip(*dry_run)
        if res.returncode != 0:
            lines = [ln for ln in res.stderr.splitlines() if "is ignored" not in ln and "fast-deps" not in ln]
            print("check_gpu_install: the GPU set does not resolve (pyproject.toml extra 'gpu'):\n"
                  + "\n".join(lines[-15:]), file=sys.stderr)
            return 1
        resolved = {_name(i["metadata"]["name"]): i["metadata"]["version"]
                    for i in json.loads(report.read_text())["install"]}
    resolved["deepspeed"] = want["deepspeed"]  # the source archive, installed as pinned
    problems = [f"{n}: pinned {v} but pip resolved {resolved.get(n)}" for n, v in want.items()
                if resolved.get(n) != v]
    sys.path.insert(0, str(ROOT))
    from mathrl.versions import MINIMUM, parse_version

    problems += [f"{n} {resolved[n]} is older than mathrl needs ({n}>={floor}, mathrl/versions.py)"
                 for n, floor in MINIMUM.items() if n in resolved and parse_version(resolved[n]) < parse_version(floor)]
    print(f"GPU install (pip install -e '.[gpu]'), resolved for CPython {args.python_version}, "
          f"glibc {args.glibc}, x86_64: {len(resolved)} packages")
    print("| package | version |\n|---|---|")
    for n in ENGINES:
        if n in resolved:
            print(f"| {n} | {resolved[n]} |")
    for p in problems:
        print(f"check_gpu_install: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
