"""zerotir: train a base LLM into a tool-using math solver by outcome-reward RL alone (ZeroTIR)."""

__version__ = "0.1.0"
