"""EAGLE-3 head training: one layer over fused target hidden states, trained with EAGLE-3's training-time test."""
