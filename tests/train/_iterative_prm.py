"""Worker for tests/train/test_iterative_prm.py: iterative GRPO+PS of the digit model at world size 2 (ZeRO-2),
a PRM round after every step. Rank 1 keeps only its first 3 records of each round (as a rank whose responses were
mostly empty would), so the ranks hold uneven PRM data. After the run every rank writes the sum of its PRM's
parameters to ``<output_dir>/prm_rank<r>.json``: data-parallel training must leave the same PRM on both.

Usage: torchrun --nproc_per_node 2 _iterative_prm.py MODEL_DIR PRM_DIR OUTPUT_DIR [override ...]
"""

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

import mathrl.prm.iterative as iterative  # noqa: E402
from mathrl.config import load_config  # noqa: E402
from mathrl.testing.digits import FIRST_DIGIT, digit_problems  # noqa: E402


def main() -> None:
    model_dir, prm_dir, out, *extra = sys.argv[1:]
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", 0))
    real_fit = iterative.fit_prm

    def uneven(engine, records, **kw):
        return real_fit(engine, records[:3] if rank == 1 else records, **kw)

    iterative.fit_prm = uneven
    seen = {}
    real_after = iterative.ProcessRLMethod.after_step

    def after_step(self, trainer, metrics):
        real_after(self, trainer, metrics)
        seen["prm"] = trainer.models.prm

    iterative.ProcessRLMethod.after_step = after_step
    cfg = load_config(None, [f"model.name={model_dir}", "rollout.backend=hf", "rollout.max_tokens=4", "rollout.n=4",
                             "train.batch_size=4", "train.lr=1e-2", "algo.kl_coef=0.04", "data.template=chat_boxed",
                             f"train.output_dir={out}", FIRST_DIGIT, "logging.tensorboard=false",
                             "logging.console=plain", "deepspeed.zero_stage=2", "train.steps=2",
                             "algo.advantage=grpo_ps", f"model.prm={prm_dir}", "algo.prm_update_every=1",
                             "algo.ref_update_every=1", "algo.prm_batch=2", "algo.prm_lr=0.05", *extra])
    assert iterative.run(cfg, problems=digit_problems(8)) == 0
    module = getattr(seen["prm"], "module", seen["prm"])
    with open(os.path.join(out, f"prm_rank{rank}.json"), "w") as fh:
        json.dump({n: float(p.detach().double().sum()) for n, p in module.named_parameters()}, fh)


if __name__ == "__main__":
    main()
