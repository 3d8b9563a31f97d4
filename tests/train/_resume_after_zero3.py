"""The first GPU check's resume, on CPU in bfloat16, in a fresh process (for tests/train/test_resume_exact.py).

Usage: python _resume_after_zero3.py MODEL_DIR OUT

In one process, as scripts/gpu_check.py runs them: a GRPO run at ZeRO-2 in bf16 saving every step
(``OUT/full``), then a one-step ZeRO-3 run (``OUT/z3``), then ``OUT/full`` cut back to step 2
(``OUT/part``) and resumed to step 3. The test compares ``part`` with ``full``. A fresh process, so
``full`` runs before any ZeRO-3 model existed in it, whatever the test session ran before.
Exit status 0 when all three runs finished.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> int:
    model, out = sys.argv[1], Path(sys.argv[2])
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).parent))
    from _train_tasks import crash_copy, digit_cfg, digit_problems

    from mathrl.train import run

    common = ("model.dtype=bfloat16", "train.steps=3", "train.save_every=1", "train.keep_last=3")
    assert run(digit_cfg(model, out / "full", *common, "deepspeed.zero_stage=2"), problems=digit_problems()) == 0
    # a ZeRO-3 run in the same process (DeepSpeed swaps torch.nn.functional.linear for its own there)
    assert run(digit_cfg(model, out / "z3", "model.dtype=bfloat16", "train.steps=1", "deepspeed.zero_stage=3"),
               problems=digit_problems()) == 0
    print("after the ZeRO-3 run torch.nn.functional.linear is", torch.nn.functional.linear.__name__, flush=True)
    crash_copy(out / "full", out / "part", keep_step=2)
    assert run(digit_cfg(model, out / "part", *common, "deepspeed.zero_stage=2", "train.resume=auto"),
               problems=digit_problems()) == 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
