"""The checkpoint commands compute on when MODEL is a GGUF file (finding heads or neurons).

Findings need a model that runs; a GGUF is imported once (surgery import-gguf: dequantized to
float32 safetensors) into the cache, keyed by the file's sha256, and reused. Edits named directly
(``--neurons``, ``--heads``, a recipe) never import: the bake reads only the GGUF's header and the
edited blocks.
"""

from __future__ import annotations

from pathlib import Path

from ..core.cache import cache_dir
from ..core.checkpoint import Checkpoint, file_sha256
from ..core.hash_cache import HashCache


def imported_checkpoint(path: str | Path, allow_remote_code: bool = False) -> Checkpoint:
    """The cached import of the GGUF at ``path`` (made on first use), as an opened checkpoint."""
    from ..model.gguf_import import import_gguf

    path = Path(path)
    cache = HashCache()
    digest = cache.get(path)
    if digest is None:
        digest = file_sha256(path)
        cache.put(path, digest)
        cache.save()
    folder = cache_dir() / "gguf-imports" / digest
    if not (folder / "config.json").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        import_gguf(path, folder, force=True)
    return Checkpoint(folder, allow_remote_code=allow_remote_code)
