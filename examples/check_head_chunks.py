#!/usr/bin/env python3
"""Check: the head's logits computed a chunk of rows at a time (surgery/model/vocab_table.py's
``head_spans``) against the whole float32 matmul, bit for bit, on this machine's BLAS.

    python examples/check_head_chunks.py [--quick] [--json FILE]

For tables of 1000 to 262144 rows and 32 to 576 columns (bf16 values widened to float32, as the upcast
holds them), 1 to 130 tokens and chunks from ALIGN rows to a third of the table, each chunk's matmul is
written into one output as the head does and compared with ``linear`` of the whole widened table. Prints
the number of cases and every one that differs, with its largest relative difference; exits 1 if any
does. ``--quick``: the first four tables only (the full run took 21 min on the 2-core VM at load 6).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (rows, columns): odd and round vocabularies (SmolLM2 49152, GPT-2 50257, Phi-3 32064, Qwen 151936,
# Llama 3 128256, Gemma 3 262144), narrow so the check stays minutes long on a laptop.
TABLES = [
    (1000, 32),
    (1001, 40),
    (1003, 64),
    (4097, 576),
    (32000, 64),
    (49152, 576),
    (50257, 128),
    (32064, 96),
    (151936, 64),
    (128256, 32),
    (262144, 40),
]
TOKENS = (1, 2, 3, 7, 14, 64, 130)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE))
    import torch
    from machine import one_line, stamp

    from surgery.model.vocab_table import ALIGN, head_spans

    machine = stamp()
    print("machine:", one_line(machine))
    torch.manual_seed(0)
    started, cases, differ = time.perf_counter(), 0, []
    linear = torch.nn.functional.linear
    for rows, cols in TABLES[:4] if args.quick else TABLES:
        table = torch.randn(rows, cols).to(torch.bfloat16)
        whole = table.float().requires_grad_(True)  # a loaded weight asks for a gradient: torch's path
        for tokens in TOKENS:
            x = torch.randn(1, tokens, cols)
            with torch.no_grad():
                want = linear(x, whole)
                for most in sorted(
                    {ALIGN, 2 * ALIGN, 3 * ALIGN, 4 * ALIGN, 9 * ALIGN, 16 * ALIGN, 96 * ALIGN, rows // 3}
                ):
                    got = torch.empty_like(want)
                    for span in head_spans(rows, most):
                        got[..., span] = linear(x, table[span].float().requires_grad_(True))
                    cases += 1
                    if not torch.equal(got, want):
                        rel = float((got - want).abs().max() / want.abs().max())
                        differ.append({"rows": rows, "cols": cols, "tokens": tokens, "most": most, "rel": rel})
                        print("differs:", differ[-1])
    print(f"{cases} cases, {len(differ)} differ, {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "cases": cases, "differ": differ}, indent=1))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
