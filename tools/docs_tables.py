"""The parts of the docs that are data: written from the catalog and the shipped release tables.

    python tools/docs_tables.py            rewrite every generated block in place
    python tools/docs_tables.py --check    exit 1 and name the blocks that differ

A generated block sits between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` in a page of
``PAGES``. Every list of records, release range and verdict the docs state comes from here, so
adding a record or a release changes the docs by running this tool (``tests/test_docs.py`` fails
until it is run). What ``status`` says for a release is computed by ``status.overall_headline``
itself, from the shipped verdicts of that release (which ``tests/test_docs.py`` holds equal to
each release's own source): one source of truth for the README's advice and ``status``.

Run it with the test environment's Python (it imports the installed ``sglang_hotfix_trtllm``).
"""

import argparse
import pathlib
import re
import sys

from packaging.version import Version

REPO = pathlib.Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/records.md")
ACTIONS = {
    "affected": "patches",
    "fixed": "nothing: the code does what upstream's fix does",
    "not-applicable": "nothing: the code it repairs is not there",
    "unrepairable": "nothing, and says so: the bug is recognised but cannot be repaired exactly",
}


def records():
    """The catalog's records that ship a release table, in catalog order."""
    from sglang_hotfix_trtllm.records import catalog

    return [h for h in catalog.HOTFIXES if getattr(h.known_fingerprints, "path", None)]


def rows(hotfix):
    return list(hotfix.known_fingerprints.rows)


def releases():
    """Every release some record's table knows, oldest first."""
    return sorted({row["release"] for hotfix in records() for row in rows(hotfix)}, key=Version)


def shipped_verdicts_by_release():
    """release -> {record: verdict} from the shipped tables (the source's verdicts)."""
    table = {release: {} for release in releases()}
    for hotfix in records():
        for row in rows(hotfix):
            table[row["release"]][hotfix.name] = row["verdict"]
    return table


def verdicts_by_release():
    """release -> {record: verdict} as ``status`` gives them with each release's own FlashInfer
    installed (``with_pinned_flashinfer``)."""
    pins, by_name = flashinfer_pins(), {hotfix.name: hotfix for hotfix in records()}
    table = {}
    for release, verdicts in shipped_verdicts_by_release().items():
        pin = pins.get(release)
        table[release] = {name: with_pinned_flashinfer(by_name[name], v, pin) for name, v in verdicts.items()}
    return table


def with_pinned_flashinfer(hotfix, verdict, pin):
    """The verdict ``status`` gives where the release's pinned FlashInfer is installed. A FlashInfer
    kernel bug's table holds its pin's verdict already. A repair that needs something of FlashInfer
    (``Hotfix.environment``) is judged by the product from the installed kernel's files; here only the
    pin's version is known, so it is compared with the oldest FlashInfer the record knows to carry what
    the repair needs (its module's ``FLASHINFER_REPAIRABLE_FROM``): older is ``unrepairable``, as
    ``status`` says on such an install."""
    from sglang_hotfix_trtllm.flashinfer_install import has_release

    if verdict != "affected" or hotfix.environment is None or pin is None:
        return verdict
    first = getattr(record_module(hotfix), "FLASHINFER_REPAIRABLE_FROM", None)
    if first is None:
        return verdict
    return "unrepairable" if has_release(pin, first) is False else verdict


def _span(group, count=True):
    first, last = group[0], group[-1]
    if first is last:
        return first
    return "%s … %s (%d releases)" % (first, last, len(group)) if count else "%s to %s" % (first, last)


def _groups(items, key):
    """Consecutive items with the same key, as (key, [items])."""
    groups = []
    for item in items:
        if groups and groups[-1][0] == key(item):
            groups[-1][1].append(item)
        else:
            groups.append((key(item), [item]))
    return groups


def affected_spans(hotfix, verdict="affected"):
    """The record's releases of one verdict as consecutive runs, e.g. ['0.5.1 to 0.5.12.post1']."""
    groups = _groups(rows(hotfix), lambda row: row["verdict"] == verdict)
    return [_span([r["release"] for r in group], count=False) for matched, group in groups if matched]


def bug_spans(hotfix):
    """Where the record's bug runs, oldest first: the releases it repairs, and those it only reports."""
    groups = _groups(rows(hotfix), lambda row: row["verdict"])
    return [
        _span([r["release"] for r in group], count=False)
        + (" (reported, not repaired)" if verdict == "unrepairable" else "")
        for verdict, group in groups
        if verdict in ("affected", "unrepairable")
    ]


def compatibility_table(hotfix):
    """One record's releases, grouped by verdict and fingerprint (docs/records.md)."""
    lines = [
        "| SGLang releases | uploaded | verdict | fingerprint of the method | what the hotfix does |",
        "|---|---|---|---|---|",
    ]
    key = lambda row: (row["verdict"], row["fingerprint"] if row["verdict"] == "affected" else None)  # noqa: E731
    for (verdict, fingerprint), group in _groups(rows(hotfix), key):
        first, last = group[0], group[-1]
        dates = first["date"] or "?" if first is last else "%s … %s" % (first["date"] or "?", last["date"] or "?")
        action = ACTIONS.get(verdict, "refuses")
        if hotfix.flashinfer_fix is not None and verdict in ("fixed", "unrepairable"):  # the pin decides there
            action = (
                "nothing: the FlashInfer it pins has the fix"
                if verdict == "fixed"
                else "nothing, and says so: the FlashInfer it pins has the bug (FlashInfer's kernel code)"
            )
        lines.append(
            "| %s | %s | %s | %s | %s |"
            % (
                _span([r["release"] for r in group]),
                dates,
                verdict,
                "`%s`" % fingerprint if fingerprint else "–",
                action,
            )
        )
    return "\n".join(lines)


def records_table():
    """The README's list of records: what each fixes, where, as which upstream change."""
    lines = [
        "| record | what upstream's fix does | SGLang releases with the bug | the hotfix applies |",
        "|---|---|---|---|",
    ]
    for hotfix in records():
        lines.append(
            "| [`%s`](docs/records.md#%s) | %s | %s | %s |"
            % (hotfix.name, hotfix.name, hotfix.summary, ", ".join(bug_spans(hotfix)), hotfix.upstream)
        )
    return "\n".join(lines)


def status_first_line(release, verdicts, accepted=frozenset()):
    """What ``status`` prints first for ``release`` where a loader is active (a plain pip
    install), computed by status's own code (``headline_of_verdicts``, which ``status --source`` uses)."""
    from sglang_hotfix_trtllm import status

    upstreams = {hotfix.name: hotfix.upstream for hotfix in records()}
    return status.headline_of_verdicts("SGLang %s" % release, verdicts, upstreams, accepted)


def reported_somewhere():
    """The records that are reported, not repaired, on some release: what the README's build
    recipe names in ``--accept`` (a test holds the recipe to this)."""
    return [h.name for h in records() if any(v.get(h.name) == "unrepairable" for v in verdicts_by_release().values())]


def depends_on_flashinfer(hotfix, verdict):
    """Whether the record's verdict on a release with this (shipped) verdict depends on the FlashInfer
    installed beside it: a FlashInfer kernel bug wherever the code reaches the kernel (its verdict
    there is its pin's), a repair that needs something of FlashInfer, or a bug that needs it
    (``Hotfix.environment``), where the code is affected."""
    if hotfix.flashinfer_fix is not None:
        return verdict in ("unrepairable", "fixed")
    return hotfix.environment is not None and verdict == "affected"


def pin_dependents(shipped):
    """The records whose verdict, given a release's ``shipped`` verdicts, depends on its FlashInfer."""
    by_name = {hotfix.name: hotfix for hotfix in records()}
    return tuple(name for name, verdict in shipped.items() if depends_on_flashinfer(by_name[name], verdict))


def flashinfer_pins():
    """release -> the FlashInfer it pins, from the tables that record it (the FlashInfer kernel
    bugs' tables: ``tools/scan_releases.py`` reads it from the release's metadata)."""
    return {row["release"]: row["flashinfer"] for h in records() for row in rows(h) if row.get("flashinfer")}


def record_module(hotfix):
    """The module that defines ``hotfix`` (its docs-facing constants live there)."""
    import importlib

    return importlib.import_module("sglang_hotfix_trtllm.records." + hotfix.name)


def flashinfer_conditions():
    """record -> what of it depends on FlashInfer, in words (each such record's ``FLASHINFER``)."""
    found = {}
    for hotfix in records():
        module = record_module(hotfix)
        if getattr(module, "FLASHINFER", None):
            found[hotfix.name] = module.FLASHINFER
    return found


def status_rows():
    """(releases, first word, records patched, exit, exit with the recipe's --accept) runs, oldest
    first; a run also ends where the records whose verdict depends on FlashInfer change."""
    out = []
    accepted = frozenset(reported_somewhere())
    shipped = shipped_verdicts_by_release()
    for release, verdicts in verdicts_by_release().items():
        line, code = status_first_line(release, verdicts)
        word = re.match(r"[A-Z ]+[A-Z]", line).group(0)
        patched = ", ".join(name for name, verdict in verdicts.items() if verdict == "affected")
        reported = ", ".join(name for name, verdict in verdicts.items() if verdict == "unrepairable")
        depends = pin_dependents(shipped[release])
        out.append((release, word, patched, reported, code, status_first_line(release, verdicts, accepted)[1], depends))
    return [([r[0] for r in group], key[:5]) for key, group in _groups(out, lambda r: r[1:])]


def flashinfer_cell(group):
    """The FlashInfer the releases of a run pin, and the records whose verdict there depends on it."""
    pins = flashinfer_pins()
    pinned = [pins.get(release, "?") for release in group]
    span = pinned[0] if len(set(pinned)) == 1 else "%s to %s" % (pinned[0], pinned[-1])
    depends = pin_dependents(shipped_verdicts_by_release()[group[0]])
    return "%s: %s" % (span, ", ".join(depends) or "nothing")


def removable_from():
    """The first release from which ``status`` says NOTHING TO DO for every later release."""
    runs = status_rows()
    last_releases, (word, _, _, _, _) = runs[-1]
    return last_releases[0] if word == "NOTHING TO DO" else None


def status_table():
    lines = [
        "| SGLang releases | `status` says | records it patches | bugs it reports, unrepaired | exit "
        "| exit with `--accept %s` | FlashInfer pinned: what depends on it |" % ",".join(reported_somewhere()),
        "|---|---|---|---|---|---|---|",
    ]
    for group, (word, patched, reported, code, accepted_code) in status_rows():
        lines.append(
            "| %s | `%s` | %s | %s | %d | %d | %s |"
            % (_span(group), word, patched or "none", reported or "none", code, accepted_code, flashinfer_cell(group))
        )
    conditions = flashinfer_conditions()
    lines.append("")
    lines.append(
        "What depends on FlashInfer (`status` reads the installed one): %s."
        % "; ".join("`%s` %s" % (name, text) for name, text in conditions.items())
    )
    return "\n".join(lines)


def blocks():
    """Block name -> its text."""
    generated = {"records": records_table(), "status-by-release": status_table()}
    for hotfix in records():
        generated["releases:" + hotfix.name] = compatibility_table(hotfix)
    return generated


def rendered(text, generated):
    """``text`` with every generated block it holds rewritten."""
    for name, body in generated.items():
        begin, end = "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name
        if begin in text:
            start, stop = text.index(begin) + len(begin), text.index(end)
            text = text[:start] + "\n" + body + "\n" + text[stop:]
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say which pages differ")
    arguments = parser.parse_args(argv)
    generated, stale = blocks(), []
    for page in PAGES:
        path = REPO / page
        text = path.read_text(encoding="utf-8")
        new = rendered(text, generated)
        if new != text:
            stale.append(page)
            if not arguments.check:
                path.write_text(new, encoding="utf-8")
    print(("stale: " if arguments.check else "rewrote: ") + (", ".join(stale) or "nothing"))
    return 1 if arguments.check and stale else 0


if __name__ == "__main__":
    # Run as a tool: the checkout's package, not an installed copy (the tables live beside its records).
    sys.path.insert(0, str(REPO))
    sys.exit(main())
