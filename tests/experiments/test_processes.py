"""run_in_processes: results in job order, warnings and errors reach the caller, bad input fails first."""

import operator
import warnings

import pytest

from gdn_lab.experiments.processes import run_in_processes


def test_results_come_back_in_job_order():
    jobs = [(i, i + 1) for i in range(7)]
    assert run_in_processes(operator.mul, jobs, 3, progress=False) == [a * b for a, b in jobs]
    assert run_in_processes(operator.mul, [], 2, progress=False) == []


def test_warnings_are_raised_again_in_the_caller():
    with pytest.warns(UserWarning) as caught:
        run_in_processes(
            warnings.warn, [("from a worker", UserWarning), ("and another", UserWarning)], 2, progress=False
        )
    assert sorted(str(w.message) for w in caught) == ["and another", "from a worker"]


def test_a_failing_job_raises_with_its_label():
    with pytest.raises(ValueError, match="invalid literal") as info:
        run_in_processes(int, [("1",), ("x",)], 2, labels=["ok", "bad"], progress=False)
    assert "raised by job 'bad', run in a worker process" in info.value.__notes__


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "2"])
def test_bad_workers_fail_before_any_process_starts(workers):
    with pytest.raises(ValueError, match=f"workers: expected a positive int, got {workers!r}"):
        run_in_processes(operator.mul, [(1, 2)], workers)


def test_labels_must_match_the_jobs():
    with pytest.raises(ValueError, match=r"labels: expected one per job \(2\), got 1"):
        run_in_processes(operator.mul, [(1, 2), (3, 4)], 2, labels=["a"])
