"""Hidden-state draft training (Make Every Draft Count): one decoder layer autoregressing on the target's hidden states."""
