#!/usr/bin/env bash
# Build the wheelhouse that scripts/gpu_check.sh installs on a GPU machine without network access.
#
# That machine has torch, transformers, accelerate, peft and sympy but no DeepSpeed, no math-verify
# and no network, and at most 64 MiB travel with the working tree. This script (run where PyPI is
# reachable) puts into gpu_wheels/ (git-ignored; name it in the device tool's `carry`):
#
#   * DeepSpeed, the version of .venv, as a pure wheel without prebuilt ops (DS_BUILD_OPS=0), and its
#     small dependencies: hjson, py-cpuinfo, msgpack, ninja, einops, pydantic (+ pydantic_core,
#     annotated-types, typing-inspection, and typing_extensions new enough for pydantic);
#   * math-verify and its parser: latex2sympy2_extended, antlr4-python3-runtime 4.13.2.
#
# Not carried (measured with `python scripts/gpu_check.py --device cpu`, whose env step lists every
# distribution the check imported): datasets/pyarrow (~40 MiB; only the hub/parquet readers use them,
# the check trains on its own problem list), tensorboard (the check turns it off), matplotlib (the
# check skips the reward plot when it is absent), rich, gguf (only the embedded model needs it).
#
# Compiled wheels (msgpack, pydantic_core) are downloaded for every CPython in PY_VERSIONS, since the
# GPU image's Python is not known in advance; pip picks the matching one there.
#
#   bash scripts/gpu_wheelhouse.sh                 # -> gpu_wheels/, prints its size (limit 60 MiB)
#   PY_VERSIONS="3.12" WHEELHOUSE=/tmp/w bash scripts/gpu_wheelhouse.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WH=${WHEELHOUSE:-gpu_wheels}
PY_VERSIONS=${PY_VERSIONS:-"3.10 3.11 3.12 3.13"}
LIMIT_MIB=60

ver() { "$PY" -c "from importlib.metadata import version; print(version('$1'))"; }
DS_VERSION=${DS_VERSION:-$(ver deepspeed)}
PYD_VERSION=$(ver pydantic); PYDC_VERSION=$(ver pydantic_core); MSGPACK_VERSION=$(ver msgpack)

rm -rf "$WH"; mkdir -p "$WH"
echo "gpu_wheelhouse: deepspeed==$DS_VERSION (DS_BUILD_OPS=0, pure wheel)"
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WH" "deepspeed==$DS_VERSION" \
  || DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps -w "$WH" "deepspeed==$DS_VERSION"

# pure-Python wheels (py3-none-any), pinned to what .venv runs
pure=(hjson py-cpuinfo einops annotated-types typing-inspection typing_extensions math-verify latex2sympy2_extended)
specs=()
for p in "${pure[@]}"; do specs+=("$p==$(ver "$p")"); done
specs+=("antlr4-python3-runtime==4.13.2" "pydantic==$PYD_VERSION")
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$WH" "${specs[@]}"
# ninja: one py3-none-manylinux wheel serves every Python
"$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 -d "$WH" \
  "ninja==$(ver ninja)"
# compiled wheels, one per CPython version
for v in $PY_VERSIONS; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --python-version "$v" --implementation cp -d "$WH" \
    "pydantic_core==$PYDC_VERSION" "msgpack==$MSGPACK_VERSION"
done

ls -1 "$WH"
bytes=$(du -sb "$WH" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "gpu_wheelhouse: $(ls "$WH" | wc -l) wheels, $mib MiB in $WH/ (limit $LIMIT_MIB MiB)"
if (( mib > LIMIT_MIB )); then
  echo "gpu_wheelhouse: over $LIMIT_MIB MiB: it would not travel with the working tree" >&2
  exit 1
fi
