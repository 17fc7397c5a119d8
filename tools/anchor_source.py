"""Maintainer tool (issue 38): SGLang's backend module with upstream's changes for the records that
apply inserted into its own source: the anchor an upgrade would cost, for the in-process cost
comparison on the H200 (``tests/gpu/decode_step_anchor_worker.py``).

    .venv/bin/python tools/anchor_source.py [--release 0.5.12] [--out .gpu/anchor]

Writes ``<out>/trtllm_mha_backend_anchor.py``: the release's ``trtllm_mha_backend.py`` (fetched into
the test cache, never committed) with the same AST changes the CPU oracles make (``fp8_cases``):
PR #28144 as revised by PR #29423 (0.5.15's two helpers on the class, 0.5.15's scale statements and
FP8 cast in ``forward_decode`` and ``forward_extend``) and PR #31667 (0.5.16's ``if
self.is_xqa_impl: q = q.contiguous().view(...)`` in ``forward_decode``), each where the release has
the bug. Nothing else of the file changes; ``ast.unparse`` writes it (line numbers differ).
"""

import argparse
import ast
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE.parent / "tests" / "support"), str(HERE)]

import fp8_cases  # noqa: E402
import release_selection  # noqa: E402
from sglang_hotfix_trtllm import detect  # noqa: E402
from sglang_hotfix_trtllm.records import pr28144, pr31667  # noqa: E402

NAME = "trtllm_mha_backend_anchor.py"


def anchor_source(release):
    """The release's backend file with upstream's changes for its affected records (pr28144,
    pr31667) inserted; returns (source, the records changed)."""
    release_dir = release_selection.release_dir(release)
    path = release_dir / fp8_cases.BACKEND
    tree = ast.parse(path.read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == fp8_cases.CLASS_NAME]
    own = fp8_cases._methods(cls)
    changed = []
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
