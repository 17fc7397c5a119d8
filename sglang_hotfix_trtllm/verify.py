"""``sglang-hotfix-trtllm verify``: run the fix on the installed SGLang, on CPU.

Imports torch and SGLang's real backend module (unlike ``status``), then runs
the record's probe. Exit 0 only when the patched result equals upstream's; 0
too when there is nothing to verify (fixed, not-applicable), or for a bug the record recognises
but does not repair that ``SGLANG_HOTFIX_TRTLLM_ACCEPT`` names; 1 when it differs, for such a bug
not accepted, or when a switch turns the record off (the switches are read as the import
hook reads them: ``engine.decide``); 2 when torch or SGLang cannot be
imported, the source is unknown, or the probe fails; 3 when the record has
a bug here and no CPU probe, so it is left unverified (never read as all is
well: its proof is elsewhere, and the line says where).
"""

import importlib
import sys

from . import detect, engine, switches
from .record import Verdict

EXIT_OK, EXIT_MISMATCH, EXIT_ERROR, EXIT_UNVERIFIED = 0, 1, 2, 3
# How bad each outcome is, for one exit status across records (as ``status``'s): an error, then a
# difference or a record turned off, then a record left unverified, then all verified.
SEVERITY = {EXIT_OK: 0, EXIT_UNVERIFIED: 1, EXIT_MISMATCH: 2, EXIT_ERROR: 3}

# Each record's outcome (``result["outcome"]``, the summary's groups, in the summary's order).
OUTCOMES = (
    ("error", "cannot verify"),
    ("mismatch", "patched differs from upstream"),
    ("turned-off", "turned off here"),
    ("unrepairable", "recognised, not repairable here"),
    ("not-verified", "not verified here (no CPU probe)"),
    ("verified", "verified: patched equals upstream"),
    ("nothing-to-verify", "nothing to verify"),
)


def worst(codes):
    return max(codes, key=SEVERITY.__getitem__, default=EXIT_OK)


def summary(results, code):
    """The last line of ``verify``: the exit status and the records of each outcome."""
    groups = []
    for outcome, words in OUTCOMES:
        names = [r["hotfix"] for r in results if r.get("outcome") == outcome]
        if names:
            groups.append("%s: %s" % (words, ", ".join(names)))
    return "summary (exit %d): %s" % (code, "; ".join(groups) or "no record")


def _accepted_words(hotfix):
    if hotfix.name in switches.read().accepted_records:
        return "accepted by %s" % switches.ACCEPT
    return "accept it by name with %s to pass this check" % switches.ACCEPT


def _load(dotted):
    module_name, _, function = dotted.partition(":")
    return getattr(importlib.import_module(module_name), function)


def verify(hotfix, out, err, failed_imports=None, result=None):
    """Results through ``out`` (stdout), errors through ``err`` (stderr). ``failed_imports``
    (module -> error), shared by the records of one run, says a failed import once: the next
    record that needs the module points to it instead of repeating it. ``result`` (a dict), when
    given, receives what ``verify --json`` shows of the record: its ``outcome`` (``OUTCOMES``),
    ``exit_status``, ``message`` and, where a probe ran, ``title``, ``rows`` and ``detail``."""
    result = {} if result is None else result
    said, errors = [], []

    def out_(line):
        said.append(line)
        out(line)

    def err_(line):
        errors.append(line)
        err(line)

    code = _verify(hotfix, out_, err_, {} if failed_imports is None else failed_imports, result)
    if code == EXIT_ERROR:
        result["outcome"] = "error"
    result.update(exit_status=code, message=(errors if code == EXIT_ERROR and errors else said or [""])[-1])
    return code


def _verify(hotfix, out, err, failed_imports, result):
    assessment = detect.assess_installed(hotfix)
    result.update(hotfix=hotfix.name, target=hotfix.target, verdict=assessment.verdict.value, reason=assessment.reason)
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
        result["outcome"] = "nothing-to-verify"
        out("nothing to verify: the hotfix does not patch this SGLang")
        return EXIT_OK
    if assessment.verdict is Verdict.UNREPAIRABLE:
        result["outcome"] = "unrepairable"
        if hotfix.flashinfer_fix is not None:  # FlashInfer's own kernel: no SGLang code to verify
            out(
                "NOT VERIFIED: record %s: a bug of FlashInfer's kernel that SGLang's code reaches here; this hotfix "
                "never repairs it (%s); %s" % (hotfix.name, hotfix.upstream, _accepted_words(hotfix))
            )
        else:
            out(
                "NOT VERIFIED: record %s recognises the bug here but cannot repair it exactly; processes here run "
                "SGLang's code unpatched; %s" % (hotfix.name, _accepted_words(hotfix))
            )
        # accepted by name (--accept's variable, as status reads it): said, and not a failure
        return EXIT_OK if hotfix.name in switches.read().accepted_records else EXIT_MISMATCH
    if assessment.verdict is Verdict.UNKNOWN:
        err(
            "record %s: cannot verify: the installed code is not recognised (fingerprint %s)"
            % (hotfix.name, assessment.fingerprint)
        )
        return EXIT_ERROR
    decision = engine.decide(hotfix, assessment, switches.read())
    if decision.action in (engine.Action.DISABLED, engine.Action.EXCLUDED):
        # What a process does here is what matters: it would run SGLang's code unpatched.
        result["outcome"] = "turned-off"
        out(
            "NOT VERIFIED: record %s is turned off (%s); processes here run SGLang's code unpatched"
            % (hotfix.name, decision.why)
        )
        return EXIT_MISMATCH
    if hotfix.probe is None:
        # Its bug is here and nothing on this CPU shows the repair: not "all is well" (exit 3), and
        # the line cites the proof there is, record by record (never a GPU run that did not happen).
        result["outcome"] = "not-verified"
        out(
            "not verified here: record %s has no CPU probe; its proof: the differential tests against upstream's "
            "code on every affected release (docs/records.md); on a GPU: %s"
            % (hotfix.name, hotfix.gpu_proof or "none recorded")
        )
        return EXIT_UNVERIFIED
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
    result.update(
        outcome="verified" if report.patched_equals_upstream else "mismatch",
        title=report.title,
        rows=[list(row) for row in report.rows],
        detail=report.detail,
    )
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
