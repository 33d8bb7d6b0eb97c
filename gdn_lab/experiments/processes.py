"""run_in_processes: independent jobs side by side in fresh processes, their results in job order.

Why processes: a cold GPU run of notebook 01 spends most of its time compiling Triton kernels, one
op after another in one Python process. The ops share no state, so each can run in its own
process, and their compilations overlap (on an H100, 01 from a cold cache took 243 s in one process
and 140 s in three: data/bench/h100/README.md).

Processes are spawned, never forked: a forked child of a process that has used CUDA cannot use it.
A child imports what the job needs afresh and inherits the environment (TRITON_INTERPRET, the
Triton cache folder), so a job's result does not depend on which process ran it. The warnings a
job raises are recorded in its child and raised again in the caller, where the caller's filters
and hooks (a notebook's `gdn_lab.report.quiet` counts) see them.
"""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from typing import Any

from tqdm import tqdm


def run_in_processes(
    fn: Callable[..., Any],
    jobs: Sequence[tuple[Any, ...]],
    workers: int,
    *,
    labels: Sequence[str] | None = None,
    progress: bool = True,
    desc: str = "jobs",
) -> list[Any]:
    """fn(*job) for every job, in up to `workers` spawned processes; the results in job order.

    Args:
        fn: a module-level function (the child imports it by name); its arguments and result are
            pickled.
        jobs: each job's positional arguments.
        workers: processes at most (no more than there are jobs are started).
        labels: a name per job, for the progress bar and for the note an exception gets.
        progress: a tqdm bar on stderr, one step per finished job.
        desc: the bar's label.

    Returns:
        fn's results, in the order of `jobs`.

    Raises:
        ValueError: workers is not a positive int, or labels do not match the jobs.
        Whatever a job raised (the first to fail; the jobs not yet started are cancelled), with a
        note naming its label; concurrent.futures.process.BrokenProcessPool if a child died.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected a positive int, got {workers!r}")
    labels = [str(i) for i in range(len(jobs))] if labels is None else list(labels)
    if len(labels) != len(jobs):
        raise ValueError(f"labels: expected one per job ({len(jobs)}), got {len(labels)}")
    results: list[Any] = [None] * len(jobs)
    if not jobs:
        return results
    context = multiprocessing.get_context("spawn")
    with (
        ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context, initializer=_record_warnings) as pool,
        tqdm(total=len(jobs), desc=desc, disable=not progress, leave=False) as bar,
    ):
        index = {pool.submit(_recorded, fn, job): i for i, job in enumerate(jobs)}
        pending = set(index)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in sorted(done, key=index.__getitem__):
                i = index[future]
                error = future.exception()
                if error is not None:
                    pool.shutdown(wait=False, cancel_futures=True)
                    error.add_note(f"raised by job {labels[i]!r}, run in a worker process")
                    raise error
                results[i], caught = future.result()
                for message, category, filename, lineno in caught:
                    warnings.warn_explicit(message, category, filename, lineno)
                bar.set_postfix_str(labels[i], refresh=False)
                bar.update()
    return results


_CAUGHT: list[tuple[str, type[Warning], str, int]] = []  # a child's warnings not yet sent back


def _record_warnings() -> None:
    """A child's initializer: every warning Python's default filter would show is kept for the
    caller instead, from the start (a job's imports, done while its arguments are unpickled, warn
    before the job runs)."""
    warnings.simplefilter("default")

    def keep(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        _CAUGHT.append((str(message), category, filename, lineno))

    warnings.showwarning = keep


def _recorded(fn: Callable[..., Any], job: tuple[Any, ...]) -> tuple[Any, list[tuple[str, type[Warning], str, int]]]:
    """In the child: fn(*job), and the warnings kept since the last job."""
    result = fn(*job)
    caught = list(_CAUGHT)
    _CAUGHT.clear()
    return result, caught
