#!/usr/bin/env python3
"""llama.cpp against transformers on GGUF files surgery baked: what the issue's criterion depends on.

Two roles, one per environment:

    LLAMA_PYTHON examples/llamacpp_logits.py logits --gguf FILE --ids IDS.json --out LOGITS.npy
        [--edits EDITS.json] [--watch WATCH.json]
    python examples/llamacpp_logits.py table [--model smollm2|gemma|smollm2-mxfp4|smollm2-nvfp4] [--chat] [--llama-python LLAMA_PYTHON]

``logits`` (run with the python of an environment with llama-cpp-python): llama.cpp's logits for
fixed token ids. IDS.json is a list of prompts, each a list of token ids (the caller tokenizes, so
that both engines read the same ids). LOGITS.npy is a float32 array [prompts, positions, vocab]
(prompts padded with NaN to the longest). Tokens are evaluated one at a time (``n_batch=1``):
batched evaluation crashed llama.cpp's CPU kernels on the machine this was written on.
``--edits`` makes the edits at run time inside llama.cpp, through its graph callback (``cb_eval``):
pruned neurons' entries of the FFN's gated activation (the down projection's input) are zeroed, a
head's slice of the attention output (``kqv_out``, the output projection's input) is scaled. That
is the edit made by llama.cpp itself on the source file's bytes: the control that tells llama.cpp's
own error from the bytes surgery wrote. ``--watch`` writes, for the neurons listed in EDITS.json,
the largest |activation| llama.cpp computed there over every token (0.0: silent), and the same
over the layers' other neurons (that they are not silent anyway).

``table`` (run with surgery's environment): bakes each case into the real file, runs both engines
over a few prompts and prints, per case, the mean |Δlogit| per prompt (mean and median over the
prompts, and the largest single difference) of: the source file in llama.cpp vs transformers on
its dequantized weights (the engines' own difference), the edited file in llama.cpp vs the run-time
edit in transformers (the issue's criterion: no larger than the first), the edited file vs the
run-time edit in llama.cpp (the bytes vs llama.cpp's own edit), and the edited file vs the source
(the size of the edit), and the edited file's excess over the source's difference, paired prompt by
prompt (mean ± standard error). ``--chat`` puts the prompts in the model's chat template. Needs ``python examples/get_models.py`` and SURGERY_LLAMACPP_PYTHON (or
``--llama-python``). Used by tests/gguf/test_llamacpp.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()

# ---------------------------------------------------------------- llama.cpp side (llama-cpp-python)

GGML_TYPE_F32 = 0


class _Graph:
    """llama.cpp's graph callback: edits and watches the named activations of one evaluation."""

    def __init__(self, edits: dict) -> None:
        import ctypes

        import llama_cpp

        lib = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
        self.ggml = ctypes.CDLL(str(lib))
        self.ggml.ggml_get_name.restype = ctypes.c_char_p
        self.ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
        self.ggml.ggml_get_data.restype = ctypes.c_void_p
        self.ggml.ggml_get_data.argtypes = [ctypes.c_void_p]
        self.ctypes = ctypes
        self.neurons: dict[str, list[int]] = {}
        for layer, neuron in edits.get("neurons", []):
            for act in ("ffn_swiglu", "ffn_geglu"):  # the gated activation's name: llama / gemma graphs
                self.neurons.setdefault(f"{act}-{layer}", []).append(neuron)
        self.heads = {f"kqv_out-{layer}": [] for layer, _, _ in edits.get("heads", [])}
        for layer, head, alpha in edits.get("heads", []):
            self.heads[f"kqv_out-{layer}"].append((head, alpha))
        self.head_dim = edits.get("head_dim", 0)
        self.apply = True
        self.watched = 0.0  # largest |activation| at the listed neurons
        self.others = 0.0  # largest |activation| at the same layers' other neurons

    def _array(self, t: int) -> np.ndarray:
        """The tensor's float32 values as [tokens, features], a view of llama.cpp's own buffer."""
        c = self.ctypes
        kind = c.c_int32.from_address(t).value
        ne = (c.c_int64 * 4).from_address(t + 16)
        nb = (c.c_size_t * 4).from_address(t + 48)
        if kind != GGML_TYPE_F32 or nb[0] != 4 or nb[1] != 4 * ne[0] or ne[2] * ne[3] != 1:
            raise RuntimeError("a watched activation is not a contiguous float32 matrix")
        buf = (c.c_float * (ne[0] * ne[1])).from_address(self.ggml.ggml_get_data(t))
        return np.ctypeslib.as_array(buf).reshape(ne[1], ne[0])

    def callback(self, t: int, ask: bool, _user: int) -> bool:
        name = self.ggml.ggml_get_name(t).decode()
        if ask:
            return name in self.neurons or (self.apply and name in self.heads)
        x = self._array(t)
        if name in self.neurons:
            idx = self.neurons[name]
            self.watched = max(self.watched, float(np.abs(x[:, idx]).max()))
            rest = np.delete(x, idx, axis=1)
            self.others = max(self.others, float(np.abs(rest).max()))
            if self.apply:
                x[:, idx] = 0.0
        elif name in self.heads:
            for head, alpha in self.heads[name]:
                x[:, head * self.head_dim : (head + 1) * self.head_dim] *= alpha
        return True


def llamacpp_logits(gguf: Path, prompts: list[list[int]], edits: dict | None, apply: bool) -> tuple[np.ndarray, dict]:
    """llama.cpp's logits [prompts, positions, vocab] for ``prompts``; with ``edits``, made at run
    time (``apply``) or only watched; and what was watched."""
    from llama_cpp import Llama
    from llama_cpp import llama_cpp as lc

    graph = _Graph(edits or {})
    graph.apply = apply
    callback = lc.ggml_backend_sched_eval_callback(graph.callback)
    defaults = lc.llama_context_default_params

    def with_callback():
        params = defaults()
        params.cb_eval = callback
        return params

    if edits:  # Llama() builds its context from these defaults: the only way in for cb_eval
        lc.llama_context_default_params = with_callback
    try:
        longest = max(len(p) for p in prompts)
        llm = Llama(
            model_path=str(gguf),
            logits_all=True,
            n_batch=1,
            n_ctx=max(64, longest),
            n_threads=int(os.environ.get("OMP_NUM_THREADS", "1")),
            verbose=False,
        )
    finally:
        lc.llama_context_default_params = defaults
    out = np.full((len(prompts), longest, llm.n_vocab()), np.nan, dtype=np.float32)
    for i, ids in enumerate(prompts):
        llm.reset()
        llm.eval(ids)
        out[i, : len(ids)] = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    return out, {"watched": graph.watched, "others": graph.others}


def logits_main(args: argparse.Namespace) -> None:
    prompts = json.loads(args.ids.read_text(encoding="utf-8"))
    edits = json.loads(args.edits.read_text(encoding="utf-8")) if args.edits else None
    logits, seen = llamacpp_logits(args.gguf, prompts, edits, apply=not args.watch)
    np.save(args.out, logits)
    if args.watch:
        args.watch.write_text(json.dumps(seen), encoding="utf-8")


# ---------------------------------------------------------------- transformers side and the table

PROMPTS = (
    "The capital of France is",
    "Water boils at a temperature of",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    if n < 2:\n        return",
    "The three primary colours are red, blue and",
    "To make a cup of tea, first boil the water, then",
    "In 1969, the first people to walk on the Moon were",
    "Photosynthesis is the process by which plants",
)


@dataclass(frozen=True)
class Spec:
    """A real GGUF file, where its dequantized import lies, and the edits the table tries on it."""

    file: str
    imported: str
    prune: tuple[tuple[int, int], ...]  # (layer, neuron) pairs: the 40 neurons
    control: tuple[tuple[int, int], ...]  # another 40, drawn at random: the same kind of edit elsewhere
    head: tuple[int, int]  # (layer, head) scaled by α
    alphas: tuple[float, ...]  # the α the file's format stores exactly
    fp4: str | None = None  # made from ``file``: its decoder matrices in this 4-bit float type (fp4_gguf.py)


def _random_neurons(seed: int, layers: int, width: int, n: int = 40) -> tuple[tuple[int, int], ...]:
    rng = np.random.default_rng(seed)
    flat = rng.choice(layers * width, size=n, replace=False)
    return tuple(sorted((int(i // width), int(i % width)) for i in flat))


SMOLLM2 = Spec(
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "smollm2-135m-instruct",
    tuple((layer, neuron) for layer in (3, 11, 19, 27) for neuron in range(7, 1500, 150)),
    _random_neurons(0, 30, 1536),
    (5, 2),
    (2.0, 0.5),
)
SPECS = {
    "smollm2": SMOLLM2,
    "gemma": Spec(
        "gemma-3-270m-q4_k_m.gguf",
        "gemma-3-270m",
        tuple((layer, neuron) for layer in (2, 6, 10, 14) for neuron in range(7, 2000, 200)),
        _random_neurons(0, 18, 2048),
        (5, 1),
        (2.0,),  # α 0.5 is refused: not exact on this head's Q4_K super-blocks
    ),
    # SmolLM2's attention and MLP matrices in MXFP4 (the gpt-oss experts' format): the same edits,
    # a pruned down column now its 4-bit codes set to +0, a head's α its blocks' E8M0 exponents.
    "smollm2-mxfp4": replace(SMOLLM2, fp4="MXFP4"),
    # The same in NVFP4 (encoded by ggml), a head's α through its groups' e4m3 scales. α 0.5 is refused:
    # without a global scale, ggml puts this model's group scales at e4m3's subnormal end, where half an
    # odd mantissa is no e4m3 value.
    "smollm2-nvfp4": replace(SMOLLM2, alphas=(2.0,), fp4="NVFP4"),
}


def cases(spec: Spec):
    """The table's rows: name -> the recipe's edits."""
    from surgery.core.edits import HeadScale, NeuronScale

    prune = tuple(NeuronScale(layer, neuron, 0.0) for layer, neuron in spec.prune)
    control = tuple(NeuronScale(layer, neuron, 0.0) for layer, neuron in spec.control)
    heads = {f"head α {alpha:g}": (HeadScale(*spec.head, alpha),) for alpha in spec.alphas}
    return {
        "prune 40": prune,
        "prune 40 (random)": control,
        **heads,
        f"prune 40 + head α {spec.alphas[0]:g}": (*prune, HeadScale(*spec.head, spec.alphas[0])),
    }


def edits_json(edits, head_dim: int) -> dict:
    """The run-time form of ``edits`` for ``logits --edits``."""
    from surgery.core.edits import HeadScale, NeuronScale

    return {
        "neurons": [[e.layer, e.neuron] for e in edits if isinstance(e, NeuronScale)],
        "heads": [[e.layer, e.head, e.alpha] for e in edits if isinstance(e, HeadScale)],
        "head_dim": head_dim,
    }


def run_llamacpp(
    python: str, gguf: Path, prompts: list[list[int]], folder: Path, edits: dict | None = None, watch: bool = False
) -> tuple[np.ndarray, dict]:
    """``logits`` in llama-cpp-python's environment: the logits, and what ``--watch`` saw."""
    folder.mkdir(parents=True, exist_ok=True)
    ids, out, seen = folder / "ids.json", folder / "logits.npy", folder / "watch.json"
    ids.write_text(json.dumps(prompts), encoding="utf-8")
    cmd = [python, str(HERE), "logits", "--gguf", str(gguf), "--ids", str(ids), "--out", str(out)]
    if edits:
        (folder / "edits.json").write_text(json.dumps(edits), encoding="utf-8")
        cmd += ["--edits", str(folder / "edits.json")]
    if watch:
        cmd += ["--watch", str(seen)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"llama.cpp run failed: {proc.stderr[-2000:]}")
    return np.load(out), (json.loads(seen.read_text(encoding="utf-8")) if watch else {})


def transformers_logits(model, prompts: list[list[int]], edits=()) -> np.ndarray:
    """transformers' logits, shaped as ``logits`` writes them, with ``edits`` made at run time."""
    import torch

    from surgery.model.hooks import applied

    longest = max(len(p) for p in prompts)
    out = np.full((len(prompts), longest, model.config.vocab_size), np.nan, dtype=np.float32)
    with torch.no_grad(), applied(model, list(edits)):
        for i, ids in enumerate(prompts):
            out[i, : len(ids)] = model(input_ids=torch.tensor([ids])).logits[0].float().numpy()
    return out


@dataclass(frozen=True)
class Diff:
    """|Δlogit| between two runs: the mean per prompt, summarized over the prompts, and the largest."""

    per_prompt: tuple[float, ...]
    largest: float

    @classmethod
    def of(cls, a: np.ndarray, b: np.ndarray) -> Diff:
        d = np.abs(a - b)
        return cls(tuple(float(np.nanmean(p)) for p in d), float(np.nanmax(d)))

    @property
    def mean(self) -> float:
        return float(np.mean(self.per_prompt))

    @property
    def median(self) -> float:
        return float(np.median(self.per_prompt))

    def excess(self, base: Diff) -> tuple[float, float]:
        """How much larger than ``base`` (the same prompts) this is: the mean of the per-prompt
        excesses and its standard error. Paired, because the prompts' own spread is larger than
        what an edit does to llama.cpp's error."""
        d = np.subtract(self.per_prompt, base.per_prompt)
        return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d)))

    def __str__(self) -> str:
        return f"{self.mean:7.4f} {self.median:7.4f} {self.largest:6.3f}"


@dataclass(frozen=True)
class Row:
    """One case: the edited file against the run-time edits and the source, and what llama.cpp saw."""

    name: str
    edited_vs_edit: Diff  # llama.cpp on the edited file vs transformers' run-time edit
    bytes_vs_engine: Diff  # llama.cpp on the edited file vs llama.cpp's run-time edit of the source
    edit_size: Diff  # llama.cpp on the edited file vs on the source
    correlation: float  # of the two engines' changes
    silent: float | None  # largest |activation| llama.cpp computed at the pruned neurons (edited file)
    active: float | None  # the same at those neurons in the source file


def token_ids(tokenizer, chat: bool) -> list[list[int]]:
    """The prompts' ids: as plain text, or as a user's turn in the model's chat template."""
    if not chat:
        return [tokenizer(p)["input_ids"] for p in PROMPTS]
    turns = [[{"role": "user", "content": p}] for p in PROMPTS]
    texts = [tokenizer.apply_chat_template(t, add_generation_prompt=True, tokenize=False) for t in turns]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]  # the template has them


def measure(name: str, llama_python: str, folder: Path, chat: bool = False) -> tuple[Diff, list[Row]]:
    """The source's engine difference and one row per case of ``SPECS[name]`` (``chat``: the
    prompts in the model's chat template)."""
    from transformers import AutoTokenizer

    from surgery.api import apply
    from surgery.core.edits import Recipe
    from tests.support.models import load_fp32
    from tests.support.paths import real_model_path

    spec = SPECS[name]
    src, imported = real_model_path(".gguf") / spec.file, real_model_path(spec.imported)
    if not src.is_file() or not imported.is_dir():
        raise FileNotFoundError(f"{spec.file} or its import is missing: run `python examples/get_models.py`")
    if spec.fp4:  # the 4-bit float copy, and transformers' weights are its own decoded values
        sys.path.insert(0, str(HERE.parent))
        from fp4_gguf import fp4_gguf

        from surgery.api import import_gguf

        src = fp4_gguf(src, folder / f"{Path(spec.file).stem}.{spec.fp4}.gguf", spec.fp4, llama_python)
        imported = import_gguf(src, folder / "imported").path
    tokenizer = AutoTokenizer.from_pretrained(imported)
    prompts = token_ids(tokenizer, chat)
    model = load_fp32(imported)
    head_dim = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    t_src = transformers_logits(model, prompts)
    l_src, _ = run_llamacpp(llama_python, src, prompts, folder / "source")
    engines = Diff.of(l_src, t_src)
    rows = []
    for case, edits in cases(spec).items():
        slug = case.replace(" ", "_").replace("(", "").replace(")", "").replace("+", "and")
        out = folder / f"{slug}.gguf"
        apply(Recipe(edits), src, out)
        t_edit = transformers_logits(model, prompts, edits)
        runtime = edits_json(edits, head_dim)
        l_edit, _ = run_llamacpp(llama_python, out, prompts, folder / slug)  # no callback: as a user runs it
        l_rt, _ = run_llamacpp(llama_python, src, prompts, folder / f"{slug}.rt", runtime)
        pruned = bool(runtime["neurons"])
        if pruned:  # what llama.cpp computes at the pruned neurons, in the edited file and in the source
            _, seen = run_llamacpp(llama_python, out, prompts, folder / f"{slug}.watch", runtime, watch=True)
            _, seen_src = run_llamacpp(llama_python, src, prompts, folder / f"{slug}.src", runtime, watch=True)
        known = ~np.isnan(l_src)
        corr = float(np.corrcoef((l_edit - l_src)[known], (t_edit - t_src)[known])[0, 1])
        rows.append(
            Row(
                case,
                Diff.of(l_edit, t_edit),
                Diff.of(l_edit, l_rt),
                Diff.of(l_edit, l_src),
                corr,
                seen["watched"] if pruned else None,
                seen_src["watched"] if pruned else None,
            )
        )
    return engines, rows


def print_table(name: str, engines: Diff, rows: list[Row]) -> None:
    """The table, one line per case (columns: mean, median over prompts of the per-prompt means; max)."""
    print(f"{name}: {len(engines.per_prompt)} prompts; |Δlogit| as mean / median of per-prompt means / max")
    print(f"  source file, llama.cpp vs transformers:           {engines}")
    print(
        "  case                  edited vs edit          bytes vs llama.cpp edit  edited vs source        "
        "corr   excess over source  pruned |act| edited / source"
    )
    for r in rows:
        excess, se = r.edited_vs_edit.excess(engines)
        silent = "" if r.silent is None else f"{r.silent:.3g} / {r.active:.3g}"
        print(
            f"  {r.name:<21} {r.edited_vs_edit}   {r.bytes_vs_engine}    {r.edit_size}   "
            f"{r.correlation:5.3f}  {excess:+.4f} ± {se:.4f}   {silent}"
        )


def table_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE.parents[1]))  # tests.support: the real models' paths and loader
    python = args.llama_python or os.environ.get("SURGERY_LLAMACPP_PYTHON")
    if not python:
        sys.exit("Error: name llama-cpp-python's python with --llama-python or SURGERY_LLAMACPP_PYTHON")
    for name in args.model:
        with tempfile.TemporaryDirectory() as tmp:
            engines, rows = measure(name, python, Path(tmp), chat=args.chat)
        print_table(name, engines, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    lg = sub.add_parser("logits", help="llama.cpp's logits (run with llama-cpp-python's python)")
    lg.add_argument("--gguf", type=Path, required=True)
    lg.add_argument("--ids", type=Path, required=True)
    lg.add_argument("--out", type=Path, required=True)
    lg.add_argument("--edits", type=Path, help="edits made at run time in llama.cpp (JSON)")
    lg.add_argument("--watch", type=Path, help="only watch the edits' neurons; write what was seen here")
    tb = sub.add_parser("table", help="both engines on every case (run with surgery's python)")
    tb.add_argument("--model", action="append", choices=sorted(SPECS), help="default: smollm2")
    tb.add_argument("--llama-python")
    tb.add_argument("--chat", action="store_true", help="the prompts as user turns of the chat template")
    args = parser.parse_args()
    if args.command == "logits":
        logits_main(args)
    else:
        args.model = args.model or ["smollm2"]
        table_main(args)


if __name__ == "__main__":
    main()
