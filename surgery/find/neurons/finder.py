"""The neuron finder family: find-neurons writes "neurons" findings, prune-neurons bakes from them."""

from __future__ import annotations

from ..finders import register_finder
from .params import CaptureParams, SelectParams
from .record import NeuronsFindings

NEURONS = register_finder(
    "neurons",
    find_command="find-neurons",
    bake_command="prune-neurons",
    record=NeuronsFindings,
    params=(CaptureParams,),
    bake_params=(SelectParams,),
)
