"""Parallel draft head training: D draft tokens per forward from the target's fused hidden states."""
