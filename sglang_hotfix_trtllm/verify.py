"""``sglang-hotfix-trtllm verify``: run the fix on the installed SGLang, on CPU.

Imports torch and SGLang's real backend module (unlike ``status``), then runs
the record's probe. Exit 0 only when the patched result equals upstream's; 0
too when there is nothing to verify (fixed, not-applicable); 1 when it differs,
or when a switch turns the record off (the switches are read as the import
hook reads them: ``engine.decide``); 2 when torch or SGLang cannot be
imported, the source is unknown, or the probe fails.
"""

import importlib
import sys

from . import detect, engine, switches
from .record import Verdict

EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 2


def _load(dotted):
    module_name, _, function = dotted.partition(":")
    return getattr(importlib.import_module(module_name), function)


def verify(hotfix, out, err, failed_imports=None):
    """Results through ``out`` (stdout), errors through ``err`` (stderr). ``failed_imports``
    (module -> error), shared by the records of one run, says a failed import once: the next
    record that needs the module points to it instead of repeating it."""
    failed_imports = {} if failed_imports is None else failed_imports
    assessment = detect.assess_installed(hotfix)
    out("record %s: %s: %s (%s)" % (hotfix.name, hotfix.target, assessment.verdict, assessment.reason))
    if not detect.distribution_installed(hotfix):
        package = hotfix.module.split(".")[0]
        if package in failed_imports:  # said once, as a failed import is
            err("record %s: cannot verify: %s is not installed (said above)" % (hotfix.name, package))
        else:
            failed_imports[package] = None
            err(
                "record %s: cannot verify: SGLang is not installed for this Python (%s; its sys.path has no %s "
                "package)" % (hotfix.name, sys.executable, package)
            )
        return EXIT_ERROR
    if assessment.verdict in (Verdict.FIXED, Verdict.NOT_APPLICABLE):
        out("nothing to verify: the hotfix does not patch this SGLang")
        return EXIT_OK
    if assessment.verdict is Verdict.UNREPAIRABLE:
        out(
            "NOT VERIFIED: record %s recognises the bug here but cannot repair it exactly; processes here run "
            "SGLang's code unpatched" % hotfix.name
        )
        return EXIT_MISMATCH
    if assessment.verdict is Verdict.UNKNOWN:
        err(
            "record %s: cannot verify: the installed code is not recognised (fingerprint %s)"
            % (hotfix.name, assessment.fingerprint)
        )
        return EXIT_ERROR
    decision = engine.decide(hotfix, assessment, switches.read())
    if decision.action in (engine.Action.DISABLED, engine.Action.EXCLUDED):
        # What a process does here is what matters: it would run SGLang's code unpatched.
        out(
            "NOT VERIFIED: record %s is turned off (%s); processes here run SGLang's code unpatched"
            % (hotfix.name, decision.why)
        )
        return EXIT_MISMATCH
    if hotfix.probe is None:
        out(
            "not verified here: record %s has no CPU probe (its proof: the differential tests on every affected "
            "release and the GPU run, see the README)" % hotfix.name
        )
        return EXIT_OK
    for name in ("torch", hotfix.module):
        if name in failed_imports:
            err("record %s: cannot verify: %s could not be imported (said above)" % (hotfix.name, name))
            return EXIT_ERROR
        try:
            module = importlib.import_module(name)
        except Exception as error:
            failed_imports[name] = error
            err(
                "record %s: cannot verify: cannot import %s: %s: %s (verify runs SGLang's backend on CPU: it needs "
                "torch and SGLang's own dependencies in this environment)"
                % (hotfix.name, name, type(error).__name__, error)
            )
            return EXIT_ERROR
    try:
        report = _load(hotfix.probe)(module)
    except Exception as error:
        err("record %s: probe failed: %s: %s" % (hotfix.name, type(error).__name__, error))
        return EXIT_ERROR
    out(report.title)
    header = ("field", "unpatched", "patched", "upstream fix")
    widths = [max(len(row[i]) for row in (header,) + report.rows) for i in range(4)]
    for row in (header,) + report.rows:
        out("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    out(report.detail)
    out(
        "OK: the patched method equals upstream's fix"
        if report.patched_equals_upstream
        else "MISMATCH: the patched method differs from upstream's fix"
    )
    return EXIT_OK if report.patched_equals_upstream else EXIT_MISMATCH
