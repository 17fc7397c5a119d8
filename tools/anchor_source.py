"""Maintainer tool (issue 38): SGLang's backend module with upstream's changes for the records that
apply inserted into its own source: the anchor an upgrade would cost, for the in-process cost
comparison on the H200 (``tests/gpu/decode_step_anchor_worker.py``).

    .venv/bin/python tools/anchor_source.py [--release 0.5.12] [--out .gpu/anchor]

Writes ``<out>/trtllm_mha_backend_anchor.py``: the release's ``trtllm_mha_backend.py`` (fetched into
the test cache, never committed) with the same AST changes the CPU oracles make (``fp8_cases``):
PR #28144 as revised by PR #29423 (0.5.15's two helpers on the class, 0.5.15's scale statements and
FP8 cast in ``forward_decode`` and ``forward_extend``) and PR #31667 (0.5.16's ``if
self.is_xqa_impl: q = q.contiguous().view(...)`` in ``forward_decode``), each where the release has
the bug; and, since issue 47's server A/B, every other record the release is affected by, so that
the anchor carries what the hotfix changes: PR #26521 (``upstream_fix``'s statement in the draft-decode
branch of ``init_forward_metadata_capture_cuda_graph``), PR #25103 (0.5.13's ``_resolve_swa_kv_pool``
on the class and 0.5.13's ``self._swa_kv_pool = self._resolve_swa_kv_pool(model_runner)`` in place of
the release's allocator test in ``__init__``; the release's helpers ask
``self.use_sliding_window_kv_pool`` where 0.5.13's ask ``self._swa_kv_pool is None``, so the flag is
set to "a pool was resolved" right after, as the record's repair does) and encoder_only_mask (0.5.22's
``causal=`` keyword of the context-kernel call in ``forward_extend``, ``fp8_cases``' oracle, with
0.5.22's import of ``AttentionType``). Nothing else of the file changes; ``ast.unparse`` writes it
(line numbers differ).
"""

import argparse
import ast
import copy
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE.parent / "tests" / "support"), str(HERE)]

import fp8_cases  # noqa: E402
import release_selection  # noqa: E402
import upstream_fix  # noqa: E402
from sglang_hotfix_trtllm import detect  # noqa: E402
from sglang_hotfix_trtllm.records import encoder_only_mask, pr25103, pr26521, pr28144, pr31667  # noqa: E402

NAME = "trtllm_mha_backend_anchor.py"


SWA_FIXED_RELEASE = "0.5.13"  # PR #25103 (with #26966's exception), as 0.5.13 ships it
ENCODER_ONLY_FIXED_RELEASE = "0.5.22"
ATTENTION_TYPE_IMPORT = "from sglang.srt.layers.radix_attention import AttentionType"


def _affected(hotfix, path):
    return detect.assess_source(hotfix, str(path)).verdict.value == "affected"


def _apply_capture_fix(method):
    """PR #26521: upstream's statement right after the draft-decode branch binds ``cache_seqlens``."""
    body = upstream_fix._draft_decode_body(method)
    (index,) = [
        i
        for i, s in enumerate(body)
        if isinstance(s, ast.Assign)
        and ast.unparse(s.targets[0]) == "metadata.cache_seqlens_int32"
        and "'cache_seqlens'" in ast.unparse(s.value)
    ]
    statement = ast.parse(upstream_fix.UPSTREAM_STATEMENT).body[0]
    body.insert(index + 1, ast.copy_location(statement, body[index]))


def _is_self_target(statement, attribute):
    targets = statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)]
    return any(ast.unparse(t) == "self.%s" % attribute for t in targets if t is not None)


def _apply_swa_pool(cls, own):
    """PR #25103 as 0.5.13 ships it: its ``_resolve_swa_kv_pool`` on the class, its assignment in place
    of the release's two statements, then the release's flag set from the pool resolved."""
    fixed_cls = fp8_cases._backend_class(release_selection.release_dir(SWA_FIXED_RELEASE) / fp8_cases.BACKEND)
    fixed = fp8_cases._methods(fixed_cls)
    (resolver,) = [n for n in fixed_cls.body if isinstance(n, ast.FunctionDef) and n.name == "_resolve_swa_kv_pool"]
    (upstream_statement,) = [s for s in fixed["__init__"].body if _is_self_target(s, "_swa_kv_pool")]
    body = own["__init__"].body
    (flag,) = [i for i, s in enumerate(body) if _is_self_target(s, "use_sliding_window_kv_pool")]
    (pool,) = [i for i, s in enumerate(body) if _is_self_target(s, "_swa_kv_pool")]
    assert pool == flag + 1, (flag, pool)
    flag_statement = ast.parse("self.use_sliding_window_kv_pool = self._swa_kv_pool is not None").body[0]
    body[flag : pool + 1] = [
        ast.copy_location(copy.deepcopy(upstream_statement), body[flag]),
        ast.copy_location(flag_statement, body[pool]),
    ]
    assert "_resolve_swa_kv_pool" not in own
    cls.body.append(copy.deepcopy(resolver))


def _add_import(tree, text):
    """``text`` after the module's last top-level ``from sglang...`` import (0.5.22's place for it)."""
    (statement,) = ast.parse(text).body
    last = max(
        i for i, n in enumerate(tree.body) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sglang.")
    )
    tree.body.insert(last + 1, ast.copy_location(statement, tree.body[last]))


def anchor_source(release):
    """The release's backend file with upstream's changes for its affected records (pr26521, pr25103,
    pr28144, pr31667, encoder_only_mask) inserted; returns (source, the records changed)."""
    release_dir = release_selection.release_dir(release)
    path = release_dir / fp8_cases.BACKEND
    tree = ast.parse(path.read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == fp8_cases.CLASS_NAME]
    own = fp8_cases._methods(cls)
    changed = []
    if _affected(pr26521.HOTFIX, path):
        _apply_capture_fix(own[upstream_fix.METHOD_NAME])
        changed.append("pr26521")
    if _affected(pr25103.HOTFIX, path):
        _apply_swa_pool(cls, own)
        changed.append("pr25103")
    if detect.assess_source(pr28144.HOTFIX, str(path)).verdict.value == "affected":
        fixed_path = release_selection.release_dir(fp8_cases.FIXED_RELEASE) / fp8_cases.BACKEND
        fixed = fp8_cases._methods(fp8_cases._backend_class(fixed_path))
        cls.body.extend(fixed[name] for name in fp8_cases.UPSTREAM_HELPERS if name not in own)
        for name in fp8_cases.METHODS:
            fp8_cases._apply_fix(own[name], fixed[name])
        changed.append("pr28144")
    if detect.assess_source(pr31667.HOTFIX, str(path)).verdict.value == "affected":
        packed = fp8_cases._methods(
            fp8_cases._backend_class(release_selection.release_dir("0.5.16") / fp8_cases.BACKEND)
        )
        fp8_cases._apply_packed_query(own["forward_decode"], packed["forward_decode"])
        changed.append("pr31667")
    if _affected(encoder_only_mask.HOTFIX, path):
        fixed = fp8_cases._methods(
            fp8_cases._backend_class(release_selection.release_dir(ENCODER_ONLY_FIXED_RELEASE) / fp8_cases.BACKEND)
        )
        fp8_cases._apply_encoder_only_mask(own["forward_extend"], fixed)
        if "AttentionType" not in {
            a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names
        }:
            _add_import(tree, ATTENTION_TYPE_IMPORT)
        changed.append("encoder_only_mask")
    header = "# SGLang %s's trtllm_mha_backend.py with upstream's changes for %s (tools/anchor_source.py)\n" % (
        release,
        ", ".join(changed),
    )
    return header + ast.unparse(ast.fix_missing_locations(tree)) + "\n", changed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", default="0.5.12")
    parser.add_argument("--out", default=str(HERE.parent / ".gpu" / "anchor"))
    options = parser.parse_args()
    source, changed = anchor_source(options.release)
    out = pathlib.Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / NAME).write_text(source, encoding="utf-8")
    print("wrote %s (%d bytes): SGLang %s with %s" % (out / NAME, len(source), options.release, ", ".join(changed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
