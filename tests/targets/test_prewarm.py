"""Compiling for a target this process is not (sdk/fleet.py): the request carries the
fleet's build and the graph on the fleet's device, so the fleet later hits the cache."""

from __future__ import annotations

import textwrap

import pytest

from localfarm.stack import LocalStack
from sdk import fleet
from sdk.errors import FarmUnavailable
from tests.conftest import run_python
from tests.requests import relu_request
from torchfarm.fx.fingerprint import fingerprint_for, local_target
from torchfarm.v1 import farm_pb2, graph_pb2
from torchfarm.wire import targets

pytestmark = pytest.mark.timeout(300)


def test_retarget_moves_every_device():
    g = relu_request().graph
    g.nodes[1].args.add().device.CopyFrom(graph_pb2.Device(type="cpu", index=-1))
    out = fleet.retarget_graph(g, targets.parse("cuda:sm_90"))
    assert out.nodes[0].tensor.device == graph_pb2.Device(type="cuda", index=0)
    assert out.nodes[1].args[-1].device == graph_pb2.Device(type="cuda", index=0)
    assert g.nodes[0].tensor.device.type == "cpu"  # the original is untouched
    rocm = fleet.retarget_graph(g, targets.parse("rocm:gfx942"))
    assert rocm.nodes[0].tensor.device.type == "cuda"  # ROCm torch says "cuda"
    back = fleet.retarget_graph(out, targets.parse("cpu:avx2"))
    assert back.nodes[0].tensor.device == graph_pb2.Device(type="cpu", index=-1)


class _Client:
    def __init__(self, workers):
        self.workers = workers

    def status(self):
        return farm_pb2.FarmStatus(workers=self.workers)


def _worker(name, served, **build):
    fp = {**{k: v for k, v in fingerprint_for(local_target("cpu")).to_dict().items()
             if k not in ("device", "arch")}, **build}
    return farm_pb2.WorkerInfo(
        name=name, fingerprint=fp,
        targets=[farm_pb2.ServedTarget(target=t, jobs=j) for t, j in served.items()],
    )


def test_fleet_builds_come_from_graph_workers_of_the_target():
    h100 = targets.parse("cuda:sm_90")
    client = _Client([
        _worker("a", {"cuda:sm_90": ["graph", "kernel"]}, torch_version="2.13.0+cu130"),
        _worker("b", {"cuda:sm_90": ["graph"]}, torch_version="2.13.0+cu130"),  # same build
        _worker("c", {"cuda:sm_90": ["kernel"]}, torch_version="2.13.0+cpu"),  # kernels only
        _worker("d", {"cuda:sm_80": ["graph"]}),
        _worker("e", {"cuda:sm_90": ["graph"]}, torch_version="2.14.1+cu130"),
    ])
    builds = fleet.fleet_fingerprints(client, h100)
    assert sorted(fp.torch_version for fp in builds) == ["2.13.0+cu130", "2.14.1+cu130"]
    assert all((fp.device, fp.arch) == ("cuda", "sm_90") for fp in builds)
    usable = fleet.usable_builds(builds, "2.13.0+cpu", h100)
    assert [fp.torch_version for fp in usable] == ["2.13.0+cu130"]
    with pytest.raises(FarmUnavailable, match="run torch 2.14.1.*this process runs 2.12.0"):
        fleet.usable_builds(usable[:0] + [f for f in builds if f.torch_version.startswith("2.14")],
                              "2.12.0", h100)
    with pytest.raises(FarmUnavailable, match="no live worker compiles graphs for target cuda:sm_80"):
        fleet.usable_builds([], "2.13.0", targets.parse("cuda:sm_80"))


PREWARM = textwrap.dedent("""
    import json, logging, sys
    import torch, sdk
    from examples.models import make_mlp
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    model, inputs = make_mlp()
    target = sys.argv[1] if len(sys.argv) > 1 else None
    compiled = sdk.compile(model, remote=REMOTE, fallback="error", target=TARGET)
    out = compiled(*inputs).pow(2).mean()
    out.backward()
    print(json.dumps({"loss": out.item()}))
""")


@pytest.mark.integration
@pytest.mark.slow
def test_prewarm_for_another_cpu_isa_is_a_hit_for_that_fleet(tmp_path):
    """This machine's ISA is, say, avx2. A worker pinned to ATEN_CPU_CAPABILITY=default is
    a 'default' fleet; compiling for cpu:default from here fills the cache, and a
    'default' client then hits it."""
    mine = local_target("cpu")
    if mine.isa == "default":
        pytest.skip("this CPU has no vector ISA above 'default' to contrast with")
    env = {"ATEN_CPU_CAPABILITY": "default"}
    with LocalStack(warmup=False, workers=1, workdir=tmp_path / "stack", extra_env=env) as stack:
        trusted = {"TORCHFARM_TRUSTED_KEYS_FILE": str(getattr(stack, "trusted_keys_file", ""))}
        code = PREWARM.replace("REMOTE", repr(stack.address))
        laptop = run_python(
            code.replace("TARGET", repr("cpu:default")),
            {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "laptop"), "ATEN_CPU_CAPABILITY": mine.isa, **trusted},
        )
        assert laptop.returncode == 0, laptop.stderr[-3000:]
        assert "runs the graphs eagerly" in laptop.stderr
        assert "for cpu:default" in laptop.stderr and "compiled key=" in laptop.stderr
        fleet = run_python(
            code.replace("TARGET", "None"),
            {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "fleet"), **env, **trusted},
        )
        assert fleet.returncode == 0, fleet.stderr[-3000:]
        assert ": hit key=" in fleet.stderr, fleet.stderr[-3000:]
        # The laptop ran eagerly; the fleet ran the farm's artifact: same numbers.
        import json

        a, b = (json.loads(p.stdout.strip().splitlines()[-1])["loss"] for p in (laptop, fleet))
        assert abs(a - b) < 1e-5
