"""What a hotfix is, as data: the generic engine reads these records.

Standard library only. A record names its target (module, class, method),
the upstream change it backports, how to classify a source of the target
module, and the wrapper that repairs the method. The engine
(``sglang_hotfix_trtllm.engine``) knows nothing about any particular bug:
a second hotfix would be a second record in ``catalog.HOTFIXES``.
"""

import enum
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Tuple


class Verdict(str, enum.Enum):
    AFFECTED = "affected"  # the bug is there and the wrapper is known to repair it
    FIXED = "fixed"  # upstream already carries the fix
    NOT_APPLICABLE = "not-applicable"  # no SGLang, or no target module
    UNKNOWN = "unknown"  # anything else: never patched

    def __str__(self):
        return self.value


@dataclass(frozen=True)
class Classification:
    """A record's judgement of one source file of its target module."""

    verdict: Verdict
    reason: str
    fingerprint: Optional[str] = None
    # First line of the target method (decorators included), to check that the
    # function object about to be wrapped was compiled from the analysed code.
    method_first_line: Optional[int] = None


@dataclass(frozen=True)
class Hotfix:
    name: str  # short id, used in logs and JSON
    upstream: str  # human reference to the upstream fix
    distribution: str  # distribution that ships the target module
    module: str
    class_name: str
    method_name: str
    first_fixed_release: str
    # classify(tree: ast.Module) -> Classification
    classify: Callable
    # wrapt wrapper: wrapper(wrapped, instance, args, kwargs)
    wrapper: Callable
    # fingerprint -> releases known to have exactly that target method, with their verdict
    known_fingerprints: Mapping[str, Tuple[Verdict, Tuple[str, ...]]] = field(default_factory=dict)
    # "module:function" run by `sglang-hotfix-trtllm verify` on the imported
    # target module: probe(module) -> ProbeReport. Imported only by verify.
    probe: Optional[str] = None

    @property
    def target(self):
        return "%s.%s.%s" % (self.module, self.class_name, self.method_name)


@dataclass(frozen=True)
class ProbeReport:
    """What `verify` shows: rows of (what, unpatched, patched, upstream) and the verdict."""

    title: str
    rows: Tuple[Tuple[str, str, str, str], ...]
    patched_equals_upstream: bool
    detail: str = ""
