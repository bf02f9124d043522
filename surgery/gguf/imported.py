"""The checkpoint commands compute on when MODEL is a GGUF file (finding heads, neurons or a direction).

Findings need a model that runs; a GGUF is imported once (surgery import-gguf: dequantized to
float32 safetensors) into the cache, keyed by the file's sha256, and reused. The findings name the
GGUF file, not the import: its sha256 is their fingerprint, so they apply to that file (and to its
import) and to no other without --transfer. Edits named directly (``--neurons``, ``--heads``, a
recipe) never import: the bake reads only the GGUF's header and the edited blocks.
"""

from __future__ import annotations

from pathlib import Path

from ..core.cache import cache_dir
from ..core.checkpoint import Checkpoint, file_sha256
from ..core.hash_cache import HashCache
from ..core.progress import aside


class ImportedGguf(Checkpoint):
    """The float32 import of a GGUF file: finders load this folder, findings record the file."""

    def __init__(self, folder: Path, gguf: Path, sha256: str, *, allow_remote_code: bool = False):
        super().__init__(folder, allow_remote_code=allow_remote_code)
        self.gguf, self.sha256 = gguf, sha256

    @property
    def origin(self) -> Path:
        return self.gguf

    def fingerprint(self) -> str:
        """The GGUF file's sha256 (the import is a function of it; the file is what gets baked)."""
        return self.sha256


def imported_checkpoint(path: str | Path, allow_remote_code: bool = False) -> ImportedGguf:
    """The cached import of the GGUF at ``path`` (made on first use), as an opened checkpoint."""
    from .importing import import_gguf
    from .model import remember_config

    path = Path(path)
    cache = HashCache()
    digest = cache.get(path)
    if digest is None:
        digest = file_sha256(path)
        cache.put(path, digest)
        cache.save()
    folder = cache_dir() / "gguf-imports" / digest
    if not (folder / "config.json").is_file():
        # minutes on a large file: said and shown, as import-gguf shows it (the command's own progress
        # starts only once the model is open)
        report = aside()
        report.note(
            f"importing {path.name} into surgery's cache as `surgery import-gguf` does, once: later commands on "
            "this file reuse it"
        )
        folder.parent.mkdir(parents=True, exist_ok=True)
        result = import_gguf(path, folder, force=True, gguf_sha256=digest, progress=report.stages)
        if result.gguf_config is not None:  # a bake of the file then reads its config without transformers
            remember_config(path, result.gguf_config)
    return ImportedGguf(folder, path, digest, allow_remote_code=allow_remote_code)
