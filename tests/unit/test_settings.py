from __future__ import annotations

import pytest

from services.coordinator.settings import CoordinatorSettings
from torchfarm.settings import SettingsError, from_env
from workers.settings import WorkerSettings


def test_from_env_parses_types_and_overrides():
    env = {"TORCHFARM_LISTEN": "0.0.0.0:1", "TORCHFARM_POLL_INTERVAL_S": "0.5", "TORCHFARM_MAX_NODES": "7"}
    s = from_env(CoordinatorSettings, env, max_nodes=9)
    assert (s.listen, s.poll_interval_s, s.max_nodes) == ("0.0.0.0:1", 0.5, 9)
    w = from_env(WorkerSettings, {"TORCHFARM_QUEUES": "cpu, cuda"})
    assert w.queues == ("cpu", "cuda")


def test_bad_value_names_the_variable():
    with pytest.raises(SettingsError, match="TORCHFARM_MAX_NODES"):
        from_env(CoordinatorSettings, {"TORCHFARM_MAX_NODES": "many"})


def test_kernel_batch_defaults_to_what_one_build_job_builds_at_once(monkeypatch):
    from workers.jobs import sending

    class Ctx:
        settings = WorkerSettings()

    monkeypatch.setattr(sending.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert WorkerSettings().kernel_batch == 0
    assert sending.kernel_batch(Ctx()) == 3
    monkeypatch.setattr(sending.os, "sched_getaffinity", lambda pid: {5})  # pinned to a core
    assert sending.kernel_batch(Ctx()) == 1
    Ctx.settings = from_env(WorkerSettings, {"TORCHFARM_KERNEL_BATCH": "4"})
    assert sending.kernel_batch(Ctx()) == 4
    with pytest.raises(ValueError, match="TORCHFARM_KERNEL_BATCH=-1"):
        WorkerSettings(kernel_batch=-1)


def test_sdk_compile_reads_its_fallback_from_the_environment(monkeypatch):
    import sdk
    from sdk.errors import ConfigError

    monkeypatch.setenv("TORCHFARM_FALLBACK", "sometimes")
    with pytest.raises(ConfigError, match="'sometimes'"):
        sdk.compile(lambda x: x)
    sdk.compile(lambda x: x, fallback="error")  # the argument wins


def test_a_string_setting_reads_from_its_file_variable(tmp_path):
    """Compose and Kubernetes mount the Redis URLs (passwords in them) and tokens as files."""
    url = tmp_path / "broker-url"
    url.write_text("redis://coordinator:s3cret@redis-broker:6379/0\n")
    s = from_env(CoordinatorSettings, {"TORCHFARM_BROKER_URL_FILE": str(url)})
    assert s.broker_url == "redis://coordinator:s3cret@redis-broker:6379/0"
    # The plain variable, when both are set, wins; an explicit override wins over both.
    s = from_env(CoordinatorSettings, {"TORCHFARM_BROKER_URL_FILE": str(url),
                                       "TORCHFARM_BROKER_URL": "redis://other:1/0"})
    assert s.broker_url == "redis://other:1/0"


def test_file_variable_never_shadows_a_field_named_file():
    """SDKSettings has trusted_keys and trusted_keys_file: TORCHFARM_TRUSTED_KEYS_FILE is the
    latter's value (a path), never the contents of a file for the former."""
    from sdk.settings import SDKSettings

    s = from_env(SDKSettings, {"TORCHFARM_TRUSTED_KEYS_FILE": "/nonexistent/pins.json"})
    assert (s.trusted_keys_file, s.trusted_keys) == ("/nonexistent/pins.json", "")


def test_unreadable_file_variable_names_the_variable(tmp_path):
    with pytest.raises(SettingsError, match="TORCHFARM_CACHE_URL_FILE"):
        from_env(CoordinatorSettings, {"TORCHFARM_CACHE_URL_FILE": str(tmp_path / "missing")})


@pytest.mark.parametrize(("name", "value"), [
    ("TORCHFARM_COMPILE_TIMEOUT_S", "-5"), ("TORCHFARM_COMPILE_TIMEOUT_S", "0"),
    ("TORCHFARM_CONNECT_TIMEOUT_S", "0"), ("TORCHFARM_PROGRESS_EVERY_S", "0"),
    ("TORCHFARM_MAX_RESUBMITS", "-1"), ("TORCHFARM_SPLIT_REFUSED", "maybe"),
])
def test_a_bad_sdk_setting_is_a_config_error_naming_its_variable(monkeypatch, name, value):
    """`except sdk.ConfigError` catches every bad configuration, and the message names the
    variable: a timeout of 0 s or -5 s sent every graph to a local compile, called an
    outage. No chained ValueError lengthens the traceback."""
    import sdk
    from sdk.errors import ConfigError

    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name) as raised:
        sdk.compile(lambda x: x)
    error = raised.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


def test_a_bad_fallback_names_the_argument_and_the_variable(monkeypatch):
    import sdk
    from sdk.errors import ConfigError

    monkeypatch.setenv("TORCHFARM_FALLBACK", "bogus")
    with pytest.raises(ConfigError, match="TORCHFARM_FALLBACK"):
        sdk.compile(lambda x: x)


@pytest.mark.parametrize(("kwargs", "torchs"), [
    ({"mode": "max-autotune", "options": {"epilogue_fusion": True}}, RuntimeError),
    ({"fulgraph": True}, TypeError),
])
def test_a_compile_argument_torch_refuses_is_refused_as_torch_refuses_it(kwargs, torchs):
    import torch

    import sdk
    from sdk.errors import ConfigError

    with pytest.raises(torchs):
        torch.compile(lambda x: x, **kwargs)
    with pytest.raises(torchs) as raised:  # code that catches torch.compile's error catches it
        sdk.compile(lambda x: x, **kwargs)
    assert isinstance(raised.value, ConfigError)


@pytest.mark.parametrize(
    ("remote", "expected"),
    [("grpc://farm:50051", ("farm:50051", False)), ("grpcs://farm:443", ("farm:443", True)),
     ("farm:50051", ("farm:50051", False)), ("grpc://[::1]:50051", ("[::1]:50051", False))],
)
def test_a_farm_address_is_grpc_grpcs_or_bare(remote, expected):
    from sdk.client import parse_remote

    assert parse_remote(remote) == expected


@pytest.mark.parametrize("remote", ["http://farm:50051", "farm", "grpc://farm:", "farm:70000", "grpc://farm:0"])
def test_a_bad_farm_address_names_the_forms_it_may_take(remote):
    from sdk.client import parse_remote
    from sdk.errors import ConfigError

    with pytest.raises(ConfigError, match=r"is not grpc://host:port, grpcs://host:port or host:port"):
        parse_remote(remote)
