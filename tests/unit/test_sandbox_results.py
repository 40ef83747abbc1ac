"""What the process that signs takes from a sandboxed child (workers/sandbox/protocol.py), checked
before anything acts on it: a lowering's result and its streamed kernel specs, an
export's package, a Triton kernel, a decomposition. The child is faked here: `_Box`
returns what a child took over by a tenant's input could write."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pytest

from torchfarm.fx.cpp_kernels import KernelSpec, spec_args
from torchfarm.wire import targets
from workers import sandbox
from workers.sandbox import STREAM, SandboxFailed, SpecStream


@dataclass
class _Box:
    result: dict[str, Any]
    files: dict[str, bytes]
    asked: list[tuple[str, dict]] = field(default_factory=list)

    def run(self, op: str, request: dict, files: dict, max_output_bytes: int, forked: bool = True,
            watch: Any = None) -> tuple[dict, dict[str, bytes]]:
        self.asked.append((op, request))
        return self.result, self.files


def _spec() -> bytes:
    args = spec_args({"main_code": 'extern "C" void f() {}', "device_type": "cpu", "extra_flags": ()})
    return KernelSpec("CppCodeCache", args, output=0, outputs=1).to_bytes()


LOWERED = {"specs": 1, "guards": [], "timings": {"compile": 1.0, "collect": 0.1}, "stats": {}, "used": True}


def test_a_lowering_that_keeps_its_word_is_taken():
    records = [{"kernel": "ab/abcdefghijklmnopqrstuvwxyz234567.py", "best": {"XBLOCK": 64, "configs_hash": "h"}}]
    box = _Box({**LOWERED, "autotune": records}, {"payload.bin": b"P", "s0.spec": _spec()})
    done = sandbox.lower_graph(box, b"req", {"head": b"{}"}, 1 << 20)
    assert done.graph.payload == b"P" and done.graph.specs == [_spec()] and done.used_decomposition
    assert done.graph.autotune == records
    assert box.asked[0][0] == "lower" and box.asked[0][1]["decomposition"] == ["head"]


@pytest.mark.parametrize("result, files", [
    ({**LOWERED, "specs": 2}, {"payload.bin": b"P", "s0.spec": _spec()}),  # a spec it did not write
    (LOWERED, {"payload.bin": b"P", "s0.spec": _spec(), "extra": b"x"}),  # a file it did not declare
    (LOWERED, {"payload.bin": b"P", "s0.spec": b'{"cls": "os.system"}'}),  # a spec that does not parse
    ({**LOWERED, "timings": {"compile": 1.0}}, {"payload.bin": b"P", "s0.spec": _spec()}),
    ({**LOWERED, "guards": ["not a guard tree"]}, {"payload.bin": b"P", "s0.spec": _spec()}),
    # An autotune record that would write outside the client's cache dir.
    ({**LOWERED, "autotune": [{"kernel": "../../x.py", "best": {"configs_hash": "h"}}]},
     {"payload.bin": b"P", "s0.spec": _spec()}),
])
def test_a_lowering_that_breaks_its_word_is_refused(result, files):
    with pytest.raises(SandboxFailed) as failed:
        sandbox.lower_graph(_Box(result, files), b"req", None, 1 << 20)
    assert failed.value.kind == "crash"


def test_an_export_must_return_a_package():
    timings = {"timings": {"aoti": 1.0}}
    package, _ = sandbox.export_package(_Box(timings, {"package.pt2": b"PK\x03\x04rest"}), b"r", 100)
    assert package.startswith(b"PK")
    for files in ({"package.pt2": b"\x7fELF"}, {"package.pt2": b"PK\x03\x04", "x": b""}):
        with pytest.raises(SandboxFailed, match="package|malformed"):
            sandbox.export_package(_Box(timings, files), b"r", 100)


def test_a_triton_kernel_must_be_code_for_the_target_asked_for():
    result = {"kind": "cubin", "metadata": {}, "seconds": 0.1}
    target = targets.parse("cuda:sm_90")
    for kind, binary in (("cubin", b"\x7fELF not really"), ("hsaco", b"")):
        with pytest.raises(SandboxFailed):
            sandbox.compile_triton(
                _Box({**result, "kind": kind}, {"kernel.bin": binary, "kernel.asm": b""}), b"r", target, 100,
            )


def test_a_decomposition_must_parse():
    with pytest.raises(SandboxFailed, match="does not parse"):
        sandbox.decompose(_Box({"seconds": 1.0}, {"dec.head": b"not json"}), b"r", 100)
    with pytest.raises(SandboxFailed, match="malformed"):
        sandbox.decompose(_Box({"seconds": 1.0}, {"dec.elsewhere": b""}), b"r", 100)


def _stream(tmp_path, got: list[bytes], max_bytes: int = 1 << 20) -> SpecStream:
    (tmp_path / STREAM).mkdir(exist_ok=True)
    return SpecStream(got.append, max_bytes)


def test_specs_are_handed_on_in_order_as_they_appear(tmp_path):
    got: list[bytes] = []
    stream = _stream(tmp_path, got)
    stream(str(tmp_path))
    assert got == []
    (tmp_path / STREAM / "0").write_bytes(b"a")
    (tmp_path / STREAM / "2").write_bytes(b"c")  # not yet: 1 is missing
    (tmp_path / STREAM / "1.part").write_bytes(b"b")  # still being written
    stream(str(tmp_path))
    assert got == [b"a"]
    os.rename(tmp_path / STREAM / "1.part", tmp_path / STREAM / "1")
    stream(str(tmp_path))
    stream(str(tmp_path))
    assert got == [b"a", b"b", b"c"] and not stream.stopped


def test_no_stream_yet_is_not_an_error(tmp_path):
    got: list[bytes] = []
    stream = SpecStream(got.append, 100)
    stream(str(tmp_path))
    assert got == [] and not stream.stopped


def test_a_linked_spec_or_stream_is_never_read(tmp_path):
    secret = tmp_path / "signing.key"
    secret.write_bytes(b"SECRET")
    got: list[bytes] = []
    stream = _stream(tmp_path, got)
    os.symlink(secret, tmp_path / STREAM / "0")
    stream(str(tmp_path))
    assert got == [] and stream.stopped

    other = tmp_path / "other"
    other.mkdir()
    (other / STREAM).symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "0").write_bytes(b"x")
    linked = SpecStream(got.append, 100)
    linked(str(other))
    assert got == [] and linked.stopped


def test_the_specs_are_bounded_in_all(tmp_path):
    got: list[bytes] = []
    stream = _stream(tmp_path, got, max_bytes=5)
    (tmp_path / STREAM / "0").write_bytes(b"abc")
    (tmp_path / STREAM / "1").write_bytes(b"def")
    stream(str(tmp_path))
    assert got == [b"abc"] and stream.stopped


def test_a_consumer_that_raises_stops_the_stream(tmp_path):
    calls: list[bytes] = []

    def consume(spec: bytes) -> None:
        calls.append(spec)
        raise ValueError("not a spec")

    (tmp_path / STREAM).mkdir()
    stream = SpecStream(consume, 100)
    (tmp_path / STREAM / "0").write_bytes(b"a")
    (tmp_path / STREAM / "1").write_bytes(b"b")
    stream(str(tmp_path))
    stream(str(tmp_path))
    assert calls == [b"a"] and stream.stopped


def test_a_time_limit_raised_while_a_spec_is_handed_on_ends_the_run(tmp_path):
    class SoftLimit(Exception):
        pass

    def consume(spec: bytes) -> None:
        raise SoftLimit

    (tmp_path / STREAM).mkdir()
    (tmp_path / STREAM / "0").write_bytes(b"a")
    with pytest.raises(SoftLimit):
        SpecStream(consume, 100, (SoftLimit,))(str(tmp_path))
