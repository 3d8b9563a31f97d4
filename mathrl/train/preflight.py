"""Cheap checks of a training run's inputs, before any expensive work starts.

A training run can be hours of GPU time, and a bad input found after DeepSpeed has
started and the weights have loaded costs minutes per attempt; found in the middle
of a run it costs the run. :func:`preflight` runs first in
:func:`mathrl.train.setup.prepare_run` -- before the process group, DeepSpeed and
any model weights -- and reads only small files:

1. the DeepSpeed JSON (``deepspeed.config_path``): valid JSON, batch sizes that
   multiply out for this world size (:func:`mathrl.dist.ds_json.check_batch_sizes`);
2. the model specs (``model.name``, and ``model.ref_model`` / ``model.critic_model``
   when they are used): an existing folder with ``config.json``, ``embedded``, or a
   hub id;
3. the problem files: every training row (and the held-out rows) mapped to a
   problem, so a truncated file, wrong field names, empty or non-numeric golds are
   reported with file and line now rather than after start-up;
4. the tokenizer: loaded (it is small), and when ``data.template`` is a chat
   template the tokenizer must have one;
5. the context: the model's ``config.json`` gives its context length
   (``max_position_embeddings``); the longest rendered prompt plus
   ``rollout.max_tokens`` (training) and ``eval.max_tokens`` (held-out) must fit.

Each failure is one line naming the file and line or the config key, and the fix:
:class:`mathrl.config.ConfigError` for a setting, :class:`mathrl.data.DataError`
for a data file, :class:`mathrl.models.ModelError` for a model. ``mathrl train``
prints it and exits with status 2.

Every rank runs the same checks (they read only), so all ranks fail alike instead
of some waiting for the others at the process group's rendezvous.

The rules about combinations of settings (refusals and warnings) are not here: they are all in
:mod:`mathrl.config.rules`; this module checks the inputs those settings point at.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from mathrl.config import Config, ConfigError
from mathrl.algo.advantages import get_estimator_spec
from mathrl.data import DataError, get_template
from mathrl.data.splits import heldout_problems, load_training_problems
from mathrl.dist.ds_json import check_batch_sizes, read_ds_json
from mathrl.models import ModelError, load_tokenizer, resolve_model_path
from mathrl.models.loading import one_line

#: Problems whose prompts are tokenised exactly for the context check: all of them up to this
#: count, else this many with the longest questions (the template adds the same text to each).
PROMPT_CANDIDATES = 256

#: config.json keys that hold a model's context length, in the order transformers' models use them.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def preflight(cfg: Config) -> None:
    """Check ``cfg``'s inputs cheaply (no process group, no DeepSpeed, no weights); raise on the first problem.

    Raises:
        ConfigError: a setting: DeepSpeed JSON, prompt template, max_tokens longer than the context.
        DataError: a data file: unreadable, truncated, a row that cannot be mapped to a problem.
        ModelError: a model path that does not exist, a tokenizer that cannot be loaded.
    """
    check_deepspeed_json(cfg, world_size())
    check_vllm_available(cfg)
    model_path = check_model_specs(cfg)
    problems = check_training_data(cfg)
    eval_problems = check_eval_data(cfg)
    tokenizer = load_checked_tokenizer(cfg, model_path)
    check_template(cfg, tokenizer, model_path)
    context, where = context_length(cfg, model_path)
    if context is None:
        return
    check_context(cfg, tokenizer, problems, context, where, key="rollout.max_tokens",
                  max_tokens=cfg.rollout.max_tokens, what="training", system=None)
    if eval_problems:
        check_context(cfg, tokenizer, eval_problems, context, where, key="eval.max_tokens",
                      max_tokens=cfg.eval.max_tokens, what="held-out", system=cfg.data.system_prompt)


def check_vllm_available(cfg: Config) -> None:
    """``rollout.backend=vllm`` needs vLLM here or a worker interpreter (``rollout.vllm_python``,
    ``$MATHRL_VLLM_PYTHON``, ``.venv-vllm``); checked by the files alone (no import), before anything loads."""
    from mathrl.rollout.vllm import default_vllm_python, vllm_importable  # here: looked up at call time, tests stand in for rollout.vllm.vllm_importable/default_vllm_python

    r = cfg.rollout
    if r.backend != "vllm":
        return
    fix = ("build it with `make vllm-env` (README: vLLM), or set rollout.backend=hf to sample with transformers "
           "(slower, nothing to install)")
    if r.vllm_python not in (None, "inprocess"):
        if not os.path.exists(r.vllm_python):
            raise ConfigError(f"rollout.vllm_python={r.vllm_python}: no such interpreter; {fix}")
        return
    if vllm_importable():
        return
    if r.vllm_python == "inprocess":
        raise ConfigError(f"rollout.vllm_python=inprocess: vllm is not installed in this environment ({sys.executable}); "
                          "install it here (on a GPU: pip install -e '.[gpu]'), or set rollout.backend=hf")
    if default_vllm_python() is None:
        raise ConfigError("rollout.backend=vllm: vllm is not installed in this environment and there is no worker "
                          f"environment (.venv-vllm, $MATHRL_VLLM_PYTHON or rollout.vllm_python); {fix}")


def world_size() -> int:
    """The number of training processes as the launcher announced it (``WORLD_SIZE``; 1 when run plainly)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


# --------------------------------------------------------------------------- DeepSpeed JSON


def check_deepspeed_json(cfg: Config, world: int) -> None:
    """``deepspeed.config_path``: readable JSON whose batch sizes multiply out for ``world`` processes."""

    path = cfg.deepspeed.config_path
    if path is None:
        return
    ds = read_ds_json(path)
    check_batch_sizes(ds, world, path)


# --------------------------------------------------------------------------- models


def _resolve(key: str, spec: str, cache_dir: str | None) -> str:

    return resolve_model_path(spec, cache_dir, key=key)


def check_model_specs(cfg: Config) -> str:
    """Resolve ``model.name`` (and the reference / critic specs the run will load); returns the policy's path.

    Only names and folders are checked here (``config.json`` present); nothing is loaded.
    """

    m = cfg.model
    path = _resolve("model.name", m.name, m.cache_dir)
    if m.ref_model and cfg.algo.kl_coef > 0:
        _resolve("model.ref_model", m.ref_model, m.cache_dir)
    if m.critic_model and get_estimator_spec(cfg.advantage).needs_critic:
        _resolve("model.critic_model", m.critic_model, m.cache_dir)
    if m.prm and not Path(m.prm, "backbone.safetensors").is_file():  # checked here, not by the config rules: a
        # study trains its initial PRM (study.prm) into a folder its run configs name before it exists
        raise ConfigError(f"model.prm = {m.prm!r}: not a process reward model folder written by `mathrl prm train` "
                          "(no backbone.safetensors in it)")
    return path


def load_checked_tokenizer(cfg: Config, model_path: str):
    """The policy's tokenizer (small; no weights), with ``model.name`` in any error."""

    try:
        return load_tokenizer(model_path)
    except ModelError as exc:
        raise ModelError(f"model.name = {cfg.model.name!r}: {exc}") from None


def context_length(cfg: Config, model_path: str) -> tuple[int | None, str]:
    """The model's context length from its ``config.json`` (no weights), and where it was read.

    A local folder's ``config.json`` is read directly; a hub id goes through
    ``AutoConfig`` (the config file only). Multimodal configs keep the language
    model's settings under ``text_config``. ``(None, "")`` when no key is present.
    """
    local = Path(model_path) / "config.json"
    if local.is_file():
        try:
            data = json.loads(local.read_text())
        except ValueError as exc:

            raise ModelError(f"model.name = {cfg.model.name!r}: {local}:{exc.lineno}: invalid JSON ({exc.msg}); "
                             "the model folder is damaged: save or download it again") from None
        source = str(local)
    else:
        from transformers import AutoConfig


        try:
            data = AutoConfig.from_pretrained(model_path).to_dict()
        except Exception as exc:

            raise ModelError(f"model.name = {cfg.model.name!r}: cannot read its config ({type(exc).__name__}: "
                             f"{one_line(exc)})") from None
        source = f"{model_path}/config.json"
    for section in (data, data.get("text_config") or {}):
        for key in CONTEXT_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, f"{key} = {value} in {source}"
    return None, ""


# --------------------------------------------------------------------------- data


@contextmanager
def _quiet_data_log() -> Iterator[None]:
    """The trainer loads the problems again after the checks; log skipped rows once, there."""
    log = logging.getLogger("mathrl.data")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def check_training_data(cfg: Config) -> list:
    """Load the training problems exactly as the trainer will (every row of a local file is mapped)."""

    with _quiet_data_log():
        return load_training_problems(cfg)


def check_eval_data(cfg: Config) -> list:
    """Load the held-out problems of the before/after evaluation (``data.eval_*``)."""

    with _quiet_data_log():
        return heldout_problems(cfg)[1]


# --------------------------------------------------------------------------- prompts


def _template(cfg: Config, system: str | None):

    try:
        return get_template(cfg.data.template, system=system)
    except DataError as exc:
        key = "data.system_prompt" if "system prompt" in str(exc) else "data.template"
        value = cfg.data.system_prompt if key == "data.system_prompt" else cfg.data.template
        raise ConfigError(f"{key} = {value!r}: {exc}") from None


def check_template(cfg: Config, tokenizer: Any, model_path: str) -> None:
    """A chat ``data.template`` needs a tokenizer with a chat template (base models have none)."""
    tpl = _template(cfg, cfg.data.system_prompt)
    if not tpl.chat or getattr(tokenizer, "chat_template", None):
        return
    where = Path(model_path)
    files = (f"no chat_template in {where / 'tokenizer_config.json'} and no {where / 'chat_template.jinja'}"
             if where.is_dir() else "its tokenizer_config.json has no chat_template")
    raise ConfigError(
        f"data.template = {cfg.data.template!r} renders prompts with the model's chat template, but the "
        f"tokenizer of model.name = {cfg.model.name!r} has none ({files}: a base model?); fix: set "
        "data.template=fewshot_plain (plain few-shot prompts for base models), or use an instruct/chat model")


def _candidates(problems: Sequence) -> list:
    if len(problems) <= PROMPT_CANDIDATES:
        return list(problems)
    return sorted(problems, key=lambda p: len(p.question), reverse=True)[:PROMPT_CANDIDATES]


def longest_prompt(cfg: Config, tokenizer: Any, problems: Sequence, system: str | None) -> tuple[int, Any]:
    """(tokens, problem) of the longest rendered prompt, tokenised as the rollout engines do.

    With more than :data:`PROMPT_CANDIDATES` problems only that many with the longest
    questions are rendered: the template adds the same text to every question, so
    these hold the longest prompt unless a shorter question packs many more tokens
    per character (the check is then a lower bound; vLLM still refuses a prompt
    longer than the context at generation time).
    """
    tpl = _template(cfg, system)
    cands = _candidates(problems)
    texts = tpl.render_batch(cands, tokenizer)
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    n, i = max((len(x), i) for i, x in enumerate(ids))
    return n, cands[i]


def check_context(cfg: Config, tokenizer: Any, problems: Sequence, context: int, where: str, *, key: str,
                  max_tokens: int, what: str, system: str | None) -> None:
    """The longest prompt of ``problems`` plus ``max_tokens`` new tokens must fit the model's context.

    Beyond the context a rotary-position model keeps generating from positions it
    was never trained on and vLLM cuts the response at its ``max_model_len``: both
    silently change what is trained or measured, so the run is refused instead.
    """
    if not problems:
        return
    longest, problem = longest_prompt(cfg, tokenizer, problems, system)
    if longest + max_tokens <= context:
        return
    loc = problem.meta.get("location") if isinstance(getattr(problem, "meta", None), dict) else None
    at = f"{problem.id}" + (f" at {loc}" if loc else "")
    allowed = context - longest
    if allowed < 1:
        raise ConfigError(
            f"data.template = {cfg.data.template!r}: the longest {what} prompt ({at}) is {longest} tokens, "
            f"which alone fills the context of model.name = {cfg.model.name!r} ({where}); fix: drop such long "
            "problems from the file, use a shorter template (chat_boxed instead of chat_boxed_oneshot), or a model "
            "with a longer context")
    raise ConfigError(
        f"{key} = {max_tokens}: the longest {what} prompt ({at}, {longest} tokens with template "
        f"{cfg.data.template!r}) plus {max_tokens} new tokens is {longest + max_tokens}, more than the context of "
        f"model.name = {cfg.model.name!r} ({where}); fix: set {key}={allowed} or less, or use a model with a "
        "longer context")
