"""The direction finder family: find-direction writes "directions" findings, ablate-direction bakes them."""

from __future__ import annotations

from ..finders import register_finder
from .params import DirectionParams, KernelParams
from .record import DirectionsFindings

DIRECTIONS = register_finder(
    "directions",
    find_command="find-direction",
    bake_command="ablate-direction",
    record=DirectionsFindings,
    params=(DirectionParams,),
    bake_params=(KernelParams,),
)
