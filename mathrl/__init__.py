"""mathrl: verifiable-reward reinforcement learning for math reasoning.

Pipeline (see DESIGN.md): data -> rollout -> reward -> advantage -> loss -> update;
eval reads checkpoints. Each stage is a subpackage.
"""

__version__ = "0.1.0"
