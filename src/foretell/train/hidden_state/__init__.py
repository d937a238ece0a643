"""Hidden-state draft training (seed 000): one decoder layer autoregressing on the target's hidden states."""
