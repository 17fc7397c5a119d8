"""Operator command line (``sglang-hotfix-trtllm`` or ``python -m sglang_hotfix_trtllm``).

* ``status [--json] [--source PATH | --pid PID | --processes]``: never imports SGLang or torch.
* ``verify``: imports SGLang's backend on CPU and compares patched, unpatched
  and upstream-fixed capture (see ``verify``).
* ``run -- COMMAND``: run COMMAND with the hotfix loaded in it and its Python
  children, for installs outside site-packages (see ``launcher``).

Conventions, as pip's and opentelemetry-instrument's: stdout holds only the
result; every error and diagnostic goes to stderr, and nowhere when stderr is
closed; each verb's ``--help`` lists its exit statuses and the variables it
reads. Bad arguments: usage on stderr, exit 2.
"""

import argparse
import json
import os
import sys

from . import __version__
from .records import catalog
from .record import Verdict

SWITCHES_HELP = """environment variables read:
  SGLANG_HOTFIX_TRTLLM_DISABLE=1   the hotfix does nothing
  SGLANG_HOTFIX_TRTLLM_DISABLE=pr25103  the records named (comma-separated) do nothing, the others apply
  SGLANG_HOTFIX_TRTLLM_STRICT=1    an import the hotfix cannot patch is stopped
  SGLANG_HOTFIX_TRTLLM_ACCEPT=xqa_draft_extend  status: the bugs of the records named that cannot be repaired
                                   here are still named, and do not fail the check (exit 0, not 1)
  SGLANG_HOTFIX_TRTLLM_STATE_DIR=DIR  where each process records what the hotfix did (status --pid reads it);
                                   default /tmp/sglang-hotfix-trtllm-UID
  SGLANG_PLUGINS=a,b               SGLang's plugin allowlist; without sglang_hotfix_trtllm the hotfix stands aside"""

STATUS_HELP = (
    """exit status:
  0  protected, or nothing to do (fixed, not-applicable, or unrepairable and accepted by --accept)
  1  affected, but a Python process started now would run it unpatched (disabled, excluded, no loader),
     or a bug the record recognises but cannot repair exactly here (unrepairable), not accepted
  2  the hotfix would refuse: unknown code, or wrapt missing or broken; or this Python has no SGLang
     (the plugin installed with another interpreter's pip)
  3  cannot tell: --source names a path that cannot be examined (missing, not a Python source file, no
     backend file in it, unreadable), or a part of the folder cannot be read (the verdicts of what could
     be read are still printed); --pid names no running process, or one whose state cannot be read
  64 bad arguments (usage on stderr)
with --source, 0 to 2 answer for the code read, as if the plugin were installed by pip where it runs:
  0  every file would be protected or has nothing to do; 1  a file has a bug a record recognises but
  cannot repair; 2  a file's code is not recognised. The first line says it in the same words
with --pid PID, for that running process, from what it recorded (SGLANG_HOTFIX_TRTLLM_STATE_DIR, else
/tmp/sglang-hotfix-trtllm-UID): 0  patched, or nothing to do there (seen, not assumed); 1  a bug runs
unpatched there (turned off, remove() called, started before the install, unrepairable); 2  the hotfix
refused there; 3  CANNOT TELL: no such process, its state unreadable (another user's: ask as root), or it
recorded nothing and nothing seen says why. A process that started SGLang processes answers for them.
--processes: every SGLang process here, the first line the worst of them (2, then 1, then 3, then 0)

"""
    + SWITCHES_HELP
)

VERIFY_HELP = (
    """exit status:
  0  for every record, the patched method equals upstream's fix, or there is nothing to verify
     (fixed, not-applicable), or a bug the record recognises but does not repair is accepted by name
     (SGLANG_HOTFIX_TRTLLM_ACCEPT)
  1  it does not, a switch turns a record off (SGLANG_HOTFIX_TRTLLM_DISABLE, SGLANG_PLUGINS), or a
     bug the record recognises but does not repair (FlashInfer's own kernel bugs included) is not
     accepted
  2  torch or SGLang cannot be imported (or this Python has no SGLang), the code is unknown, or the
     probe failed
  3  a record has a bug here that no CPU probe can show repaired (a repair only a GPU kernel receives):
     left unverified, and its line says where its proof is
the worst of these across records (2, then 1, then 3, then 0); the last line sums them up

"""
    + SWITCHES_HELP
)

RUN_HELP = (
    """exit status: the command's; 126 or 127 when it cannot be started; 2 without a command.

environment: PYTHONPATH is handed on with the bootstrap folder first; the variables
below are read by the hotfix inside the command's Python processes.

"""
    + SWITCHES_HELP
)


def diagnose(message):
    """One line on stderr, and only there: never on stdout, whatever state
    stderr is in (``print(file=None)`` would fall back to stdout). The startup
    module's writer, so that both say it the same way."""
    import sglang_hotfix_trtllm_autoload

    if not message.isprintable():  # one line, whatever a path in it holds (a newline, an escape)
        message = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in message)
    sglang_hotfix_trtllm_autoload._say(message)


def _write_result(text, code):
    """Write the result to stdout and return ``code``: the exit status is the result's whatever
    happens to stdout. Its reader gone (`status | head`), stdout closed (`>&-`), full
    (`>/dev/full`) or short of room (a nearly full disk, where Python's writer drops what did not
    fit without a word): one line on stderr where the result was not written whole, no
    traceback. Characters stdout's encoding lacks are escaped, not a reason to lose the result."""
    if sys.stdout is None:  # started with stdout closed: Python sets sys.stdout to None
        diagnose("stdout is closed: the result was not written (exit status %d)" % code)
        _silence_stdout()  # said once: later writes of the same result go nowhere, silently
        return code
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a stdout without a descriptor (a host's stream object)
        fd = None
    data = text.encode(getattr(sys.stdout, "encoding", None) or "utf-8", "backslashreplace")
    written = 0
    try:
        if fd is None:
            sys.stdout.write(text)
            sys.stdout.flush()
            return code
        sys.stdout.flush()  # what Python buffered before goes first
        while written < len(data):
            step = os.write(fd, data[written:])
            if step <= 0:
                raise OSError("the device took no more bytes")
            written += step
    except BrokenPipeError:  # the reader left on purpose (`| head`): not worth a line
        _silence_stdout()
    except (OSError, ValueError) as error:  # ENOSPC, EBADF, a closed file object
        diagnose(
            "cannot write the result to stdout: %s (%d of %d bytes written; exit status %d)"
            % (error, written, len(data), code)
        )
        _silence_stdout()
    return code


def _silence_stdout():
    # Python flushes stdout again at exit; point it at /dev/null (and drop what is still
    # buffered) so that flush does not fail a second time and change the exit status.
    try:
        if sys.stdout is not None:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except Exception:
        pass
    try:
        sys.stdout = open(os.devnull, "w")
    except Exception:
        pass


DETAILS = "every record's whole report: add --verbose (or --json)"


def _human(report, state):
    lines = [state.headline(report)] if "would_patch" in report else []
    width = max(len(key) for key in report)
    lines += [
        "%-*s  %s" % (width, key, state.readable(value)) for key, value in report.items() if key != "format_version"
    ]
    return "\n".join(lines) + "\n"


def _edit_text(hotfix, report, assessment):
    """For a record whose repair is an edit and that would patch here: the edit, as a diff."""
    if hotfix.mechanism != "edit" or report.get("decision") != "patch" or not assessment.source_path:
        return ""
    from . import code_edit

    diff = code_edit.edit_diff(hotfix, assessment.source_path)
    return "the code it runs, against SGLang's:\n%s\n" % diff if diff else ""


def status(arguments):
    from . import detect, source, status as state

    by_argument = frozenset()
    if arguments.accept:  # the same as the variable, for this status only (merged with it)
        from .switches import ACCEPT, record_names

        by_variable = record_names(os.environ.get(ACCEPT, ""))
        by_argument = frozenset(record_names(",".join(arguments.accept))).difference(by_variable)
        os.environ[ACCEPT] = ",".join(filter(None, [os.environ.get(ACCEPT, "")] + arguments.accept))
    state.ACCEPTED_BY_ARGUMENT = by_argument  # the first line names what accepted each (this call's alone)
    if arguments.json and arguments.verbose:
        diagnose("status: --verbose adds nothing to --json, which holds every key of every record")
    if arguments.pid is not None or arguments.processes:
        if arguments.source is not None or (arguments.pid is not None and arguments.processes):
            diagnose("status: --pid, --processes and --source each ask another question: give one")
            return state.EXIT_USAGE
        return _status_of_processes(arguments, state)
    if arguments.source is not None:  # --source "" is a path that cannot be examined (exit 3), not "installed"
        with detect.shared_parses(), state.shared_walks():  # one walk, one parse per file, for all records
            return _status_of_source(arguments, state)
    # `python -m sglang_hotfix_trtllm` puts the current folder first on sys.path: an SGLang there would
    # be judged as the installed one. It is judged as what it is, below (``current_folder_sglang``).
    own_folder = sys.path[:1] if sys.path and sys.path[0] in ("", state.current_folder()) else []
    del sys.path[: len(own_folder)]
    try:
        reports, texts, worst = _judged(arguments, state, detect, source)
    finally:
        sys.path[:0] = own_folder
    headline = state.overall_headline(reports, worst)
    if not any(report["sglang_installed"] for report in reports):
        diagnose(headline)
    extra = {}
    # An SGLang in the current folder: processes started here import it, not the installed one.
    installed_path = next((r.get("source_path") for r in reports if r.get("source_path")), None)
    found = state.current_folder_sglang(installed_path)
    if found is not None:
        headline, worst, extra["current_folder_sglang"], here = _current_folder(found, headline, worst, state, source)
    # Several copies of the plugin: which one a process runs depends on its path.
    copies = state.plugin_copies()
    copies_text, differ = state.copies_line(copies)
    if differ and worst == state.EXIT_OK:  # this copy's answer is not every process's
        headline = "CANNOT TELL: %s; what this copy (%s) says: %s" % (copies_text, state.__version__, headline)
        worst = state.EXIT_UNKNOWN
    extra["plugin_copies"] = copies
    if arguments.json:
        # Format 2: the answer across every record (the text's first line, the exit status) and
        # the environment at the top level, each record's report under "hotfixes".
        document = dict(state.environment_document(reports, headline, worst), **extra)
        return _write_result(json.dumps(document, indent=2, sort_keys=True) + "\n", worst)
    notes = [copies_text] if copies_text else []
    if arguments.verbose:
        return _write_result("\n".join([headline] + notes) + "\n\n" + "\n".join(texts), worst)
    width = max(len(report["hotfix"]) for report in reports)
    records = [state.record_line(r, width) for r in reports]
    if not any(report["sglang_installed"] for report in reports):
        # Nine "not-applicable  nothing to do" lines read as all is well under a CANNOT PATCH line.
        records = ["  every record  not-applicable  this Python has no SGLang: nothing here is patched or protected"]
    if found is not None:
        records += ["", here] + [state.record_line(r, width) for r in extra["current_folder_sglang"]["hotfixes"]]
    lines = [headline, ""] + records
    lines += ["", state.environment_line(reports[0])] + notes + [DETAILS]
    return _write_result("\n".join(lines) + "\n", worst)


def _judged(arguments, state, detect, source, path=None):
    """(reports, --verbose texts, exit status) of every record on the installed SGLang (or on the
    backend file ``path``, as this environment's processes would import it); refusals said on stderr."""
    reports, texts, worst = [], [], state.EXIT_OK
    # The records read one file (parsed once) and one FlashInfer's metadata (read once).
    with detect.shared_parses(), source.remembering():
        assessed = [(hotfix,) + state.of_environment(hotfix, path) for hotfix in catalog.HOTFIXES]
    for hotfix, report, assessment, code in assessed:
        if code == state.EXIT_ERROR and report["sglang_installed"]:  # without SGLang: said once, below
            diagnose(
                "%s: %s: %s"
                % (
                    hotfix.name,
                    assessment.verdict,
                    report["would_patch_reason"] if assessment.verdict is not Verdict.UNKNOWN else assessment.reason,
                )
            )
        reports.append(report)
        if arguments.verbose:  # the blocks are printed only on request
            texts.append(_human(report, state) + _edit_text(hotfix, report, assessment))
        worst = state.worst(worst, code)
    return reports, texts, worst


def _current_folder(found, headline, code, state, source):
    """The answer where the current folder holds an SGLang package that processes started there
    import before the installed one: that package judged as they would run it, and one first line
    for both (the worse of the two answers, naming the package). Returns (first line, exit status,
    the package's document, the line that opens its records)."""
    from . import detect

    backend, package, started_in = found
    reports, _, here_code = _judged(argparse.Namespace(verbose=False), state, detect, source, backend)
    version = next((r["sglang_version"] for r in reports if r.get("sglang_version")), None) or "(version unknown)"
    subject = "SGLang %s at %s" % (version, _shown(package))
    here_line = state.overall_headline(reports, here_code, subject=subject)
    both = state.worst(code, here_code)
    word = state.HEADLINE_WORDS[both] or (
        "PROTECTED" if "PROTECTED" in (headline.split(":")[0], here_line.split(":")[0]) else "NOTHING TO DO"
    )
    opening = "processes started in %s import %s before the installed SGLang" % (
        "this folder (%s)" % _shown(started_in) if started_in == state.current_folder() else _shown(started_in),
        _shown(package),
    )
    if word != "NOTHING TO DO":  # "it can be removed" is true only where both answers say it
        removal = "; it can be removed (%s)" % state.engine.UNINSTALL_HINT
        here_line, headline = here_line.replace(removal, ""), headline.replace(removal, "")
    first = "%s: %s; there: %s; the installed SGLang: %s" % (word, opening, here_line, headline)
    document = {
        "location": package,
        "source_path": backend,
        "sglang_version": version,
        "headline": here_line,
        "exit_status": here_code,
        "hotfixes": reports,
    }
    return first, both, document, "%s (SGLang %s), each record:" % (opening, version)


def _status_of_processes(arguments, state):
    """``status --pid PID`` (what that running process recorded) or ``status --processes`` (every
    SGLang process here, with its own answer)."""
    if arguments.processes:
        headline, code, answers = state.of_processes()
        if arguments.json:
            document = {
                "format_version": state.FORMAT_VERSION,
                "headline": headline,
                "exit_status": code,
                "processes": [dict(doc, headline=line, exit_status=c) for _, line, c, doc in answers],
            }
            return _write_result(json.dumps(document, indent=2, sort_keys=True) + "\n", code)
        lines = [headline, ""] + ["%-8d %s" % (pid, line) for pid, line, _, _ in answers]
        return _write_result("\n".join(lines) + "\n", code)
    try:
        headline, code, document = state.of_process(arguments.pid)
    except state.PathProblem as problem:
        diagnose("status --pid: %s" % problem)
        return state.EXIT_BAD_PATH
    if str(document.get("looked_for", "")).startswith("not trusted"):
        diagnose("status --pid: the state folder is %s: what it holds is not read" % document["looked_for"])
    if arguments.json:
        document = dict(document, format_version=state.FORMAT_VERSION, headline=headline, exit_status=code)
        return _write_result(json.dumps(document, indent=2, sort_keys=True) + "\n", code)
    texts = []
    for report in document.get("hotfixes", ()) if "why" not in document else ():  # one reason for all: said once
        what = "patched" if report["would_patch"] else report["would_patch_reason"]
        if what.startswith("nothing to patch"):  # the verdict in brackets says why ("fixed (verdict fixed)")
            what = "nothing to patch"
        texts.append(
            "record %s: %s" % (report["hotfix"], what)
            if report["verdict"] == "not-loaded"
            else "record %s (%s): %s; %s" % (report["hotfix"], report["verdict"], what, report["reason"])
        )
    command = " ".join(_shown(word) for word in document.get("command") or ()) or "(command line not readable)"
    lines = [headline, "", "process %d: %s" % (arguments.pid, command)]
    if document.get("state_file"):
        lines.append("state file: %s" % _shown(document["state_file"]))
    if "flashinfer_source" in document:  # the FlashInfer kernel records' verdicts depend on it
        lines.append(_shown(state.flashinfer_text(document)))
    if isinstance(document.get("recorded_at"), (int, float)):
        lines.append(
            "recorded at: %s (when it handled its records; this is what it recorded then, not a look inside it now)"
            % state._when(document["recorded_at"])
        )
    return _write_result("\n".join(lines + texts) + "\n", code)


def _status_of_source(arguments, state):
    texts, documents, worst = [], [], state.EXIT_OK
    # One stderr line per distinct message, naming the records that give it: an image root's scan
    # wrote the same line once per record for every file not recognised (521 lines for 314 files).
    unknown = {}
    for hotfix in catalog.HOTFIXES:
        try:
            tree, assessments, code = state.of_tree(hotfix, arguments.source)
        except state.PathProblem as problem:
            diagnose("status --source: %s" % problem)
            return state.EXIT_BAD_PATH
        if hotfix is catalog.HOTFIXES[0]:  # the same walk for every record: said once
            for problem in tree["unreadable"]:
                diagnose("status --source: cannot read %s (the verdicts cover only what could be read)" % problem)
            for hint in tree.get("not_followed", ()):
                diagnose("status --source: %s" % hint)
        single = os.path.isfile(arguments.source)
        documents.append(dict(tree["sources"][0], hotfix=hotfix.name) if single else dict(tree, hotfix=hotfix.name))
        for assessment in assessments:
            if assessment.verdict is Verdict.UNKNOWN:
                message = "%s: %s: %s" % (state.shown(assessment.source_path), assessment.verdict, assessment.reason)
                unknown.setdefault(message, []).append(hotfix.name)
        sources = [documents[-1]] if single else documents[-1]["sources"]
        if arguments.verbose:
            texts.append("".join(_human(r, state) + ("\n" if len(sources) > 1 else "") for r in sources))
        worst = max(worst, code)
    for message, records in unknown.items():
        diagnose("%s: %s" % (", ".join(records), message))
    lines, code = _source_headlines(documents, state)
    worst = max(worst, code)  # a part of the folder that could not be read keeps its 3
    if arguments.json:
        # As for the environment (format 2): the answer across every record and file at the top level
        # (with the folder's root and what could not be read), every record's document under "hotfixes".
        document = {"format_version": state.FORMAT_VERSION, "headline": lines[0], "exit_status": worst}
        if not os.path.isfile(arguments.source):
            document.update(
                root=documents[0]["root"],
                unreadable=documents[0]["unreadable"],
                not_followed=documents[0]["not_followed"],
            )
        document["hotfixes"] = [{k: v for k, v in d.items() if k != "format_version"} for d in documents]
        if len(lines) > 1:
            document["file_headlines"] = lines[1:]
        return _write_result(json.dumps(document, indent=2, sort_keys=True) + "\n", worst)
    if not arguments.verbose:
        return _write_result("\n".join(lines + ["", DETAILS]) + "\n", worst)
    return _write_result("\n".join(lines) + "\n\n" + "\n".join(texts), worst)


def _source_headlines(documents, state):
    """(lines, exit status): the first line of ``status --source`` for what was judged, in the words
    of ``status`` for an installed SGLang, read as "with the plugin installed by pip where this
    code runs"; for a folder, an opening line across its files, then one line per file."""
    verdicts, reasons = {}, {}  # path -> {record: verdict}, {record: reason}
    for document in documents:
        for report in document.get("sources", [document]):
            verdicts.setdefault(report["source_path"], {})[report["hotfix"]] = report["verdict"]
            reasons.setdefault(report["source_path"], {})[report["hotfix"]] = report.get("reason")
    upstreams = {hotfix.name: hotfix.upstream for hotfix in catalog.HOTFIXES}
    # --accept (and the variable) count here as for an installed SGLang: a file of 0.5.10 on reaches
    # FlashInfer kernels whose bugs only the FlashInfer beside it would clear.
    from .switches import read

    accepted = read().accepted_records
    judged = [
        state.headline_of_verdicts(_shown(path), by_record, upstreams, accepted, reasons[path])
        for path, by_record in verdicts.items()
    ]
    code = max(file_code for _, file_code in judged)
    if len(judged) == 1:
        return [judged[0][0]], code
    words = [line.split(":", 1)[0] for line, _ in judged]
    word = {2: "CANNOT PATCH", 1: "NOT PROTECTED"}.get(code) or (
        "PROTECTED" if "PROTECTED" in words else "NOTHING TO DO"
    )
    counts = ", ".join("%d %s" % (words.count(w), w) for w in dict.fromkeys(words))
    return ["%s: %d backend files: %s (one line each below)" % (word, len(judged), counts)] + [
        line for line, _ in judged
    ], code


def _shown(path):
    """A path as one line can carry it (``status.shown``)."""
    from .status import shown

    return shown(path)


def verify(arguments):
    from . import verify as verifying

    results, failed_imports = [], {}
    out = (lambda line: None) if arguments.json else _result_line  # --json: one document, nothing else
    for hotfix in catalog.HOTFIXES:  # a record without a CPU probe says so (never silently skipped)
        results.append({})
        verifying.verify(hotfix, out, diagnose, failed_imports, results[-1])
    code = verifying.worst(r["exit_status"] for r in results)
    summary = verifying.summary(results, code)
    if arguments.json:
        document = {"format_version": 1, "exit_status": code, "summary": summary, "records": results}
        return _write_result(json.dumps(document, indent=2, sort_keys=True) + "\n", code)
    return _write_result(summary + "\n", code)


def _result_line(line):
    _write_result(line + "\n", 0)


def launch(arguments):
    from . import launcher

    command = arguments.command[1:] if arguments.command[:1] == ["--"] else arguments.command
    return launcher.run(command)


class _Parser(argparse.ArgumentParser):
    """Bad arguments exit 64 (sysexits' EX_USAGE), never 2 or 3, which are answers of status."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(64, "%s: error: %s\n" % (self.prog, message))


class _Once(argparse.Action):
    """An option given once: a second value is an error, not silently the one taken."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest) is not None:
            parser.error(
                "%s given twice (%r and %r): give one" % (option_string, getattr(namespace, self.dest), values)
            )
        setattr(namespace, self.dest, values)


def _parser():
    summary = "\n".join("  %s: %s (%s)" % (h.name, h.summary, h.upstream) for h in catalog.HOTFIXES)
    parser = _Parser(
        prog="sglang-hotfix-trtllm",
        description="Hotfixes for installed SGLang releases, one record each:\n%s" % summary,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=SWITCHES_HELP,
    )
    parser.add_argument("-V", "--version", action="version", version="%(prog)s " + __version__)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{status,verify,run}")
    status_parser = verbs.add_parser(
        "status",
        help="verdict on the installed SGLang and whether a new process would be patched",
        description="Read the installed SGLang's source (never importing SGLang or torch) and say what a Python "
        "process started now would do: the verdict, and whether it would be patched.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=STATUS_HELP,
    )
    status_parser.add_argument("--json", action="store_true", help="print one JSON object (with a format_version key)")
    status_parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="after the first line, every record's whole report (one block each) instead of one line per record",
    )
    files = ", ".join(sorted({h.module.rpartition(".")[2] + ".py" for h in catalog.HOTFIXES}))
    status_parser.add_argument(
        "--accept",
        action="append",
        metavar="NAMES",
        help="the records (comma-separated) whose bug this hotfix cannot repair here you accept: still named, "
        "they do not fail the check (as SGLANG_HOTFIX_TRTLLM_ACCEPT)",
    )
    status_parser.add_argument(
        "--source",
        action=_Once,
        metavar="PATH",
        help="classify this source file (%s), or every one under this folder, instead of the installed one" % files,
    )
    status_parser.add_argument(
        "--pid",
        type=int,
        metavar="PID",
        help="say what the running process PID has applied (each record: patched, turned off and why, refused), "
        "from the state it wrote when it imported SGLang's backend",
    )
    status_parser.add_argument(
        "--processes",
        action="store_true",
        help="list the SGLang processes of this host or container, each with its own answer (as --pid)",
    )
    status_parser.set_defaults(run=status)
    verify_parser = verbs.add_parser(
        "verify",
        help="run the fix on the installed SGLang on CPU and compare with upstream's",
        description="Import the installed SGLang's backend on CPU and run the patched method, the unpatched one and "
        "upstream's fix side by side on small inputs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=VERIFY_HELP,
    )
    verify_parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: format_version, exit_status, summary, and each record's outcome",
    )
    verify_parser.set_defaults(run=verify)
    run_parser = verbs.add_parser(
        "run",
        help="run COMMAND with the hotfix loaded (installs outside site-packages)",
        usage="%(prog)s -- COMMAND [ARGS...]",
        description="Run COMMAND with the hotfix armed in it and in every Python process it starts, for a plugin "
        "installed with `pip install --target DIR` where no .pth file is read.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=RUN_HELP,
    )
    run_parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    run_parser.set_defaults(run=launch)
    parser.verb_parsers = {"status": status_parser, "verify": verify_parser, "run": run_parser}
    return parser


def main(argv=None):
    parser = _parser()
    arguments, unknown = parser.parse_known_args(argv)  # exits 2 with usage on bad arguments
    if unknown:  # an option the verb does not take: the verb's own usage, not the top level's
        parser.verb_parsers[arguments.verb].error("unrecognized arguments: %s" % " ".join(unknown))
    try:
        return arguments.run(arguments)
    except BrokenPipeError:  # the reader of stdout left; not an error of ours
        _silence_stdout()
        return 0
