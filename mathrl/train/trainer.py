"""One training run, whatever the method: :class:`Trainer` (set up, step, save, evaluate, close).

The trainer owns everything a run guarantees apart from its update rule:

* start-up: version and input checks, the process group, the run folder and its ``config.yaml``
  (:func:`mathrl.train.setup.prepare_run`), the models (:func:`mathrl.train.models.build_models`),
  the rollout engine, its context length;
* resume: the checkpoint named by ``train.resume`` restored into models and state, the metrics log
  truncated to its step (:func:`mathrl.train.setup.resume_and_log`);
* the memory fit: ``train.micro_batch_tokens: auto`` decided from the free memory before the first step (the
  checkpoint's budget kept on resume), a pinned number kept or the run stopped before training
  (:func:`mathrl.train.memory.fit_micro_batches`);
* the record of what ran: once the settings are decided, the run folder's ``config.yaml`` names each decided
  setting (every ``auto``, the micro-batch budget, the rollout context) with its value and holds the budget used,
  so a rerun from it splits micro-batches alike (:func:`mathrl.train.setup.record_config`; :attr:`Trainer.decided`);
* checkpoints every ``train.save_every`` steps, every ``train.save_every_minutes`` minutes and at the end
  (:func:`mathrl.train.checkpoint.checkpoint_due`);
* held-out evaluation before training, every ``eval.every`` steps and at the end, and the report;
* the stop on ``train.max_bad_steps`` consecutive NaN/inf steps, after saving the weights of the last
  good step.

A method plugs in one step (:class:`Method`): the RL step (:class:`mathrl.train.loop.RLMethod`, GRPO,
PPO and their relatives) and the RFT/online-RFT step (:class:`mathrl.ablate.methods.RFTMethod`).
``mathrl train``, the ablation study and ``scripts/bench_vs_trl.py`` all run through this class::

    trainer = Trainer(cfg, RLMethod())
    trainer.fit()                  # set up, evaluate, step until train.steps, save, evaluate, close

or step by step (the benchmark times each step itself)::

    trainer.setup()
    try:
        metrics = trainer.step()   # one step, logged, saved and evaluated when due
    finally:
        trainer.close()
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from mathrl.algo.filtering import PassRateFilter
from mathrl.config import Config, auto
from mathrl.data.splits import heldout_problems, load_training_problems
from mathrl.rollout.colocate import fall_asleep
from mathrl.dist.checkpoint_io import list_checkpoints, step_dirname
from mathrl.train.checkpoint import State, TrainingError, checkpoint_due, save_checkpoint
from mathrl.dist.collectives import DistInfo
from mathrl.train.memory import fit_micro_batches, size_rollout_context
from mathrl.train.metrics import MetricsLogger, process_stats
from mathrl.train.models import Models, build_models, generation_weights, make_rollout, sync_weights
from mathrl.train.preflight import longest_prompt
from mathrl.train.report import evaluate, main_only, write_report
from mathrl.train.setup import prepare_run, record_config, resume_and_log

__all__ = ["Method", "Trainer", "warn"]


def warn(dist: DistInfo, msg: str) -> None:
    """A one-line ``mathrl: warning:`` on stderr, from the main rank only."""
    if dist.is_main:
        print(f"mathrl: warning: {msg}", file=sys.stderr, flush=True)


class Method:
    """The update rule of a training method: what one step does. Everything else is the trainer's.
    A method overrides :meth:`step` and whichever of the other hooks it needs (they do nothing here)."""

    def warnings(self, cfg: Config) -> list[str]:
        """Settings that have no effect with this method (printed once, before any expensive work)."""
        return []

    def needs_reference(self, cfg: Config) -> bool:
        """Whether the run loads a reference model (``models.ref``): by default when the KL to it is on
        (``algo.kl_coef > 0``); a method whose update compares with the initial policy says so here."""
        return cfg.algo.kl_coef > 0

    def start(self, trainer: Trainer) -> None:
        """Called once the models, the rollout engine, the memory fit and the first weight sync are done
        (and the state restored on resume), before the first step."""

    def step(self, trainer: Trainer) -> dict[str, Any]:
        """Step ``trainer.state.step + 1``: its metrics, with ``bad_step`` = 1.0 when the update was
        skipped for NaN/inf (and ``bad_reason`` saying where). The trainer counts the step afterwards."""
        raise NotImplementedError

    def after_step(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        """After the step was counted (``trainer.state.step`` is the step just made), before it is logged."""

    def close(self) -> None:
        """Release what :meth:`start` made (threads, engines), also after an error."""


class Trainer:
    """One run of ``cfg`` with ``method`` into ``cfg.train.output_dir`` (see the module docstring).

    ``problems``: the training problems (default: from ``data.*``). A caller that brings its own task brings
    its held-out problems too (``eval_problems``); without them such a run evaluates nothing."""

    def __init__(self, cfg: Config, method: Method, *, problems: list | None = None,
                 eval_problems: list | None = None) -> None:
        self.cfg, self.method = cfg, method
        self._problems, self._eval_problems = problems, eval_problems
        self.dist: DistInfo
        self.out: Path
        self.problems: list = []
        self.eval_problems: list = []
        self.models: Models
        self.resolved: auto.Resolved  # every "auto" of the config, decided (setup)
        self.decided: dict[str, tuple[Any, Any]] = {}  # key -> (given, used): what setup decided (config.yaml)
        self.state = State(pass_filter=PassRateFilter(window=cfg.algo.pass_rate_filter))
        self.resume_from: Path | None = None
        self.logger: MetricsLogger | None = None
        self.rollout: Any = None
        self.memory_stats: dict[str, float] = {}
        self._last_save = time.monotonic()
        self._last_eval: tuple[int, dict] = (-1, {})

    # ------------------------------------------------------------------ set up
    def setup(self) -> None:
        """Start-up, models, resume, the rollout engine, the memory fit, the first weight sync, the method's
        start. On an error after the engine started, everything started is closed again."""
        cfg = self.cfg
        t = cfg.train
        dist, out = prepare_run(cfg)
        self.dist, self.out = dist, out
        custom_task = self._problems is not None
        self.problems = self._problems if custom_task else load_training_problems(cfg)
        if self._eval_problems is not None:
            self.eval_problems = list(self._eval_problems)
        elif not custom_task:
            self.eval_problems = heldout_problems(cfg)[1]  # every rank evaluates its share (see evaluate)
        if self.eval_problems and cfg.rollout.tensor_parallel_size > 1:
            # the ranks of a tensor-parallel group must make the same number of generate calls, which the
            # chunk split across ranks does not guarantee
            warn(dist, "held-out evaluation is off with rollout.tensor_parallel_size > 1; evaluate the saved "
                       "checkpoints with `mathrl eval`")
            self.eval_problems = []
        for msg in self.method.warnings(cfg):
            warn(dist, msg)
        # every "auto" of the config decided for this machine (model.autocast's line, with its reason, comes
        # from the models' start-up)
        self.resolved = auto.resolve(cfg)
        decided = {k: v for k, v in self.resolved.changed(cfg).items() if k != "model.autocast"}
        if decided and dist.is_main:
            print("mathrl: auto settings: " + ", ".join(f"{k} -> {v}" for k, v in decided.items()), flush=True)
        self.models = models = build_models(cfg, dist, cfg.train.steps,
                                            reference=self.method.needs_reference(cfg))
        self.resume_from, self.logger = resume_and_log(cfg, dist, self.out, models, self.state)
        # vLLM's context: what this run's prompts and max tokens need, unless rollout.max_model_len is set (vLLM's
        # default, the model's whole context, would reserve KV cache for sequences the run never forms)
        given = {"rollout.max_model_len": cfg.rollout.max_model_len, "train.micro_batch_tokens": t.micro_batch_tokens}
        size_rollout_context(cfg, models.tokenizer, self.problems, self.eval_problems, models.model_path)
        try:
            self.rollout = make_rollout(cfg, models)
            # micro-batches sized to the free memory (after the engine took its share; with
            # rollout.sleep_between_steps while it sleeps, so the update gets what sleeping frees), kept across a
            # resume; then the first sync
            prompt_len = longest_prompt(cfg, models.tokenizer, self.problems, cfg.data.system_prompt)[0]
            fall_asleep(self.rollout)
            self.memory_stats = fit_micro_batches(cfg, dist, models, prompt_len, resumed=self.state.micro_batch_tokens)
            self.state.micro_batch_tokens = t.micro_batch_tokens
            # the run folder records what runs: a rerun from its config.yaml splits micro-batches the same way
            used = {"rollout.max_model_len": cfg.rollout.max_model_len,
                    "train.micro_batch_tokens": t.micro_batch_tokens}
            self.decided = {**{k: ("auto", v) for k, v in self.resolved.changed(cfg).items()},
                            **{k: (given[k], v) for k, v in used.items() if given[k] != v}}
            record_config(cfg, dist, out, self.decided)
            sync_weights(self.rollout, models.policy)
            self.method.start(self)
        except BaseException:
            self.close()
            raise
        self._last_save = time.monotonic()

    # ------------------------------------------------------------------ one step
    def step(self) -> dict[str, Any]:
        """One step of the method; counted, logged, then the NaN stop, the checkpoint and the evaluation when
        due. Returns the step's metrics (as logged)."""
        cfg, state = self.cfg, self.state
        metrics = self.method.step(self)
        state.step += 1
        state.bad_steps = state.bad_steps + 1 if metrics["bad_step"] else 0
        self.method.after_step(self, metrics)
        metrics.update(process_stats())
        metrics.update(self.memory_stats)
        metrics["checkpoint/failures"] = float(state.save_failures)
        assert self.logger is not None
        self.logger.log(state.step, metrics)
        if state.bad_steps >= cfg.train.max_bad_steps:
            # skipped steps left the weights as they were after the last good step: save them
            n = state.bad_steps
            self.save(final=True)
            saved = list_checkpoints(self.out)[-1][1]
            raise TrainingError(f"step {state.step}: {n} consecutive steps had NaN/inf and were skipped (last one: "
                                f"{metrics.get('bad_reason', 'on another rank')}); the weights are those of step "
                                f"{state.step - n}, saved in {saved}. Lower train.lr or check the reward function "
                                "and data, then resume with --resume auto")
        if checkpoint_due(cfg, state.step, self._last_save):
            self.save()
        if cfg.eval.every and state.step % cfg.eval.every == 0 and self.eval_problems:
            self._last_eval = (state.step, self.evaluate())
        return metrics

    def save(self, *, final: bool = False) -> Path | None:
        """Checkpoint the current step (see :func:`mathrl.train.checkpoint.save_checkpoint`)."""
        path = save_checkpoint(self.cfg, self.dist, self.models, self.state, final=final)
        self._last_save = time.monotonic()
        return path

    def evaluate(self) -> dict:
        """Held-out evaluation of the current weights (every rank its share), kept in
        ``eval/step_<N>/`` and logged as an ``eval`` event; {} without held-out problems."""
        if not self.eval_problems:
            return {}
        with generation_weights(self.rollout, self.models.policy):  # ZeRO-3 + hf engine: gathered on every rank
            result = evaluate(self.rollout, self.eval_problems, self.cfg, dist=self.dist,
                              out_dir=main_only(self.dist, self.out / "eval" / step_dirname(self.state.step)))
        assert self.logger is not None
        self.logger.log(self.state.step, result, event="eval")
        return result

    def close(self) -> None:
        """Close the log, the method's resources and the rollout engine (each once; safe after an error)."""
        if self.logger is not None:
            self.logger.close()
            self.logger = None
        try:
            self.method.close()
        finally:
            if self.rollout is not None:
                self.rollout.close()
                self.rollout = None

    # ------------------------------------------------------------------ the whole run
    def fit(self) -> int:
        """Set up, evaluate (at step 0), step until ``train.steps``, save the last step, evaluate it, write
        the report, close. Returns the exit code (0)."""
        self.setup()
        try:
            before: dict = {}
            if self.eval_problems and self.state.step == 0:
                before = self.evaluate()
            while self.state.step < self.cfg.train.steps:
                self.step()
            saved = list_checkpoints(self.out)
            if not saved or saved[-1][0] != self.state.step:
                self.save(final=True)
            # the periodic evaluation of the last step is the final one
            after = self._last_eval[1] if self._last_eval[0] == self.state.step else self.evaluate()
            if self.dist.is_main:
                write_report(self.out, before, after)
        finally:
            self.close()
        return 0
