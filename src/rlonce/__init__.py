"""rlonce: agentic reinforcement-learning post-training, CPU-first, scale-out ready."""

__version__ = "0.1.0"
