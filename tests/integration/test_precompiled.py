"""A precompiled hit (sdk/precompile.py): a fresh process runs the model's frames from
the farm with no Dynamo tracing and no compiler; anything else takes the normal path.

Dynamo's counter `torch._dynamo.utils.counters["frames"]["total"]` counts every frame
`convert_frame` starts to trace (`["stats"]["unique_graphs"]` the graphs it built): a
hit leaves both at zero. The compiler spy is tests/integration/test_no_compiler.py's.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from tests.conftest import run_python
from tests.integration.test_no_compiler import compiler_spy
from torchfarm.trust.signing import Signer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

WIDTH = 24 + os.getpid() % 16 * 2
"""A key the shared farm has not seen in this run."""

MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn

    SCALE = 1.0

    class Net(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.up = nn.Linear(16, width)
            self.norm = nn.LayerNorm(width)
            self.down = nn.Linear(width, 4)

        def forward(self, x):
            h = self.norm(torch.relu(self.up(x)))
            torch._dynamo.graph_break()  # two frames: forward and its resume function
            return self.down(h) * SCALE
    """
)

PROCESS = textwrap.dedent(
    """
    import copy, json, logging, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    from torch._dynamo.utils import counters
    import sdk, tfmodel

    lines = []
    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
    logging.getLogger("sdk").addHandler(Keep())
    logging.getLogger("sdk").setLevel(logging.INFO)

    torch.manual_seed(0)
    model = tfmodel.Net(int(sys.argv[2]))
    eager = copy.deepcopy(model)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    wait = sys.argv[3] == "wait"
    compiled = sdk.compile(model, fallback="error", wait=wait)
    loss = compiled(x).pow(2).mean()
    loss.backward()
    frames, graphs = counters["frames"]["total"], counters["stats"]["unique_graphs"]
    if not wait:
        assert sdk.wait_ready(compiled, 600)
    ref = eager(x).pow(2).mean()
    ref.backward()
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)
    print(json.dumps({"frames": frames, "graphs": graphs,
                      "lines": [l for l in lines if "precompiled" in l or "normal path" in l]}))
    """
)


@pytest.fixture
def precompile_keys(tmp_path):
    """A producer's precompile key, and a trusted-keys file naming it."""
    signer = Signer.generate()
    signer.save(tmp_path / "precompile-key.pem")
    (tmp_path / "precompile-trusted.json").write_text(json.dumps(signer.trusted_entry()))
    return tmp_path / "precompile-key.pem", tmp_path / "precompile-trusted.json"


def _run(stack, tmp_path, name, width, extra_env=None, model=MODEL, wait=True):
    code_dir = tmp_path / f"code-{name}"
    code_dir.mkdir()
    (code_dir / "tfmodel.py").write_text(model)
    env = {
        **stack.client_env(),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{name}"),
        "TORCHFARM_BLOB_CACHE_DIR": "",
        **(extra_env or {}),
    }
    mode = "wait" if wait else "nowait"
    proc = run_python(f"import sys; sys.argv = ['x', {str(code_dir)!r}, '{width}', '{mode}']\n" + PROCESS, env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _produce(stack, tmp_path, keys, width, wait=True):
    key_file, trusted = keys
    result = _run(stack, tmp_path, "producer", width, {
        "TORCHFARM_PRECOMPILE_KEY_FILE": str(key_file),
        "TORCHFARM_PRECOMPILE_TRUSTED_KEYS_FILE": str(trusted),
    }, wait=wait)
    assert result["frames"] >= 2, result
    [uploaded] = [line for line in result["lines"] if "precompiled package uploaded" in line]
    return uploaded.split("key=")[1].split()[0]


def test_a_fresh_process_runs_precompiled_frames_without_tracing_or_compiler(
    stack, tmp_path, precompile_keys, monkeypatch
):
    _produce(stack, tmp_path, precompile_keys, WIDTH)
    log_file = tmp_path / "compiler-calls.log"
    log_file.touch()
    monkeypatch.delenv("CXX", raising=False)
    spied = {
        "PATH": compiler_spy(tmp_path / "spy", log_file),
        "TORCHFARM_TOOLCHAIN_CACHE_DIR": str(tmp_path / "toolchain"),
        "TORCHFARM_PRECOMPILE_TRUSTED_KEYS_FILE": str(precompile_keys[1]),
    }
    # The machine's first process asks the compiler who it is (test_no_compiler.py);
    # the hit after it must ask nothing.
    run_python("from torchfarm.fx.fingerprint import local_fingerprint; local_fingerprint()", spied)
    log_file.write_text("")
    hit = _run(stack, tmp_path, "consumer", WIDTH, spied)
    assert (hit["frames"], hit["graphs"]) == (0, 0), hit
    assert any("precompiled hit" in line for line in hit["lines"]), hit
    assert log_file.read_text().splitlines() == []


@pytest.mark.precompiled_full
def test_wait_false_produces_and_loads_a_precompiled_package(stack, tmp_path, precompile_keys):
    width = WIDTH + 5
    _produce(stack, tmp_path, precompile_keys, width, wait=False)
    hit = _run(stack, tmp_path, "consumer", width, {
        "TORCHFARM_PRECOMPILE_TRUSTED_KEYS_FILE": str(precompile_keys[1]),
    }, wait=False)
    assert (hit["frames"], hit["graphs"]) == (0, 0), hit
    assert any("precompiled hit" in line for line in hit["lines"]), hit


@pytest.mark.precompiled_full
def test_a_changed_model_takes_the_normal_path_and_says_why(stack, tmp_path, precompile_keys):
    width = WIDTH + 1
    _produce(stack, tmp_path, precompile_keys, width)
    consumer = {"TORCHFARM_PRECOMPILE_TRUSTED_KEYS_FILE": str(precompile_keys[1])}
    reshaped = _run(stack, tmp_path, "reshaped", width + 2, consumer)
    recoded = _run(stack, tmp_path, "recoded", width, consumer, MODEL.replace("* SCALE", "* SCALE * 1.0"))
    for changed, component in ((reshaped, "parameters"), (recoded, "model_code")):
        assert changed["frames"] >= 2, changed
        # The farm names what differs from the package the producer uploaded.
        assert any(f"normal path: precompiled miss ({component}:" in line for line in changed["lines"]), changed


@pytest.mark.precompiled_full
def test_a_tampered_or_foreign_package_is_refused(stack, tmp_path, precompile_keys):
    width = WIDTH + 3
    produced = _produce(stack, tmp_path, precompile_keys, width)
    foreign = Signer.generate()
    (tmp_path / "foreign.json").write_text(json.dumps(foreign.trusted_entry()))
    other_key = _run(stack, tmp_path, "foreign", width, {
        "TORCHFARM_PRECOMPILE_TRUSTED_KEYS_FILE": str(tmp_path / "foreign.json"),
    })
    assert other_key["frames"] >= 2, other_key
    assert any("package refused (unknown_key)" in line for line in other_key["lines"]), other_key

    # Rewrite the stored manifest (a graph key swapped): the signature no longer holds.
    store = stack.store()
    [key] = [k for k in store.artifact_keys() if k.startswith("pc1-" + produced)]
    body = json.loads(store.get_manifest_bytes(key))
    first = next(iter(body["graphs"]))
    body["graphs"][first] = body["graphs"][first][::-1]
    store.r.set(store._j("artifact", key), json.dumps(body, sort_keys=True, separators=(",", ":")))
    tampered = _run(stack, tmp_path, "tampered", width, {
        "TORCHFARM_PRECOMPILE_TRUSTED_KEYS_FILE": str(precompile_keys[1]),
    })
    assert tampered["frames"] >= 2, tampered
    assert any("package refused (mismatch)" in line or "package refused (invalid)" in line
               for line in tampered["lines"]), tampered
