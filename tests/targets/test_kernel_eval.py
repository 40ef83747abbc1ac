"""What Triton's frontend evaluates in Python while it compiles a kernel, and the checks that
keep it from evaluating anything of the client's against worker objects: string folding and
methods (torchfarm/kernels/triton_check.py), folded numbers (torchfarm/kernels/triton_fold.py), and the
errors a client gets back (workers/triton_errors.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchfarm.kernels import triton_check, triton_request
from torchfarm.kernels.triton_check import KernelRejected
from torchfarm.wire import targets
from workers.triton_compile import KernelCompileError, compile_kernel

SOURCE = (Path(__file__).parent / "kernels" / "add_kernel.py").read_text()
SIGNATURE = "*fp32,*fp32,*fp32,i32,constexpr"
PID = "    pid = tl.program_id(0)\n"
SECRET = "redis://:planted-eval-secret@cache:6379/0"


def with_lines(lines: str) -> str:
    return SOURCE.replace(PID, lines + PID)


def request(source: str, constexprs: dict | None = None):
    return triton_request.build_kernel_request(
        source, "add_kernel", target="cuda:sm_90", signature=SIGNATURE,
        constexprs=constexprs or {"BLOCK": 256},
    )


# Each is valid Triton that, compiled as is, evaluates client-built strings against worker
# objects (str.format walks attributes) or folds numbers without bound.
ESCAPES = {
    "folded dunder + format": (
        '    s: tl.constexpr = "{0._" + "_class_" + "_._" + "_init_" + "_._" + "_globals_" + "_[inspect].os.environ}"\n'
        "    tl.static_assert(False, s.format(n))\n"
    ),
    "format inline": '    tl.static_assert(False, ("{0._" + "_class_" + "_}").format(n))\n',
    "format of a constant": '    tl.static_assert(False, "{0}".format(n))\n',
    "string repetition": '    tl.static_assert(False, ("{0." + "_" * 2 + "class" + "_" * 2 + "}").format(n))\n',
    "percent formatting": '    tl.static_assert(False, "%s%s" % ("_", "_"))\n',
    "replace": '    tl.static_assert(False, "-".replace("-", "_"))\n',
    "join": '    tl.static_assert(False, "_".join(["{0.", "class", "}"]))\n',
    "string local": '    s: tl.constexpr = "{0}"\n',
    "string in a tuple": '    t: tl.constexpr = ("_", "_")\n',
    "string subscript": '    tl.static_assert(False, "ab"[0])\n',
    "string to a class": '    s: tl.constexpr = tl.constexpr("{0.")\n',
    "f-string of a string": "    tl.static_assert(False, f\"{'_'}{'_'}\")\n",
    "f-string with a spec": '    tl.static_assert(False, f"{BLOCK:>10}")\n',
    "f-string outside an argument": '    s: tl.constexpr = f"{BLOCK}"\n',
    "bytes": "    tl.static_assert(False, b'x')\n",
    "string to min": '    m = min("{0.", "x")\n',
    "name of a dtype": "    s = x_ptr.dtype.name\n",
    "handle of a tensor": "    h = n.handle\n",
    "int method": "    b = BLOCK.bit_length()\n",
    "double-star arguments": "    tl.store(out_ptr, 1, **BLOCK)\n",
    "nested exponent": "    e: tl.constexpr = (((BLOCK ** 64) ** 64) ** 64) ** 64\n",
    "exponent chain through locals": (
        "    a: tl.constexpr = BLOCK ** 64\n    b: tl.constexpr = a ** 64\n"
        "    c: tl.constexpr = b ** 64\n    d: tl.constexpr = c ** 64\n    e: tl.constexpr = d ** 64\n"
    ),
    "huge shift": "    e: tl.constexpr = 1 << 10 ** 12\n",
    "squaring in a static loop": (
        "    e: tl.constexpr = BLOCK\n"
        "    for i in tl.static_range(40):\n"
        "        e: tl.constexpr = e * e\n"
    ),
    "long static loop": "    for i in tl.static_range(10 ** 9):\n        tl.static_print(i)\n",
    "tuple repetition": "    t: tl.constexpr = (1,) * 10 ** 9\n",
    # The bounds above know Triton's functions by their paths: other modules re-export them.
    "static loop through a re-exporting module": "    for i in tl.math.core.static_range(10 ** 9):\n        tl.static_print(i)\n",
    "static loop through a module's tl": "    for i in tl.random.tl.static_range(10 ** 9):\n        tl.static_print(i)\n",
    "exponent chain through a re-exporting module": (
        "    a: tl.constexpr = tl.standard.core.constexpr(BLOCK) ** 64\n"
        "    b: tl.constexpr = tl.standard.core.constexpr(a) ** 64\n"
        "    c: tl.constexpr = tl.standard.core.constexpr(b) ** 64\n"
    ),
    "unroll factor": "    for i in tl.range(0, n, loop_unroll_factor=10 ** 6):\n        tl.static_print(i)\n",
    "unroll factor by position": "    for i in tl.range(0, n, 1, 1, 10 ** 6):\n        tl.static_print(i)\n",
    # The pipeliner copies the loop's buffers per stage: 512 stages compiled for 47 s.
    "pipeline stages": (
        "    acc = tl.zeros((BLOCK,), dtype=tl.float32)\n"
        "    for i in tl.range(0, n, BLOCK, num_stages=512):\n"
        "        acc += tl.load(x_ptr + i + tl.arange(0, BLOCK))\n"
    ),
    "pipeline stages by position": "    for i in tl.range(0, n, 1, 10 ** 6):\n        tl.static_print(i)\n",
    # The assembler reads the file into the kernel the worker returns (AMDGPU's .incbin).
    "inline assembly": (
        '    v = tl.inline_asm_elementwise(".incbin \\"/etc/hostname\\"", "=r,r", [n], dtype=tl.int32, '
        "is_pure=True, pack=1)\n"
    ),
    "inline assembly through core": (
        '    v = tl.core.inline_asm_elementwise("s_nop 0", "=r,r", [n], dtype=tl.int32, is_pure=True, pack=1)\n'
    ),
    "a library path": '    v = tl.core.extern_elementwise("m", "/dev/zero", [n], {}, is_pure=True)\n',
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_compile_time_evaluation_is_refused_before_triton_runs(name):
    src = with_lines(ESCAPES[name])
    try:
        req = request(src)  # the client's own checks, the coordinator's too
    except KernelRejected:
        return
    with pytest.raises(KernelRejected):  # structurally fine: the worker's resolution refuses it
        compile_kernel(req, targets.parse("cuda:sm_90"))


RULES = {
    "folded dunder + format": "a string may appear only as an argument",
    "name of a dtype": "attribute 'name' of a value",
    "nested exponent": "could reach .* bits; the limit is 4096",
    "squaring in a static loop": "defined in terms of itself",
    "long static loop": "unroll over 4096",
    "unroll factor": "loop_unroll_factor must be a compile-time number of at most 64",
    "pipeline stages": "num_stages must be a compile-time number of at most 8",
    "pipeline stages by position": "num_stages must be a compile-time number of at most 8",
    "inline assembly": "inline_asm_elementwise is not allowed in a kernel: its assembly",
    "a library path": "extern_elementwise is not allowed",
}
"""Escapes the client's checks refuse, and the words their refusal names the rule in."""


@pytest.mark.parametrize("name", sorted(RULES))
def test_refusals_name_the_rule(name):
    with pytest.raises(KernelRejected, match=RULES[name]):
        request(with_lines(ESCAPES[name]))


def test_a_constexpr_past_64_bits_is_refused():
    with pytest.raises(KernelRejected, match="must fit in 64 bits"):
        request(SOURCE, constexprs={"BLOCK": 2**70})


def test_a_function_reached_through_a_re_exporting_module_is_refused_on_the_worker():
    request(with_lines(ESCAPES["static loop through a re-exporting module"]))  # the client's checks pass it
    with pytest.raises(KernelRejected, match="tl.math.core.static_range: triton.language.math.core is module triton.language.core under another path"):
        compile_kernel(request(with_lines(ESCAPES["static loop through a re-exporting module"])),
                       targets.parse("cuda:sm_90"))


def test_inline_assembly_imported_by_name_is_refused():
    src = SOURCE.replace("import triton.language as tl\n",
                         "import triton.language as tl\nfrom triton.language import inline_asm_elementwise as asm\n")
    with pytest.raises(KernelRejected, match="inline_asm_elementwise is not allowed"):
        request(src)


def test_an_unroll_factor_within_the_bound_compiles():
    src = with_lines("    for i in tl.range(0, 4, loop_unroll_factor=2):\n        tl.static_print(i)\n")
    assert compile_kernel(request(src), targets.parse("cuda:sm_90")).binary[:4] == b"\x7fELF"


def test_pipeline_stages_within_the_bound_compile():
    src = with_lines("    for i in tl.range(0, 4, 1, 3):\n        tl.static_print(i)\n")
    assert compile_kernel(request(src), targets.parse("cuda:sm_90")).binary[:4] == b"\x7fELF"


def test_a_string_to_a_triton_class_is_refused_on_the_worker():
    src = with_lines('    tl.static_assert(False, tl.constexpr("x"))\n')
    checked = triton_check.check_kernel_source(src, "add_kernel")
    assert "tl.constexpr" in checked.string_sinks
    with pytest.raises(KernelRejected, match="may not take a string"):
        compile_kernel(request(src), targets.parse("cuda:sm_90"))


def test_kernels_that_use_strings_and_constants_as_triton_means_still_compile():
    src = with_lines(
        '    tl.static_assert(BLOCK % 2 == 0, "BLOCK must be even")\n'
        '    tl.static_assert(BLOCK >= 2, f"BLOCK is {BLOCK}")\n'
        "    HALF: tl.constexpr = BLOCK // 2\n"
        "    WIDE: tl.constexpr = 2 ** 10 + (1 << 20) + tl.cdiv(BLOCK, HALF)\n"
        "    for i in tl.static_range(4):\n"
        "        tl.static_print(i, WIDE)\n"
    ).replace(
        "x = tl.load(x_ptr + offsets, mask=mask)",
        'x = tl.load(x_ptr + offsets, mask=mask, eviction_policy="evict_last").to(tl.float32)',
    )
    r = compile_kernel(request(src), targets.parse("cuda:sm_90"))
    assert r.binary[:4] == b"\x7fELF" and r.metadata["name"] == "add_kernel"


def test_compile_errors_carry_the_diagnostic_not_the_workers_state(monkeypatch, tmp_path):
    """A compile error a client sees holds its own source and Triton's diagnostic; never an
    environment value, a path outside the job's scratch directory, or a worker object's repr."""
    from workers import triton_errors

    monkeypatch.setenv("TORCHFARM_PLANTED_URL", SECRET)
    raw = (
        "CompilationError: at 3:4:\n    y = tl.zeros((3,), dtype=tl.float32)\n    ^\n"
        f"ValueError('cannot use {SECRET} with <triton.knobs.base_knobs object at 0x7f00deadbeef> "
        f"from /usr/lib/python3/site-packages/triton/knobs.py and {tmp_path}/k/add.ptx')\n"
        + "x" * 100_000
    )
    out = triton_errors.client_message(raw, scratch=str(tmp_path))
    assert "planted-eval-secret" not in out and "0x7f00deadbeef" not in out
    assert "/usr/lib/python3" not in out and str(tmp_path) not in out
    assert "y = tl.zeros((3,), dtype=tl.float32)" in out and "k/add.ptx" in out
    assert len(out.encode()) <= triton_errors.MAX_CLIENT_MESSAGE_BYTES


def test_a_megabyte_of_one_identifier_is_cleaned_in_one_pass(monkeypatch):
    """A tenant's kernel can make Triton quote a line of any length. The URL pattern's
    unbounded scheme scanned each start of a run of letters to the run's end: quadratic,
    17 s for 100 kB on the 2-core machine, and this megabyte would have run for about
    half an hour (pytest's timeout ends it first)."""
    from workers import triton_errors

    monkeypatch.setenv("TORCHFARM_PLANTED_URL", SECRET)
    raw = "CompilationError: at 1:0:\n" + "a" * 1_000_000 + f" http://user:{SECRET}@host/x\n"
    out = triton_errors.client_message(raw)
    assert out.startswith("CompilationError: at 1:0:") and "[... cut ...]" in out
    assert "http://<redacted>@host" in out and "planted-eval-secret" not in out
    long_scheme = triton_errors.client_message("see " + "s" * 40 + "://user:pw@host")
    assert "pw@" not in long_scheme  # a scheme past 32 characters still loses its credentials


def test_a_real_compile_error_reaches_the_client_bounded_and_clean(monkeypatch):
    from workers import triton_errors

    monkeypatch.setenv("TORCHFARM_PLANTED_URL", SECRET)
    broken = SOURCE.replace("x + y", "x + tl.zeros((3,), dtype=tl.float32)")
    with pytest.raises(KernelCompileError) as e:
        compile_kernel(request(broken), targets.parse("cuda:sm_90"))
    out = triton_errors.client_message(str(e.value))
    assert "x + tl.zeros((3,), dtype=tl.float32)" in out and "planted-eval-secret" not in out
    assert os.sep + "site-packages" not in out
