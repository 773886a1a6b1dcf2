"""Host memory: when a command restarts itself with glibc's malloc on transparent huge pages,
and that the restart keeps the process and its arguments (`jaxtpu.core.hostmem`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jaxtpu.core import hostmem

GOOD = (2, 36), "madvise"


@pytest.mark.parametrize(
    "environ, glibc, thp, expected",
    [
        ({}, *GOOD, True),
        ({}, (2, 35), "always", True),
        ({hostmem.OPT_OUT: "0"}, *GOOD, False),  # the user's opt-out
        ({hostmem.TUNABLES: "glibc.malloc.hugetlb=0"}, *GOOD, False),  # the user chose
        ({hostmem.TUNABLES: "glibc.malloc.hugetlb=1"}, *GOOD, False),  # the restarted process
        ({hostmem.TUNABLES: "glibc.malloc.arena_max=2"}, *GOOD, True),  # other tunables kept
        ({}, (2, 31), "madvise", False),  # glibc before the tunable
        ({}, None, "madvise", False),  # musl and others
        ({}, (2, 36), "never", False),
        ({}, (2, 36), None, False),  # no transparent huge pages in this kernel
    ],
)
def test_when_a_command_restarts_with_huge_pages(environ, glibc, thp, expected):
    assert hostmem.wanted(environ, glibc, thp) is expected


def test_the_tunable_joins_the_users_other_tunables():
    assert hostmem.with_huge_pages({})[hostmem.TUNABLES] == "glibc.malloc.hugetlb=1"
    env = hostmem.with_huge_pages({hostmem.TUNABLES: "glibc.malloc.arena_max=2", "X": "1"})
    assert env == {hostmem.TUNABLES: "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "X": "1"}


@pytest.mark.e2e
def test_the_restart_keeps_the_process_its_arguments_and_its_output():
    if not hostmem.wanted({}, hostmem.glibc_version(), hostmem.thp_mode()):
        pytest.skip("this machine has no glibc >= 2.35 with transparent huge pages")
    code = (
        "import json, os, sys\n"
        "from jaxtpu.core import hostmem\n"
        "print('before', os.getpid(), flush=True)\n"
        "hostmem.reexec_with_huge_pages()\n"
        "print(json.dumps([os.getpid(), sys.argv[1:], hostmem.active()]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (hostmem.TUNABLES, hostmem.OPT_OUT)}
    proc = subprocess.run(
        [sys.executable, "-c", code, "a b", "--flag"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = proc.stdout.splitlines()
    # one run of the code before the restart, one after, in the same process
    before = [int(x.split()[1]) for x in lines if x.startswith("before")]
    pid, argv, active = json.loads(lines[-1])
    assert len(before) == 2 and before[0] == before[1] == pid
    assert argv == ["a b", "--flag"] and active is True


@pytest.mark.e2e
def test_a_command_restarts_before_it_imports_anything_heavy():
    """`python -m jaxtpu.train` restarts from the package's import, so its imports (flax, the
    engine) happen once, in the restarted process; `-X importtime` lists each process's."""
    if not hostmem.wanted({}, hostmem.glibc_version(), hostmem.thp_mode()):
        pytest.skip("this machine has no glibc >= 2.35 with transparent huge pages")
    env = {k: v for k, v in os.environ.items() if k not in (hostmem.TUNABLES, hostmem.OPT_OUT)}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "jaxtpu.train", "--help"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()]
    assert imported.count("jaxtpu.core.hostmem") == 2  # before the restart, and after it
    assert imported.count("jaxtpu.core.flags.cli") == 1  # the command's imports: once
    assert "usage: python -m jaxtpu.train" in proc.stdout
