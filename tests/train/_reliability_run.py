"""A training run in its own process, for the reliability tests (kills, write failures, leaks).

Usage: python _reliability_run.py TASK MODEL_DIR OUT [key=value ...]
TASK: ``digit`` (custom problems and reward: deterministic and fast) or ``verifier`` (the demo
recipe's synthetic problems; each response, wrapped in \boxed{}, is graded by the real verifier
worker pool -- the tiny random model's text never takes the verifier's in-process fast path). Faults come from MATHRL_FAULT (:func:`mathrl.testing.faults.install`).
Exit status: 0 done, 3 TrainingError (message on stderr), 4 CheckpointError.
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from mathrl.config import load_config  # noqa: E402
from mathrl.testing import faults  # noqa: E402
from mathrl.train import checkpoint as ckpt  # noqa: E402
from mathrl.train.checkpoint import TrainingError  # noqa: E402
from mathrl.train.loop import run  # noqa: E402


def main() -> int:
    task, model_dir, out, *extra = sys.argv[1:]
    faults.install()  # MATHRL_FAULT's faults, wrapped around the product's functions
    torch.set_num_threads(1)
    common = [f"model.name={model_dir}", "rollout.backend=hf", f"train.output_dir={out}", "logging.tensorboard=false",
              "logging.console=plain", "train.resume=auto"]
    try:
        if task == "digit":
            from _train_tasks import FIRST_DIGIT, digit_problems

            cfg = load_config(None, [*common, "rollout.max_tokens=5", "rollout.n=4", "train.batch_size=4",
                                     "train.lr=1e-2", "algo.kl_coef=0.04", "data.template=chat_boxed",
                                     "train.micro_batch_tokens=16", FIRST_DIGIT, *extra])
            return run(cfg, problems=digit_problems())
        from mathrl.reward import grade_batch
        from mathrl.reward.rewards import register_reward

        @register_reward("boxed_verifier", needs_grades=False)
        def boxed_verifier(ctx):  # every response goes through the worker pool
            grades = grade_batch([f"\\boxed{{{r}}}" for r in ctx.responses], ctx.golds, workers=2,
                                 truncated=ctx.truncated)
            return [float(g.correct) for g in grades]

        cfg = load_config("configs/demo.yaml", [*common, "rollout.max_tokens=4", "rollout.n=2", "train.batch_size=2",
                                                "data.eval_limit=1", "eval.n=1", "eval.k=1", "eval.max_tokens=4",
                                                "reward.workers=2", "reward.function=correctness",
                                                "reward.terms={boxed_verifier: {}}", *extra])
        return run(cfg, problems=None)
    except TrainingError as exc:
        print(f"TrainingError: {exc}", file=sys.stderr, flush=True)
        return 3
    except ckpt.CheckpointError as exc:
        print(f"CheckpointError: {exc}", file=sys.stderr, flush=True)
        return 4


if __name__ == "__main__":
    sys.exit(main())
