"""`jaxtpu.preflight.memo`: what a TPU compilation told preflight is read back for the same
program, devices, compiler and flags, and compiled again for anything else (a fake program
and fake TPU devices: nothing is compiled here)."""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from jaxtpu.preflight import memo


@dataclass
class FakeDevice:
    platform: str = "tpu"
    device_kind: str = "TPU v3"
    id: int = 0
    coords: tuple = (0, 0, 0)


@dataclass
class FakeLowered:
    """A lowered program: its text is the key's, `compile` counts the compilations."""

    program: str = "module @jit_train {}"
    fails_with: str = ""
    compiles: list = field(default_factory=list)

    def as_text(self) -> str:
        return self.program

    def compile(self):
        self.compiles.append(1)
        if self.fails_with:
            raise RuntimeError(self.fails_with)
        n = len(self.compiles)
        sizes = dict(argument_size_in_bytes=10 * n, output_size_in_bytes=2,
                     alias_size_in_bytes=1, temp_size_in_bytes=7)  # fmt: skip
        return SimpleNamespace(
            memory_analysis=lambda: SimpleNamespace(**sizes),
            cost_analysis=lambda: {"flops": 3.0 * n, "optimal_seconds": 0.5, "name": "x"},
            as_text=lambda: f"HloModule compiled_{n}",
        )


@pytest.fixture
def cache_dir():
    """Sets JAX's compilation cache directory (the memo's home) for a test, then restores it."""
    import jax

    before = jax.config.jax_compilation_cache_dir
    yield lambda d: jax.config.update("jax_compilation_cache_dir", d)
    jax.config.update("jax_compilation_cache_dir", before)


@pytest.fixture
def memo_cache(tmp_path, cache_dir):
    cache_dir(str(tmp_path))
    return tmp_path / "jaxtpu-preflight"


DEVICES = [FakeDevice(id=i, coords=(i % 2, i // 2, 0)) for i in range(8)]


def test_the_same_program_for_the_same_devices_is_read_back_not_compiled(memo_cache):
    program = FakeLowered()
    first = memo.compile_facts(program, DEVICES)
    again = memo.compile_facts(FakeLowered(), DEVICES)  # the same text: another process's
    assert len(program.compiles) == 1 and not first.remembered and again.remembered
    assert again.memory == first.memory == memo.Memory(10, 2, 1, 7)
    assert again.cost == first.cost == {"flops": 3.0, "optimal_seconds": 0.5}  # numbers only
    assert again.compile_s == first.compile_s and first.text == again.text == ""
    assert len(list(memo_cache.glob("*.json.gz"))) == 1
    # the program's text asked for and not kept: compiled again, and kept from then on
    texts = FakeLowered()
    with_text = memo.compile_facts(texts, DEVICES, text=True)
    assert texts.compiles and not with_text.remembered and with_text.text == "HloModule compiled_1"
    assert memo.compile_facts(FakeLowered(), DEVICES, text=True).text == "HloModule compiled_1"


@pytest.mark.parametrize(
    "change",
    ["program", "devices", "XLA_FLAGS", "LIBTPU_INIT_ARGS", "jax"],
)
def test_anything_the_compilation_depends_on_is_another_key(memo_cache, monkeypatch, change):
    memo.compile_facts(FakeLowered(), DEVICES)
    program, devices = FakeLowered(), DEVICES
    if change == "program":
        program = FakeLowered("module @jit_train { another }")
    elif change == "devices":
        devices = [FakeDevice(device_kind="TPU v5 lite", id=i) for i in range(8)]
    elif change == "jax":
        import jax

        monkeypatch.setattr(jax, "__version__", "0.0.1")
    else:
        monkeypatch.setenv(change, "--xla_some_flag=true")
    assert not memo.compile_facts(program, devices).remembered and program.compiles


def test_the_host_cpus_own_xla_flags_are_not_part_of_a_tpu_programs_key(memo_cache, monkeypatch):
    memo.compile_facts(FakeLowered(), DEVICES)
    monkeypatch.setenv("XLA_FLAGS", " --xla_cpu_enable_fast_math=false")  # as torch_xla sets
    assert memo.compile_facts(FakeLowered(), DEVICES).remembered


def test_a_refusal_is_remembered_other_errors_raise_and_nothing_is_kept(memo_cache):
    refused = FakeLowered(fails_with="RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm")
    facts = memo.compile_facts(refused, DEVICES)
    assert facts.error.startswith("RESOURCE_EXHAUSTED") and not facts.remembered
    again = FakeLowered(fails_with="never asked")
    assert memo.compile_facts(again, DEVICES).error == facts.error and not again.compiles
    broken = FakeLowered("module @other {}", fails_with="INTERNAL: a compiler bug")
    with pytest.raises(RuntimeError, match="a compiler bug"):
        memo.compile_facts(broken, DEVICES)
    assert len(list(memo_cache.glob("*.json.gz"))) == 1  # the refusal's only


def test_an_unreadable_entry_is_compiled_again_and_rewritten(memo_cache):
    memo.compile_facts(FakeLowered(), DEVICES)
    (entry,) = memo_cache.glob("*.json.gz")
    entry.write_bytes(gzip.compress(b'{"memory": {"nonsense": 1}}'))
    program = FakeLowered()
    assert not memo.compile_facts(program, DEVICES).remembered and program.compiles
    assert memo.compile_facts(FakeLowered(), DEVICES).remembered


def test_the_hosts_devices_and_a_run_without_a_compilation_cache_remember_nothing(
    tmp_path, cache_dir
):
    cache_dir(str(tmp_path))
    cpu = [FakeDevice(platform="cpu", device_kind="cpu")]
    for _ in range(2):  # JAX's own cache serves the host's programs
        program = FakeLowered()
        assert not memo.compile_facts(program, cpu).remembered and program.compiles
    cache_dir(None)
    for _ in range(2):  # JAXTPU_COMPILE_CACHE=0: no directory, nothing kept
        program = FakeLowered()
        assert not memo.compile_facts(program, DEVICES).remembered and program.compiles
    assert not list(tmp_path.rglob("*.json.gz"))


def test_a_memo_that_cannot_be_written_costs_only_the_next_compilation(tmp_path, cache_dir):
    cache_dir(str(tmp_path))
    (tmp_path / "jaxtpu-preflight").write_text("a file where the directory would be")
    for _ in range(2):
        program = FakeLowered()
        facts = memo.compile_facts(program, DEVICES)
        assert program.compiles and not facts.remembered and facts.memory.temp_size_in_bytes == 7
