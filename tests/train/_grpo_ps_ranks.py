"""Worker for tests/train/test_grpo_ps.py: GRPO+PS of the digit model on the PRM ``PRM_DIR`` at world size 2 and
the given ZeRO stage (at stage 3 the PRM is a sharded inference engine, as the reference is), 2 steps, every
response logged with its step rewards.

Usage: torchrun --nproc_per_node 2 _grpo_ps_ranks.py MODEL_DIR PRM_DIR OUTPUT_DIR STAGE
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402


def main() -> None:
    model_dir, prm_dir, out, stage = sys.argv[1:5]
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).parent))
    from _train_tasks import digit_cfg, digit_problems

    from mathrl.train import run

    cfg = digit_cfg(model_dir, out, "train.steps=2", "rollout.max_tokens=4", "logging.log_samples=16",
                    "logging.console=plain", f"deepspeed.zero_stage={stage}", "algo.advantage=grpo_ps",
                    f"model.prm={prm_dir}")
    assert run(cfg, problems=digit_problems(8)) == 0


if __name__ == "__main__":
    main()
