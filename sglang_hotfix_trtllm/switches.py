"""The environment variables the hotfix reads, parsed with clear complaints.

Standard library only; reads the environment, never writes it, and never
executes anything a variable names. The variables:

* ``SGLANG_HOTFIX_TRTLLM_DISABLE``: on = do nothing at all; or a
  comma-separated list of record names (``pr26521``, ``pr25103``) = leave
  those records' targets alone and apply the others. Any other value that is
  set is read as "everything off", with a warning (the kill switch fails safe).
* ``SGLANG_HOTFIX_TRTLLM_STRICT``: on = when the target module is imported and
  the hotfix cannot be applied (verdict ``unknown``, or wrapping fails), stop
  the process with an error instead of running unprotected.
* ``SGLANG_HOTFIX_TRTLLM_ACCEPT``: a comma-separated list of record names whose
  bug this hotfix reports but cannot repair here (verdict ``unrepairable``),
  acknowledged by the operator: ``status`` still names each such bug and whom it
  concerns, but does not fail on it (exit 0 where it would exit 1). It repairs,
  turns off and changes nothing; a record that is repaired here is not
  affected by it. Read by ``status`` only. Never a blanket value: ``1``,
  ``all`` and names of no record are complaints, and accept nothing.
* ``SGLANG_PLUGINS``: SGLang's own plugin allowlist (comma-separated
  entry-point names). When set and it does not name ``sglang_hotfix_trtllm``,
  the hotfix stands aside, as SGLang would for its entry point.

A value outside the vocabulary yields a warning naming the variable and the
accepted values; it is read as "off" for ``STRICT`` and as "everything off" for
``DISABLE``.
"""

import os

from .record import Value

DISABLE = "SGLANG_HOTFIX_TRTLLM_DISABLE"
STRICT = "SGLANG_HOTFIX_TRTLLM_STRICT"
ACCEPT = "SGLANG_HOTFIX_TRTLLM_ACCEPT"
SGLANG_PLUGINS = "SGLANG_PLUGINS"
PLUGIN_NAME = "sglang_hotfix_trtllm"

TRUE_VALUES = ("1", "true", "yes", "on")
FALSE_VALUES = ("", "0", "false", "no", "off")


class Switches(Value):
    """``plugin_allowlist`` is None when SGLANG_PLUGINS is unset or empty (no
    allowlist), else the names it lists; ``problems`` has one message per
    variable whose value was not understood."""

    __slots__ = (
        "disabled",
        "strict",
        "plugin_allowlist",
        "problems",
        "disabled_records",
        "disabled_why",
        "accepted_records",
    )
    _defaults = {"disabled_records": frozenset(), "disabled_why": "", "accepted_records": frozenset()}

    def why_disabled(self, hotfix_name):
        """Why the switch turns this record off, in words (for ``decide``)."""
        if self.disabled:
            return self.disabled_why or "%s is on" % DISABLE
        return "%s names %s" % (DISABLE, hotfix_name)

    def disables(self, hotfix_name):
        """True when the switch turns off everything or names this record."""
        return self.disabled or hotfix_name in self.disabled_records

    @property
    def excluded_by_sglang_plugins(self):
        return self.plugin_allowlist is not None and PLUGIN_NAME not in self.plugin_allowlist

    def as_dict(self):
        return {
            "disabled": self.disabled,
            "disabled_records": sorted(self.disabled_records),
            "strict": self.strict,
            "accepted_records": sorted(self.accepted_records),
            "sglang_plugins": None if self.plugin_allowlist is None else sorted(self.plugin_allowlist),
            "excluded_by_sglang_plugins": self.excluded_by_sglang_plugins,
        }


def _flag(environ, variable, problems):
    raw = environ.get(variable)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in TRUE_VALUES:
        return True
    if value not in FALSE_VALUES:
        problems.append(
            "%s=%r is not understood; accepted values are %s (on) or %s (off), "
            "case-insensitive; reading it as off"
            % (variable, raw, "/".join(TRUE_VALUES), "/".join(v for v in FALSE_VALUES if v))
        )
    return False


def _disable(environ, problems):
    """(everything off, the records named off) from the disable switch.

    Fails safe: a value that is set but not fully understood (a record name
    this package does not carry, a list mixing ``1`` with names) turns every
    record off, with one warning naming what was not understood. An operator
    who reached for the kill switch wanted something off."""
    from .records import catalog  # here, not at the top: catalog imports the records, which need none of this

    raw = environ.get(DISABLE)
    value = "" if raw is None else raw.strip().lower()
    if value in TRUE_VALUES or value in FALSE_VALUES:
        return value in TRUE_VALUES, frozenset(), ""
    known = [hotfix.name for hotfix in catalog.HOTFIXES]
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        problems.append(
            "%s=%r is not understood (%s); accepted values are %s (all records off), %s (all on) or a "
            "comma-separated list of the records to turn off (%s), case-insensitive; turning every record off "
            "to be safe"
            % (
                DISABLE,
                raw,
                ", ".join("%r is no record" % name for name in unknown),
                "/".join(TRUE_VALUES),
                "/".join(v for v in FALSE_VALUES if v),
                ", ".join(known),
            )
        )
        return True, frozenset(), "%s=%r is not understood: every record is off, to be safe" % (DISABLE, raw)
    return False, frozenset(names), ""


def record_names(raw):
    """The names a comma-separated switch value lists, as the switches read them (stripped, lower case)."""
    return [name.strip().lower() for name in raw.split(",") if name.strip()]


def _accept(environ, problems):
    """The records named by the acknowledgement switch. Names only: a value naming no record
    (``1``, ``all``, a typo) accepts nothing that name stands for, with one complaint."""
    from .records import catalog

    raw = environ.get(ACCEPT)
    if raw is None or not raw.strip():
        return frozenset()
    known = [hotfix.name for hotfix in catalog.HOTFIXES]
    names = record_names(raw)
    unknown = [name for name in names if name not in known]
    if unknown:
        problems.append(
            "%s=%r: %s; it takes a comma-separated list of the records whose unrepairable bug you accept (%s), "
            "never a blanket value; accepting only the records it names"
            % (ACCEPT, raw, ", ".join("%r is no record" % name for name in unknown), ", ".join(known))
        )
    return frozenset(name for name in names if name in known)


def _allowlist(environ, problems):
    # Parsed exactly as sglang.srt.plugins does: an empty value means no
    # allowlist; otherwise the comma-separated, stripped, non-empty names.
    raw = environ.get(SGLANG_PLUGINS)
    if not raw:
        return None
    names = frozenset(name.strip() for name in raw.split(",") if name.strip())
    if not names:
        problems.append(
            "%s=%r names no plugin; SGLang then loads no plugins, and this hotfix stands aside too"
            % (SGLANG_PLUGINS, raw)
        )
    return names


def read(environ=None):
    environ = os.environ if environ is None else environ
    problems = []
    disabled, disabled_records, disabled_why = _disable(environ, problems)
    strict = _flag(environ, STRICT, problems)
    allowlist = _allowlist(environ, problems)
    accepted = _accept(environ, problems)
    return Switches(disabled, strict, allowlist, tuple(problems), disabled_records, disabled_why, accepted)
