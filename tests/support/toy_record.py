"""A second hotfix, as one record, for a toy module: the proof that adding a
hotfix touches no engine file. The bug: ``toy_pkg.toy_module.Counter.next_value``
returns ``value`` where upstream (toy PR #1) returns ``value + 1``.

Everything generic comes from the package (``detect`` for the live
definitions); only what is specific to this bug is here.
"""

import ast

from sglang_hotfix_trtllm import detect
from sglang_hotfix_trtllm.fingerprint import of_node
from sglang_hotfix_trtllm.record import Classification, Hotfix, Verdict

MODULE = "toy_pkg.toy_module"
BUGGY = "def next_value(self, value):\n    return value\n"
FIXED = "def next_value(self, value):\n    return value + 1\n"
# The bug, in a shape the toy record recognises but cannot repair exactly (it would have to add 2).
UNREPAIRABLE = "def next_value(self, value):\n    return value - 1\n"
UNREPAIRABLE_REASON = (
    "next_value returns value - 1: a wrapper adding one cannot give upstream's value; upgrade to toy 2.0"
)


def module_source(method_source):
    body = "".join("    " + line + "\n" for line in method_source.splitlines())
    return "class Counter:\n" + body


def classify(tree):
    cls, problem = detect.live_class(tree, "Counter")
    if cls is None:
        return Classification(Verdict.UNKNOWN, problem, of_node(tree))
    method, problem = detect.live_method(tree, cls, "next_value")
    if method is None:
        return Classification(Verdict.UNKNOWN, problem or "next_value not found", of_node(cls))
    body = ast.unparse(method)
    verdict = {
        ast.unparse(ast.parse(BUGGY)): Verdict.AFFECTED,
        ast.unparse(ast.parse(FIXED)): Verdict.FIXED,
        ast.unparse(ast.parse(UNREPAIRABLE)): Verdict.UNREPAIRABLE,
    }.get(body, Verdict.UNKNOWN)
    reason = UNREPAIRABLE_REASON if verdict is Verdict.UNREPAIRABLE else "next_value is the %s one" % verdict
    return Classification(verdict, reason, of_node(method), detect.first_line_of(method))


def add_one(module, wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs) + 1


# Only what differs from the defaults: no release table, no probe, no summary.
TOY = Hotfix(
    name="toy1",
    upstream="toy PR #1",
    effect="next_value now counts",
    distribution="toy-dist",
    target=MODULE + ".Counter.next_value",
    classify=classify,
    wrapper=add_one,
)


def register():
    """What adding the record to the package would do: list it in the catalog,
    its module in the startup module's WATCHED_MODULES, and the .pth line
    written from them (run here as site runs it, in place of the installed one)."""
    import sglang_hotfix_trtllm_autoload
    from sglang_hotfix_trtllm.records import catalog

    catalog.HOTFIXES = catalog.HOTFIXES + (TOY,)
    sglang_hotfix_trtllm_autoload.WATCHED_MODULES = sglang_hotfix_trtllm_autoload.WATCHED_MODULES | {MODULE}
    sglang_hotfix_trtllm_autoload.uninstall()
    exec(sglang_hotfix_trtllm_autoload.startup_line(), {})
