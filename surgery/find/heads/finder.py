"""The head finder family: find-heads writes "heads" findings, amplify-heads bakes from them."""

from __future__ import annotations

from ..finders import register_finder
from .params import FindParams
from .record import HeadsFindings

HEADS = register_finder(
    "heads",
    find_command="find-heads",
    bake_command="amplify-heads",
    record=HeadsFindings,
    params=(FindParams,),
)
