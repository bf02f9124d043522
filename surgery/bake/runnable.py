"""Does the source run? A bake that checks its output asks it before publishing (not with ``--no-verify``).

The bake edits bytes and checks the edited maps without a model (surgery.bake.check), so a config.json
that describes its weights (every shape checks out) but names what transformers cannot build or run (an
activation or a RoPE type it does not know) would be baked and published, and only ``surgery verify``
would find out. So the bake loads the source as every command that runs a model does
(surgery.model.loading.load_model with the command's own load options: device, dtype, --device-map
and --max-memory, trust_remote_code) and runs one forward pass on a few in-range token ids
(surgery.model.probe). A failure is one :class:`CheckpointError` and nothing is published. Building the
model from its config on the meta device would cost no memory but refuses models that from_pretrained
loads, and a meta-device forward fails in mixture-of-experts kernels: only the loader's way is asked.

Where the weights allow it: without ``--device-map`` (whose ``--max-memory`` already bounds the load),
the weights in float32 (every value at 4 bytes: more than the loader holds for a 16-bit, FP8 or
integer checkpoint) may take at most ``MEMORY_SHARE`` of the memory available when the bake starts; a
larger model is not loaded, and one note says so and that ``surgery verify`` runs it.

A passed run is remembered in ``<cache dir>/runnable/``, keyed by config.json's sha256, the model key
(the weights' fingerprint and the tokenizer files), the sha256 of the folder's Python files (remote
code), and the transformers and surgery versions: a second bake from the same source does not load it
again. Importing torch and transformers alone takes seconds, so the run happens on a thread while the
bake copies the files; the bake waits for it before its check.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .. import __version__
from ..core.cache import cache_dir
from ..core.checkpoint import Checkpoint, file_sha256
from ..core.sizes import human_size
from ..core.staging import atomic_write_text
from ..core.strict_files import load_json
from ..model.loading import LoadSpec, check_placement

FOLDER = "runnable"
# Of the memory available now, what the float32 weights may take: the loader's copy, the forward pass's
# activations and the bake's own buffers and page cache must all fit beside whatever else runs.
MEMORY_SHARE = 0.5
TOKENS = 4  # the forward pass's token ids: 0 … 3 (a model's image token, which asks for pixels, lies far above)


def run_key(ckpt: Checkpoint) -> dict[str, Any]:
    """What a passed run depends on: the config, the weights and tokenizer (model key), remote code
    and the versions of transformers and surgery (which load and build the model)."""
    return {
        "config_sha256": file_sha256(ckpt.path / "config.json"),
        "model_key": ckpt.model_key(),
        "code_sha256": {p.name: file_sha256(p) for p in sorted(ckpt.path.glob("*.py"))},
        "transformers": version("transformers"),
        "surgery": __version__,
    }


def _entry(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return cache_dir() / FOLDER / f"{digest[:32]}.json"


def has_run(key: dict[str, Any]) -> bool:
    """Whether a run of this key passed before (an entry whose recorded key is this one)."""
    try:
        return load_json(_entry(key).read_text(encoding="utf-8")) == key
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False  # missing or damaged: run it


def remember_run(key: dict[str, Any]) -> None:
    """Record that a run of ``key`` passed; a read-only cache is no error (the next bake runs it again)."""
    try:
        atomic_write_text(_entry(key), json.dumps(key, sort_keys=True, indent=1) + "\n")
    except OSError:
        pass


def float32_bytes(ckpt: Checkpoint) -> int:
    """The weights' size at 4 bytes a value (an integer checkpoint's weights at their logical shapes)."""
    return 4 * sum(math.prod(info.shape) for info in ckpt.format.view(ckpt).tensors.values())


def available_memory() -> int:
    """Bytes of memory available to a new allocation now (psutil: MemAvailable on Linux)."""
    import psutil

    return int(psutil.virtual_memory().available)


def too_big(ckpt: Checkpoint) -> str | None:
    """Why the source is not run before the bake (its note), or None when it fits (``MEMORY_SHARE``)."""
    need, have = float32_bytes(ckpt), available_memory()
    if need <= MEMORY_SHARE * have:
        return None
    return (
        f"the source was not run before publishing: its weights take {human_size(need)} in float32, more than "
        f"{MEMORY_SHARE:.0%} of the {human_size(have)} of memory available; `surgery verify` runs it"
    )


def run_once(path: Path, load: LoadSpec, stop: threading.Event | None = None) -> None:
    """Load the model at ``path`` as the loader does with ``load`` and run one forward pass on ``TOKENS``
    in-range ids; a model transformers cannot build or run is one :class:`CheckpointError`. ``stop``
    set before the load (the bake failed first): nothing is loaded."""
    import torch
    from transformers.utils import logging as hf_logging

    from ..model.loading import vocab_rows
    from ..model.probe import check_runs, load_or_refuse

    if stop is not None and stop.is_set():
        return
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # what transformers says about a load is verify's to show, not this probe's
    try:
        model = load_or_refuse(path, replace(load, revision=None))  # ``path`` is the resolved revision
    finally:
        hf_logging.set_verbosity(level)
    rows = vocab_rows(Checkpoint(path, allow_remote_code=load.trust_remote_code).config) or TOKENS
    check_runs(model, torch.arange(TOKENS).remainder(rows)[None], path)


@contextmanager
def runs_alongside(
    ckpt: Checkpoint, load: LoadSpec, note: Callable[[str], None]
) -> Iterator[Callable[[], None] | None]:
    """Run the source once (:func:`run_once`) on a thread while the body runs (the bake's copy); yields
    the wait, which raises the run's :class:`CheckpointError`, or None when nothing runs: a run of the
    same key passed before, or (with a note) the weights do not fit (:func:`too_big`). Leaving waits for the
    thread (a load cannot be cut short); a body that fails before the load starts leaves without it."""
    key = run_key(ckpt)
    if has_run(key):
        yield None
        return
    check_placement(ckpt.path, load)  # now, not once the copy is done and the load starts
    why = None if load.device_map else too_big(ckpt)
    if why is not None:
        note(why)
        yield None
        return
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="surgery-run") as pool:
        job = pool.submit(run_once, ckpt.path, load, stop)

        def wait() -> None:
            job.result()
            remember_run(key)

        try:
            yield wait
        finally:
            stop.set()
