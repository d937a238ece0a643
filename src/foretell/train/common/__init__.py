"""Shared by every training family: data, training loops, target-output caches, run folders and the shared options."""
