"""What an evaluation samples and how it scores it: :class:`EvalSettings` (recorded in every summary)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mathrl.eval.metrics import MAJ_EXACT_SUBSETS, MAJ_RESAMPLES
from mathrl.reward.options import GradeOptions

__all__ = ["EvalSettings"]


@dataclass
class EvalSettings:
    """What is sampled and how it is scored (recorded in every summary).

    Attributes:
        n: samples per problem.
        ks: the k of pass@k and maj@k (each ``<= n``).
        temperature, top_p, top_k, max_tokens: sampling of the n samples.
        greedy: also decode one greedy response per problem (temperature 0).
        seed: base seed; chunk ``j`` samples with seed ``seed + j``.
        template: prompt template name (:mod:`mathrl.data.templates`).
        system_prompt: system message for chat templates (None = model default).
        stop: extra stop strings (the template's own are always added).
        timeout: verifier timeout per response, seconds.
        workers: verifier processes (None = the pool's default).
        rel_tol: relative tolerance for numeric answers (0 = exact); these three
            are :attr:`grading`, the verifier's options.
        chunk_rows: most sampled rows (prompts x n) per engine call; bounds
            memory and gives progress lines. None = 256 for the hf backend (its
            decode step reads every weight once per step, so on a CPU 256 rows
            cost little more than 64) and 4096 for vLLM (which schedules a
            large request list best by itself).
        maj_resamples, maj_exact_subsets: see :func:`mathrl.eval.metrics.maj_at_k`.
        ci_resamples, ci_level: bootstrap confidence intervals over problems.
    """

    n: int = 8
    ks: tuple[int, ...] = (1, 4, 8)
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = -1
    max_tokens: int = 256
    greedy: bool = True
    seed: int = 0
    template: str = "chat_boxed_oneshot"
    system_prompt: str | None = None
    stop: tuple[str, ...] = ()
    timeout: float = 5.0
    workers: int | None = None
    rel_tol: float = 0.0
    chunk_rows: int | None = None
    maj_resamples: int = MAJ_RESAMPLES
    maj_exact_subsets: int = MAJ_EXACT_SUBSETS
    ci_resamples: int = 2000
    ci_level: float = 0.95

    def __post_init__(self) -> None:
        self.ks = tuple(sorted(set(int(k) for k in self.ks)))
        self.stop = tuple(self.stop)
        if self.n < 1:
            raise ValueError(f"n={self.n}: must be >= 1")
        bad = [k for k in self.ks if not 1 <= k <= self.n]
        if bad or not self.ks:
            raise ValueError(f"k={list(self.ks)}: each k must satisfy 1 <= k <= n = {self.n}")

    @classmethod
    def from_config(cls, cfg, *, top_k: int | None = None) -> "EvalSettings":
        """The evaluation settings of a :class:`mathrl.config.Config` (``eval.*``, template, seed, and the
        verifier's :meth:`mathrl.reward.options.GradeOptions.from_config`)."""

        return cls(n=cfg.eval.n, ks=tuple(cfg.eval.k), temperature=cfg.eval.temperature, top_p=cfg.eval.top_p,
                   top_k=-1 if top_k is None else top_k, max_tokens=cfg.eval.max_tokens, greedy=cfg.eval.greedy,
                   seed=cfg.train.seed, template=cfg.data.template, system_prompt=cfg.data.system_prompt,
                   stop=tuple(cfg.rollout.stop), chunk_rows=cfg.eval.chunk_rows,
                   **asdict(GradeOptions.from_config(cfg)))

    @property
    def grading(self) -> GradeOptions:
        """The verifier's options (``timeout``, ``rel_tol``, ``workers``), checked."""

        return GradeOptions(timeout=self.timeout, rel_tol=self.rel_tol, workers=self.workers)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ks"] = list(self.ks)
        d["stop"] = list(self.stop)
        return d
