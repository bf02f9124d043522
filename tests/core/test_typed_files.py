"""surgery.json and the findings files are read through their typed records only: no module outside
the ones that own a file indexes its JSON by one of its keys (``d["edited_tensors"]``,
``d.get("discovery")``, ``"ci95" in d``). A reader that needs a value the records do not have adds
it to the record, where the layouts of every version are known."""

from __future__ import annotations

import ast

from tests.support.paths import REPO

PACKAGE = REPO / "surgery"
# Keys that name a part of surgery.json or surgery_adapter.json (surgery/bake/record.py).
BAKE_KEYS = {
    "edited_tensors",
    "source_files",
    "verification",
    "evaluation",
    "undo",
    "hashing",
    "pushed",
    "provenance_sha256",
    "replaced_files",
    "added_files",
    "left_out_files",
    "rows_key",
    "cols_key",
    "max_abs_diff",
    "max_abs_logit_diff",
    "max_diff_over_bound",
    "commit_url",
    "pr_url",
    "hub_id",
    "max_rank",
    "source_files_from_hub_blob_names",
    "source_files_from_hash_cache",
    "files_from_source",
    "block_key",
    "direction_left",
    "direction_weight",
}
# Keys that name a part of a findings file: read in its own package only (surgery/find/, where the
# finders build them and the records type them).
FINDINGS_KEYS = {
    "discovery",
    "confirmation",
    "knockout",
    "selected_heads",
    "dose_response",
    "dataset_sha256",
    "prompt_format",
    "stable_heads",
    "coef_grid",
    "n_significant",
    "K_over_S",
    "option_token_ids",
    "effect_pct",
    "ci95",
    "delta_base",
    "delta_knockout",
    "share_ge_tested",
    "random_sets",
    "edge_delta_s",
    "whole_delta_s",
    "discovery_rank",
    "expert_width",
    "unscored_neurons",
    "routing",
    "layer_distribution",
    "jaccard",
    "pairs_used",
    "skipped",
    "skipped_ids",
    "top_category",
    "chosen_for",
    "best_layer",
    "cosine",
    "norm_a",
    "norm_b",
    "separation",
}
OWNERS = {
    **{key: ("surgery/bake/record.py",) for key in BAKE_KEYS},
    **{key: ("surgery/find/",) for key in FINDINGS_KEYS},
    # The caveats of a heads or tune summary sit in core, below the finder that writes it and the card that quotes it.
    "selected_heads": ("surgery/find/", "surgery/core/heads_caveats.py"),
    "confirmation": ("surgery/find/", "surgery/core/heads_caveats.py"),
}


def _key_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, key) of every read of a constant string key: ``d[key]``, ``d.get/pop/setdefault(key)``,
    ``key in d``."""
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and node.args
        ):
            key = node.args[0]
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append((node.lineno, key.value))
    return found


def test_no_module_reads_these_files_by_key_but_their_owners():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        for line, key in _key_reads(ast.parse(path.read_text(encoding="utf-8"))):
            if key in OWNERS and not name.startswith(OWNERS[key]):
                offenders.append(f"{name}:{line} {key!r}")
    assert not offenders, (
        "read these through the typed records (surgery.bake.record, surgery.find.*.record): " + ", ".join(offenders)
    )


def test_the_check_sees_each_kind_of_read():
    reads = _key_reads(
        ast.parse('prov["undo"]; f.get("discovery", {}); "ci95" in ko; d.pop("hashing"); x["undo"] = 1; {"undo": 1}')
    )
    assert [key for _, key in reads] == ["undo", "discovery", "ci95", "hashing"]  # writes and literals are not reads
