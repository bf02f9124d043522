"""Fairness pruning: contrastive pairs, down_proj capture, neuron scores, selection, findings."""
