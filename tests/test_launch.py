"""`jaxtpu launch` (`jaxtpu.launch`): the command each worker runs and the refusals, as pure
functions; the loop against a stand-in `gcloud` and a bucket is in `tests/test_bucket.py`."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest
from helpers import TINY, one_line_exit_2

from jaxtpu import launch
from jaxtpu.core.errors import UserError
from jaxtpu.core.run import tpuvm


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


class ScriptedGcloud:
    """Stands in for `Gcloud._run`: each verb answers from a list of (code, stdout, stderr),
    the last repeated; every call is recorded."""

    def __init__(self, answers: dict[str, list[tuple[int, str, str]]]) -> None:
        self.answers, self.calls = answers, []

    def __call__(self, verb, *extra, capture=True):  # set on the class: no self of Gcloud
        self.calls.append(verb)
        queue = self.answers[verb]
        code, out, err = queue.pop(0) if len(queue) > 1 else queue[0]
        return subprocess.CompletedProcess([verb], code, out, err)


READY_VM = (0, json.dumps({"state": "READY", "networkEndpoints": [{}]}), "")
ARGV = ["--tpu", "t", "--zone", "us-west9-z", "--accelerator-type", "v5litepod-8",
        "--retries", "2", "--retry-wait", "0"]  # fmt: skip


def _launch(monkeypatch, capsys, answers, finished=False):
    script = ScriptedGcloud(answers)
    monkeypatch.setattr(tpuvm.Gcloud, "_run", script)
    monkeypatch.setattr(launch, "finished", lambda workdir: finished)
    try:
        code = launch.main([*ARGV, "--", *TINY, "--workdir", "gs://b/r"])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr(), script.calls


def test_a_notice_before_describes_json_is_skipped(monkeypatch, capsys):
    """Issue 58: gcloud's notice before the JSON was a JSONDecodeError traceback."""
    notice = "Updates are available for some Google Cloud CLI components.\n"
    answers = {"describe": [(0, notice + READY_VM[1], "")], "ssh": [(0, "", "")]}
    code, _, calls = _launch(monkeypatch, capsys, answers, finished=True)
    assert code == 0 and calls == ["describe", "ssh"]
    assert tpuvm.vm_record("no json here {") is None
    code, out, _ = _launch(monkeypatch, capsys, {"describe": [(0, "WARNING: a notice\n", "")]})
    assert code == 2 and out.err.strip().endswith("printed no JSON object: WARNING: a notice")


def test_a_zone_that_does_not_exist_is_one_line_not_a_vm_to_create(monkeypatch, capsys):
    """Issue 58: read as "no such VM", so launch created and retried for 27 minutes."""
    err = "ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Location us-west9-z not found"
    code, out, calls = _launch(monkeypatch, capsys, {"describe": [(1, "", err)]})
    assert code == 2 and calls == ["describe"]
    assert out.err.count("\n") == 1 and "(--zone=us-west9-z): ERROR" in out.err
    # a VM that does not exist (its own resource path names locations/) is still created
    missing = "NOT_FOUND: Resource 'projects/p/locations/us-west9-z/nodes/t' was not found"
    answers = {"describe": [(1, "", missing), READY_VM], "create": [(0, "", "")],
               "ssh": [(0, "", "")]}  # fmt: skip
    code, _, calls = _launch(monkeypatch, capsys, answers, finished=True)
    assert code == 0 and calls == ["describe", "create", "describe", "ssh"]


def test_an_ssh_that_cannot_reach_the_workers_is_retried(monkeypatch, capsys):
    """Issue 58: ssh's own exit 255 was reported as the training's failure, not retried."""
    answers = {"describe": [READY_VM], "ssh": [(255, "", ""), (0, "", "")]}
    code, out, calls = _launch(monkeypatch, capsys, answers, finished=True)
    assert code == 0 and calls == ["describe", "ssh", "describe", "describe", "ssh"]
    assert "ssh could not reach a worker of t (exit 255" in out.out
    # a training that failed on a VM still up is not retried
    code, out, calls = _launch(monkeypatch, capsys, {"describe": [READY_VM], "ssh": [(2, "", "")]})
    assert code == 2 and calls == ["describe", "ssh", "describe"]
    assert "not a preemption, not retried" in out.err


def test_a_retry_wait_that_is_not_a_finite_number_is_refused(capsys):
    argv = [*ARGV[:-1], "nan", "--", *TINY, "--workdir", "gs://b/r"]
    err = one_line_exit_2(capsys, lambda: launch.main(argv))
    assert "--retry-wait must be a finite number in [0, 1000000], got nan" in err
