"""Directions in the residual stream: find one from two prompt sets, ablate it from the weights."""
