"""Client trust (issue 16, item 6): no unsigned artifact is ever loaded unless the user
names that development farm in TORCHFARM_TRUST_UNSIGNED, loopback or not; and the key
`torchfarm up` makes is found by an SDK on the same machine without configuration, in
a per-user trust file keyed by the farm's address."""

from __future__ import annotations

import json
import os
import stat

import pytest

from localfarm.stack import free_port
from sdk import artifact
from sdk.errors import ArtifactRejected, ConfigError
from sdk.settings import SDKSettings
from sdk.trust import Trust
from torchfarm.fx.fingerprint import Fingerprint
from torchfarm.trust import trustfile
from torchfarm.trust.signing import Signer
from torchfarm.wire.manifest import BlobRef, Manifest, blob_digest

FP = Fingerprint(
    torch_version="2.13.0+cpu", torch_git="abc", triton_version="3.7.0", python="3.11",
    platform="linux-x86_64", device="cpu", arch="", isa="avx512", compiler="g++ 12",
)
KEY = "a" * 64
PAYLOAD = b"not really a pickle"


def _unsigned() -> tuple[bytes, dict]:
    m = Manifest(
        key=KEY, fingerprint=FP.to_dict(), payload=BlobRef(blob_digest(PAYLOAD), len(PAYLOAD)),
        worker="w", created=1.0, tenant="",
    )
    return m.to_json(), {blob_digest(PAYLOAD): PAYLOAD}


def _signed(signer: Signer) -> tuple[bytes, dict]:
    manifest, blobs = _unsigned()
    return signer.sign(Manifest.from_json(manifest)).to_json(), blobs


@pytest.fixture(autouse=True)
def config_home(tmp_path, monkeypatch):
    """An empty per-user config dir: nothing a real `torchfarm up` wrote is seen."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config"


def _code(fn) -> str:
    with pytest.raises(ArtifactRejected) as info:
        fn()
    return info.value.code


@pytest.mark.parametrize("address", ["127.0.0.1:50051", "localhost:50051", "[::1]:50051"])
def test_an_unsigned_artifact_from_a_loopback_farm_is_refused_by_default(address):
    """A port-forward, an ssh tunnel, or another user's process that bound the port
    first: loopback proves nothing about who answers."""
    trust = Trust.from_settings(SDKSettings(remote=f"grpc://{address}"), address)
    assert not trust.loads_anything
    manifest, blobs = _unsigned()
    assert _code(lambda: artifact.verify(manifest, blobs, KEY, FP, trust)) == "untrusted_farm"


def test_naming_the_farm_in_trust_unsigned_loads_its_unsigned_artifacts():
    settings = SDKSettings(trust_unsigned="grpc://127.0.0.1:50051")
    trust = Trust.from_settings(settings, "127.0.0.1:50051")
    assert trust.loads_anything and not trust.verifies_signatures
    manifest, blobs = _unsigned()
    assert artifact.verify(manifest, blobs, KEY, FP, trust).key == KEY


@pytest.mark.parametrize("named", ["grpc://127.0.0.1:50052", "localhost:50051", ""])
def test_trust_unsigned_names_one_farm_exactly(named):
    trust = Trust.from_settings(SDKSettings(trust_unsigned=named), "127.0.0.1:50051")
    assert not trust.loads_anything


@pytest.mark.parametrize("named", ["127.0.0.1", "*", "1", "true", "yes"])
def test_trust_unsigned_refuses_what_names_no_farm(named):
    """Before, such a value named no farm and was dropped without a word."""
    with pytest.raises(ConfigError, match=f"{named!r} is not a farm address"):
        Trust.from_settings(SDKSettings(trust_unsigned=named), "127.0.0.1:50051")


def test_trust_unsigned_takes_a_list_of_farms():
    settings = SDKSettings(trust_unsigned="grpc://dev-a:1, 127.0.0.1:50051")
    assert Trust.from_settings(settings, "127.0.0.1:50051").loads_anything
    assert Trust.from_settings(settings, "dev-a:1").loads_anything
    assert not Trust.from_settings(settings, "dev-b:1").loads_anything


def test_the_key_torchfarm_up_publishes_is_found_without_configuration(config_home):
    signer = Signer.generate()
    path = trustfile.publish("127.0.0.1:50051", signer.trusted_entry())
    assert path.parent.parent == config_home / "torchfarm"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    trust = Trust.from_settings(SDKSettings(), "127.0.0.1:50051")
    assert trust.verifies_signatures
    assert artifact.verify(*_signed(signer), KEY, FP, trust).key == KEY
    # Whoever binds that port next cannot sign with the published key.
    assert _code(lambda: artifact.verify(*_unsigned(), KEY, FP, trust)) == "unsigned"
    assert _code(lambda: artifact.verify(*_signed(Signer.generate()), KEY, FP, trust)) == "unknown_key"
    # The file is per farm address: another port is another farm.
    assert not Trust.from_settings(SDKSettings(), "127.0.0.1:50052").loads_anything


def test_a_published_key_wins_over_trust_unsigned(config_home):
    """A key is known for the farm, so its artifacts must be signed by it."""
    trustfile.publish("127.0.0.1:50051", Signer.generate().trusted_entry())
    trust = Trust.from_settings(SDKSettings(trust_unsigned="127.0.0.1:50051"), "127.0.0.1:50051")
    assert _code(lambda: artifact.verify(*_unsigned(), KEY, FP, trust)) == "unsigned"


def test_explicit_pins_win_over_the_published_key(tmp_path):
    published, pinned = Signer.generate(), Signer.generate()
    trustfile.publish("127.0.0.1:50051", published.trusted_entry())
    inline = ",".join(f"{k}={v}" for k, v in pinned.trusted_entry().items())
    trust = Trust.from_settings(SDKSettings(trusted_keys=inline), "127.0.0.1:50051")
    assert artifact.verify(*_signed(pinned), KEY, FP, trust).key == KEY
    assert _code(lambda: artifact.verify(*_signed(published), KEY, FP, trust)) == "unknown_key"


def test_withdraw_removes_only_its_own_key():
    a, b = Signer.generate(), Signer.generate()
    path = trustfile.publish("127.0.0.1:50051", a.trusted_entry())
    trustfile.withdraw("127.0.0.1:50051", b.key_id)  # another stack's key: not ours to remove
    assert path.exists()
    trustfile.withdraw("127.0.0.1:50051", a.key_id)
    assert not path.exists()


def test_a_trust_file_others_can_write_is_refused(config_home):
    path = trustfile.publish("127.0.0.1:50051", Signer.generate().trusted_entry())
    path.chmod(0o666)
    with pytest.raises(Exception, match="mode|writable"):
        Trust.from_settings(SDKSettings(), "127.0.0.1:50051")


def test_a_trust_file_that_links_into_a_directory_others_can_write_is_refused(config_home, tmp_path):
    # The link sits in the user's own trust directory; the file it names is where
    # another user may replace it with one that names their key.
    path = trustfile.publish("127.0.0.1:50051", Signer.generate().trusted_entry())
    shared = tmp_path / "shared"
    shared.mkdir()
    path.rename(shared / "farm.json")
    path.symlink_to(shared / "farm.json")
    assert Trust.from_settings(SDKSettings(), "127.0.0.1:50051").verifies_signatures
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match=rf"published for the farm at 127.0.0.1:50051: {shared} is writable by others"):
        Trust.from_settings(SDKSettings(), "127.0.0.1:50051")


@pytest.mark.parametrize("typed", ["localhost:50051", "grpc://localhost:50051", "[::1]:50051", "127.0.0.1:50051"])
def test_every_loopback_name_finds_the_trust_file_up_writes(typed):
    """`torchfarm up` publishes for 127.0.0.1; a user who types localhost means that farm."""
    signer = Signer.generate()
    trustfile.publish("127.0.0.1:50051", signer.trusted_entry())
    trust = Trust.from_settings(SDKSettings(), typed.removeprefix("grpc://"))
    assert trust.verifies_signatures
    assert artifact.verify(*_signed(signer), KEY, FP, trust).key == KEY
    assert _code(lambda: artifact.verify(*_unsigned(), KEY, FP, trust)) == "unsigned"


def test_other_hosts_and_ports_are_other_farms():
    trustfile.publish("127.0.0.1:50051", Signer.generate().trusted_entry())
    for other in ("localhost:50052", "farm.example:50051", "10.0.0.1:50051"):
        assert not Trust.from_settings(SDKSettings(), other).loads_anything, other


def test_the_untrusted_warning_names_the_file_up_writes(config_home):
    from sdk.trust import untrusted_message

    message = untrusted_message("localhost:50051")
    assert str(config_home / "torchfarm" / "trusted" / "127.0.0.1_50051.json") in message


def _compile_error(monkeypatch, remote: str):
    """What an unconfigured sdk.compile raises (fallback="error") for the farm at
    `remote`, and the submits it made."""
    import torch

    import sdk
    from sdk.client import FarmClient

    calls = []
    monkeypatch.setattr(FarmClient, "submit", lambda self, *a, **k: calls.append(a))
    monkeypatch.setenv("TORCHFARM_CONNECT_TIMEOUT_S", "2")
    fn = sdk.compile(lambda x: torch.relu(x) + 1, remote=remote, fallback="error")
    with pytest.raises(Exception) as info:
        fn(torch.randn(4))
    err = info.value
    return getattr(err, "inner_exception", err), calls  # Dynamo's BackendCompilerFailed wraps it


def test_a_farm_that_is_down_says_so_before_any_trust_question(monkeypatch):
    """Trusting a farm that does not answer would not help: it is reported as down."""
    from localfarm.stack import free_port
    from sdk.errors import FarmUnavailable

    err, calls = _compile_error(monkeypatch, f"grpc://localhost:{free_port()}")
    assert type(err) is FarmUnavailable and "did not answer" in str(err), repr(err)
    assert calls == []


def test_the_sdk_does_not_even_submit_to_an_unnamed_loopback_farm(monkeypatch):
    """An unconfigured SDK pointed at a loopback farm that answers refuses it before any
    compile call: the farm is untrusted, and the error says how to trust it."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        err, calls = _compile_error(monkeypatch, f"grpc://127.0.0.1:{port}")
    finally:
        server.stop(None)
    assert isinstance(err, ArtifactRejected) and err.code == "untrusted_farm", repr(err)
    assert "TORCHFARM_TRUST_UNSIGNED=127.0.0.1:" in str(err)
    assert calls == []


def test_a_pinned_keys_file_that_is_not_json_names_the_file_and_the_variable(tmp_path):
    bad = tmp_path / "keys.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match=rf"TORCHFARM_TRUSTED_KEYS_FILE.*{bad}: not JSON"):
        Trust.from_settings(SDKSettings(trusted_keys_file=str(bad)), "127.0.0.1:50051")


def test_a_farm_whose_artifacts_load_unverified_is_warned_of_once(caplog):
    from sdk import backend

    farm = f"127.0.0.1:{free_port()}"  # warned of once a process: a farm no other test named
    settings = SDKSettings(remote=f"grpc://{farm}", trust_unsigned=farm)
    for name in ("a", "b"):
        backend.FarmBackend(settings, name=name)
    unverified = [r for r in caplog.records if "without a signature check" in r.getMessage()]
    assert len(unverified) == 1 and unverified[0].levelname == "WARNING"


def test_an_unknown_key_names_the_pins_and_where_they_came_from(tmp_path):
    farm, old = Signer.generate(), Signer.generate()
    pins = tmp_path / "keys.json"
    pins.write_text(json.dumps(old.trusted_entry()))
    trust = Trust.from_settings(SDKSettings(trusted_keys_file=str(pins)), "127.0.0.1:50051")
    [old_id] = old.trusted_entry()
    with pytest.raises(ArtifactRejected, match=rf"not pinned \(pinned: {old_id}, from {pins}\); if the farm's key"):
        artifact.verify(*_signed(farm), KEY, FP, trust)


@pytest.mark.parametrize("mode", [0o666, 0o602])
def test_a_pinned_keys_file_others_can_write_is_refused(tmp_path, mode):
    # Another user who may write the file adds a key of their own, and then anything
    # they serve as the farm (or store in its Redis) is trusted.
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps(Signer.generate().trusted_entry()))
    keys.chmod(mode)
    with pytest.raises(ConfigError, match=rf"TORCHFARM_TRUSTED_KEYS_FILE.*{keys}.*writable by others"):
        Trust.from_settings(SDKSettings(trusted_keys_file=str(keys)), "127.0.0.1:50051")


def test_a_pinned_keys_file_in_a_directory_others_can_write_is_refused(tmp_path):
    # There they replace the file itself; a sticky directory (/tmp) does not let them.
    shared = tmp_path / "shared"
    shared.mkdir()
    keys = shared / "keys.json"
    keys.write_text(json.dumps(Signer.generate().trusted_entry()))
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by others"):
        Trust.from_settings(SDKSettings(trusted_keys_file=str(keys)), "127.0.0.1:50051")
    shared.chmod(0o777 | stat.S_ISVTX)
    assert Trust.from_settings(SDKSettings(trusted_keys_file=str(keys)), "127.0.0.1:50051").keys


def _pins(where) -> None:
    where.write_text(json.dumps(Signer.generate().trusted_entry()))


def _refused_once_open_to_others(settings: SDKSettings, shared, named, sticky_passes: bool = False) -> None:
    """The pinned keys load; with `shared` open to others they are refused, naming
    `named`; where `sticky_passes`, with `shared` sticky as well (as /tmp is) they load."""
    assert Trust.from_settings(settings, "127.0.0.1:50051").keys
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match=rf"{named} is writable by others"):
        Trust.from_settings(settings, "127.0.0.1:50051")
    if sticky_passes:
        shared.chmod(0o777 | stat.S_ISVTX)
        assert Trust.from_settings(settings, "127.0.0.1:50051").keys


def test_a_pinned_keys_file_that_links_into_a_directory_others_can_write_is_refused(tmp_path):
    # The link sits in the user's own directory; the file it names is where another user
    # may replace it with one that pins their key. A sticky directory does not let them.
    shared, mine = tmp_path / "shared", tmp_path / "mine"
    shared.mkdir()
    mine.mkdir(mode=0o700)
    _pins(shared / "keys.json")
    shared.chmod(0o777)
    (mine / "keys.json").symlink_to(shared / "keys.json")
    settings = SDKSettings(trusted_keys_file=str(mine / "keys.json"))
    with pytest.raises(ConfigError, match=rf"{shared} is writable by others"):
        Trust.from_settings(settings, "127.0.0.1:50051")
    shared.chmod(0o777 | stat.S_ISVTX)
    assert Trust.from_settings(settings, "127.0.0.1:50051").keys


def test_every_link_on_the_way_to_a_pinned_keys_file_is_checked(tmp_path):
    # mine/keys.json -> shared/hop -> mine/real.json: whoever may write `shared` aims the
    # hop at a file of theirs; and a link another user owns is theirs to aim.
    shared, mine = tmp_path / "shared", tmp_path / "mine"
    shared.mkdir()
    mine.mkdir(mode=0o700)
    _pins(mine / "real.json")
    (shared / "hop").symlink_to("../mine/real.json")
    (mine / "keys.json").symlink_to(shared / "hop")
    settings = SDKSettings(trusted_keys_file=str(mine / "keys.json"))
    _refused_once_open_to_others(settings, shared, shared)
    shared.chmod(0o700)
    if os.getuid() != 0:
        return  # giving the link away needs root
    os.lchown(shared / "hop", 12345, -1)
    with pytest.raises(ConfigError, match=rf"{shared / 'hop'} is a link owned by another user"):
        Trust.from_settings(settings, "127.0.0.1:50051")


def test_a_pinned_keys_file_in_a_linked_directory_others_can_write_is_refused(tmp_path):
    # mine/keys is a link to shared/: the file is no link, the directory it is read from is.
    shared, mine = tmp_path / "shared", tmp_path / "mine"
    shared.mkdir()
    mine.mkdir(mode=0o700)
    _pins(shared / "keys.json")
    (mine / "keys").symlink_to(shared)
    settings = SDKSettings(trusted_keys_file=str(mine / "keys" / "keys.json"))
    _refused_once_open_to_others(settings, shared, mine / "keys")


def test_a_pinned_keys_file_below_a_directory_others_can_write_is_refused(tmp_path):
    # shared/alice/keys.json, alice's own and closed: whoever may write `shared` renames
    # alice/ away and puts a directory of theirs, with their key, in its place, between
    # the check and the read. A sticky directory (/tmp) does not let them.
    shared = tmp_path / "shared"
    (shared / "alice").mkdir(parents=True)
    _pins(shared / "alice" / "keys.json")
    settings = SDKSettings(trusted_keys_file=str(shared / "alice" / "keys.json"))
    _refused_once_open_to_others(settings, shared, shared, sticky_passes=True)


def test_a_pinned_keys_file_a_link_leads_below_a_directory_others_can_write_is_refused(tmp_path):
    # mine/keys.json -> shared/alice/keys.json: the directories above where the link
    # leads are on the way as much as those above the link.
    shared, mine = tmp_path / "shared", tmp_path / "mine"
    (shared / "alice").mkdir(parents=True)
    mine.mkdir(mode=0o700)
    _pins(shared / "alice" / "keys.json")
    (mine / "keys.json").symlink_to(shared / "alice" / "keys.json")
    _refused_once_open_to_others(SDKSettings(trusted_keys_file=str(mine / "keys.json")), shared, shared)


def test_a_trust_file_below_a_directory_others_can_write_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(shared / "config"))
    trustfile.publish("127.0.0.1:50051", Signer.generate().trusted_entry())
    assert Trust.from_settings(SDKSettings(), "127.0.0.1:50051").verifies_signatures
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match=rf"published for the farm at 127.0.0.1:50051: {shared} is writable by others"):
        Trust.from_settings(SDKSettings(), "127.0.0.1:50051")


def test_the_precompile_keys_are_checked_alike(tmp_path):
    from sdk.trust import pinned_keys

    keys = tmp_path / "precompile-keys.json"
    keys.write_text(json.dumps(Signer.generate().trusted_entry()))
    assert pinned_keys(str(keys), "")
    keys.chmod(0o646)
    with pytest.raises(ValueError, match="writable by others"):
        pinned_keys(str(keys), "")
