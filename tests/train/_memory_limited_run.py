"""A one-step GRPO run of SmolLM2 on the demo task under an address-space limit (``RLIMIT_AS``), for
tests/train/test_memory.py.

Usage: python _memory_limited_run.py LIMIT_GB OUT fit|nofit [override ...]
``nofit`` replaces the memory fit with one that takes ``train.micro_batch_tokens`` as asked (the negative
control: ``auto``'s 8192, or the number given, whatever the limit). Exit status: 0 done, 3 TrainingError
(message on stderr), 1 anything else.
"""

import os
import resource
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "2")


def main() -> int:
    limit_gb, out, mode, *extra = sys.argv[1:]
    import torch

    import mathrl.train.loop as loop
    import mathrl.train.trainer as trainer_mod
    from mathrl.config import load_config
    from mathrl.models import ensure_embedded_model
    from mathrl.train.checkpoint import TrainingError
    from mathrl.train.memory import token_cap

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    model = ensure_embedded_model()
    if mode == "nofit":  # train.micro_batch_tokens=auto taken as its upper value, 8192, whatever the memory
        def nofit(cfg, *_args, **_kwargs):
            cfg.train.micro_batch_tokens = token_cap(cfg.train.micro_batch_tokens)
            return {}

        trainer_mod.fit_micro_batches = nofit
    cfg = load_config("configs/demo.yaml", [
        f"model.name={model}", "rollout.backend=hf", "train.steps=1", f"train.output_dir={out}",
        "data.eval_limit=1", "eval.n=1", "eval.k=1", "eval.max_tokens=4", "eval.greedy=false",
        "logging.tensorboard=false", "logging.console=plain", "reward.workers=1", *extra])
    limit = int(float(limit_gb) * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # after the imports: the limit is on the run
    try:
        return loop.run(cfg)
    except TrainingError as exc:
        print(f"TrainingError: {exc}", file=sys.stderr, flush=True)
        return 3


if __name__ == "__main__":
    sys.exit(main())
