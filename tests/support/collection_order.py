"""The order the tests are collected in, for the README's command (``-n 2 --dist worksteal``):
the long tests first, shared between the workers by their measured length, the short ones after.

pytest-xdist's work-stealing scheduler hands the first half of the collection to one worker and
the rest to the other, and an idle worker steals from the *end* of the other's queue. In
collection order, the longest test (a minute and more) could start last on one worker while the
other had run dry: the run then waited on one core. Here the long tests open both halves, split so
that each half holds about as many of their seconds (the largest first to the lighter half), and
what is left to steal at the end is short. Only the order changes: every test still runs, once.
The seconds are a 2-core run's ``--durations`` (2026-12-05, 0.16.0 with the fork server); a test
missing here counts as short.
"""

# (part of a test's node id, its seconds on this machine's 2 cores)
LONG = (
    ("test_faults.py::test_many_apply_remove_cycles_do_not_grow", 50),
    ("test_mutants.py::test_every_mutant_is_refused_or_repaired_exactly[xqa_workspace-0.5.22]", 42),
    ("test_mutants.py::test_every_mutant_is_refused_or_repaired_exactly[pr26521-installed]", 39),
    ("test_mutants.py::test_every_mutant_is_refused_or_repaired_exactly[pr25103-installed]", 27),
    ("test_mutants.py::test_every_mutant_is_refused_or_repaired_exactly[pr25103-0.5.9]", 25),
    ("test_mutants.py::test_every_mutant_is_refused_or_repaired_exactly[pr26521-0.5.3]", 20),
    ("test_mutants.py::test_every_mutant_is_refused_or_repaired_exactly[pr26521-0.5.1]", 19),
    ("test_reported_records.py::test_a_mutant_that_breaks_one_of_the_fixs_statements_is_not_called_fixed", 17),
    ("test_operators.py::test_run_never_shadows_the_images_wrapt", 16),
    ("test_fork_server.py::test_a_forked_interpreter_starts_as_a_fresh_one[script]", 15),
    ("test_cli.py::test_the_exit_status_is_the_results_whatever_happens_to_stdout[verb2->/dev/full-cannot", 14),
    ("test_process_state.py::test_processes_lists_each_sglang_process_with_its_answer_and_prunes_the_gone", 12),
    ("test_mutants.py::test_every_mutant_is_refused_or_repaired_exactly[encoder_only_mask-0.5.19]", 12),
    ("test_reported_records.py::test_every_mutant_of_a_release_with_the_bug_is_refused[0.5.21-xqa_draft_ex", 12),
    ("test_fork_server.py::test_a_forked_interpreter_starts_as_a_fresh_one[-c]", 10),
)


def seconds(nodeid):
    return next((length for part, length in LONG if part in nodeid), 0)


def ordered(items, workers=2):
    """``items`` reordered for ``workers`` work-stealing workers (see the module docstring)."""
    if workers < 2 or len(items) < 2 * workers:
        return list(items)
    long_ = sorted((item for item in items if seconds(item.nodeid)), key=lambda item: -seconds(item.nodeid))
    short = [item for item in items if not seconds(item.nodeid)]
    sizes = [len(items) // workers] * (workers - 1)
    sizes.append(len(items) - sum(sizes))  # the scheduler's split: the last worker takes the rest
    parts = [[] for _ in range(workers)]
    loads = [0] * workers
    for item in long_:
        open_ = [i for i in range(workers) if len(parts[i]) < sizes[i]]
        chosen = min(open_, key=lambda i: loads[i])
        parts[chosen].append(item)
        loads[chosen] += seconds(item.nodeid)
    for i in range(workers):
        take = sizes[i] - len(parts[i])
        parts[i].extend(short[:take])
        short = short[take:]
    return [item for part in parts for item in part]
