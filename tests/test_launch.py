"""`jaxtpu launch` (`jaxtpu.launch`): the command each worker runs and the refusals, as pure
functions; the loop against a stand-in `gcloud` and a bucket is in `tests/test_bucket.py`."""

from __future__ import annotations

import shlex

import pytest
from helpers import TINY, one_line_exit_2

from jaxtpu import launch
from jaxtpu.core.errors import UserError


def test_the_workers_run_train_with_resume_and_a_coordinator_on_a_slice():
    flags = [*TINY, "--workdir", "gs://b/runs/a"]
    one = shlex.split(launch.train_command(flags, 1, "python3"))
    assert one[:3] == ["python3", "-m", "jaxtpu.train"] and one[-1] == "--resume"
    assert "--coordinator-address" not in one
    pod = shlex.split(launch.train_command([*flags, "--resume"], 4, "py"))
    assert pod.count("--resume") == 1 and pod[-2:] == ["--coordinator-address", "auto"]
    given = launch.train_command([*flags, "--coordinator-address=10.0.0.2:1234"], 4, "py")
    assert "auto" not in given
    assert launch.workdir_of(["--workdir=gs://b/x"]) == "gs://b/x"


@pytest.mark.parametrize("flags", [["--workdir", "runs/a"], ["--preset", "tiny"]])
def test_launch_refuses_a_run_that_does_not_write_to_a_bucket(flags):
    with pytest.raises(UserError, match="a launched run writes to a bucket"):
        launch.workdir_of(flags)


def test_launch_needs_the_training_flags(capsys):
    argv = ["--tpu", "t", "--zone", "z", "--accelerator-type", "v5litepod-8"]
    err = one_line_exit_2(capsys, lambda: launch.main(argv))
    assert "give jaxtpu train's flags after --" in err
    err = one_line_exit_2(capsys, lambda: launch.main([*argv, "--", *TINY, "--workdir", "r/a"]))
    assert "--workdir r/a: a launched run writes to a bucket" in err
