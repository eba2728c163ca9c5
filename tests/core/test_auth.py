"""Security: nothing from an unauthenticated peer is ever unpickled; the cluster secret and the
keys derived from it; the private ipc directory."""
from __future__ import annotations

import logging
import os
import stat
import time

import pytest
import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from actorpy.errors import ConfigError
from actorpy.runtime.node import Node
from actorpy.wire import auth
from actorpy.wire import message as wm
from actorpy.wire.auth import Security
from tests.conftest import wait_until

SECRET = b"the-cluster-secret-for-tests-0001"
OTHER_SECRET = b"some-other-secret-not-the-cluster"
SERVICE, RUN = 3, 1


class Trap:
    """Unpickling this creates a file: proof that a payload was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def cluster():
    """A CURVE server node on tcp://127.0.0.1:* whose handler unpickles every payload, and a
    member client node holding the same secret."""
    security = Security.curve(SECRET)
    server = Node("srv", "tcp://127.0.0.1:*", security).start()
    client = Node("cli", "tcp://127.0.0.1:*", security).start()
    seen: list[tuple[str, object]] = []

    def run(msg: wm.Message) -> None:
        value = msg.payload()
        seen.append((msg.sender, value))
        if hasattr(value, "close"):
            value.close()
            value = "opened"
        server.reply(msg, value)

    server.on(SERVICE, RUN, run)
    client.add_peer("srv", server.address, "worker")
    server.add_peer("cli", client.address, "driver")
    yield server, client, seen
    client.close()
    server.close()


HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def wait_for_event(monitor: zmq.Socket, wanted: int, timeout_s: float) -> dict:
    """The first socket event in the mask ``wanted`` (fails after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not monitor.poll(int(left * 1000) + 1):
            pytest.fail(f"no socket event {zmq.Event(wanted)!r} within {timeout_s} s")
        event = recv_monitor_message(monitor)
        if event["event"] & wanted:
            return event


def attack(address: str, security: Security | None, identity: bytes, claimed: str,
           path: str, expect_event: int = HANDSHAKE_FAILED,
           server_key: bytes | None = None) -> None:
    """Connect like an outsider and send a valid actorpy message carrying a Trap; return once
    the client has seen its handshake fail."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.setsockopt(zmq.IDENTITY, identity)
    if security is not None:
        security.apply_client(sock)
    if server_key is not None:
        sock.curve_serverkey = server_key
    monitor = sock.get_monitor_socket(expect_event)
    try:
        sock.connect(address)
        sock.sndtimeo = 2000  # a handshake refused before the send leaves no pipe to send on
        try:
            sock.send_multipart(wm.assemble(SERVICE, RUN, claimed, Trap(path), request_id=1))
        except zmq.Again:
            pass
        wait_for_event(monitor, expect_event, 5)
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        ctx.term()


class TestUnauthenticatedPickle:
    def test_the_trap_works_when_a_member_sends_it(self, cluster, tmp_path):
        # Control: the payload used below really does create a file once unpickled.
        server, client, seen = cluster
        path = tmp_path / "member-was-unpickled"
        assert client.call("srv", SERVICE, RUN, Trap(str(path)), timeout_s=10) == "opened"
        assert path.exists() and [s for s, _ in seen] == ["cli"]

    @pytest.mark.parametrize("identity, claimed", [
        (b"intruder", "intruder"),
        (b"cli", "cli"),  # posing as the member
    ], ids=["as-itself", "posing-as-member"])
    def test_outsider_key_is_rejected_by_the_allow_list(self, cluster, tmp_path, caplog,
                                                         identity, claimed):
        # An outsider who knows the cluster's public key (it is not secret) but not the secret:
        # the CURVE handshake reaches the ZAP allow-list, which refuses its own key.
        server, client, seen = cluster
        caplog.set_level(logging.WARNING, logger="actorpy")
        path = tmp_path / "pwned"
        outsider = Security("curve", *auth.curve_keypair(OTHER_SECRET))
        attack(server.address, outsider, identity, claimed, str(path),
               server_key=server.security.public_key)
        rejected = wait_until(lambda: [r for r in caplog.records
                                       if r.name == "actorpy.wire.auth"
                                       and r.levelno == logging.WARNING
                                       and "rejected" in r.getMessage()], 5,
                              "the allow-list to log the rejected key")
        assert outsider.public_key.decode() in rejected[0].getMessage()
        # The same node still answers its member, and never saw the outsider's message.
        assert client.call("srv", SERVICE, RUN, [1, 2], timeout_s=10) == [1, 2]
        assert seen == [("cli", [1, 2])]
        assert not path.exists()

    @pytest.mark.parametrize("security", [None, Security.curve(OTHER_SECRET)],
                             ids=["no-curve", "wrong-secret"])
    def test_client_without_the_secret_fails_the_handshake(self, cluster, tmp_path, security):
        # With a wrong secret the client also derives a wrong server key: the handshake fails
        # before ZAP is asked; without CURVE the mechanisms do not match.
        server, client, seen = cluster
        path = tmp_path / "pwned"
        attack(server.address, security, b"intruder", "intruder", str(path))
        assert client.call("srv", SERVICE, RUN, "still here", timeout_s=10) == "still here"
        assert seen == [("cli", "still here")]
        assert not path.exists()

    @pytest.mark.parametrize("security", [None, Security.curve(OTHER_SECRET)],
                             ids=["no-curve", "wrong-secret"])
    def test_server_logs_a_failed_handshake(self, cluster, tmp_path, caplog, security):
        server, client, seen = cluster
        caplog.set_level(logging.WARNING, logger="actorpy")
        attack(server.address, security, b"intruder", "intruder", str(tmp_path / "pwned"))
        wait_until(lambda: any(r.levelno == logging.WARNING and r.name.startswith("actorpy")
                               and "rejected a connection" in r.getMessage()
                               for r in caplog.records), 2, "a WARNING about the refusal")
        assert not (tmp_path / "pwned").exists()
        said = " ".join(r.getMessage() for r in caplog.records)
        if security is not None:   # before: "...or speaks another protocol", for a member
            assert "not a member of this cluster (wrong or missing secret)" in said, said

    def test_ipc_security_trusts_every_frame_and_curve_needs_the_member_key(self):
        assert Security.ipc().is_trusted(zmq.Frame(b"x"))
        curve = Security.curve(SECRET)
        assert curve.user_id == curve.public_key.decode("ascii")
        assert not curve.is_trusted(zmq.Frame(b"x"))   # not received: no User-Id
        assert not curve.is_trusted(b"plain bytes")     # not a frame at all


class TestSecret:
    def test_precedence_explicit_then_file_then_env(self, tmp_path):
        f = tmp_path / "cluster.secret"
        f.write_bytes(b"from-the-file-0123456789\n")
        f.chmod(0o600)
        env = {"ACTORPY_SECRET": "from-the-environment-0123"}
        assert auth.read_secret(str(f), "explicit-value-0123456", env) == b"explicit-value-0123456"
        assert auth.read_secret(str(f), b"explicit-bytes-0123456", env) == b"explicit-bytes-0123456"
        assert auth.read_secret(str(f), None, env) == b"from-the-file-0123456789"
        assert auth.read_secret(None, None, env) == b"from-the-environment-0123"
        assert auth.read_secret(None, None, {}) is None
        assert auth.read_secret(None, None, {"ACTORPY_SECRET": ""}) is None

    def test_every_source_drops_the_whitespace_a_file_drops(self, tmp_path):
        f = tmp_path / "cluster.secret"
        f.write_bytes(b"the-same-secret-0123\r\n")
        f.chmod(0o600)
        text = f.read_text()
        assert {auth.read_secret(str(f)), auth.read_secret(secret=text),
                auth.read_secret(secret=text.encode()),
                auth.read_secret(env={"ACTORPY_SECRET": text})} == {b"the-same-secret-0123"}

    def test_process_environment_is_the_default(self, monkeypatch):
        monkeypatch.setenv("ACTORPY_SECRET", "process-env-secret-0123")
        assert auth.read_secret() == b"process-env-secret-0123"
        monkeypatch.delenv("ACTORPY_SECRET")
        assert auth.read_secret() is None

    @pytest.mark.parametrize("source", ["explicit", "file", "env"])
    def test_short_secret_is_refused(self, tmp_path, source):
        short = "x" * (auth.MIN_SECRET_BYTES - 1)
        f = tmp_path / "s"
        f.write_text(short + "\n")
        f.chmod(0o600)
        kwargs = {"explicit": dict(secret=short), "file": dict(secret_file=str(f)),
                  "env": dict(env={"ACTORPY_SECRET": short})}[source]
        with pytest.raises(ConfigError, match="at least 16 bytes"):
            auth.read_secret(**kwargs)
        assert auth.read_secret(secret="x" * auth.MIN_SECRET_BYTES) == b"x" * 16

    @pytest.mark.parametrize("secret", [16, ["a-secret-long-enough"], 1.5])
    def test_a_secret_of_another_type_is_refused(self, secret):
        # before: bytes(16), 16 NUL bytes, was the key (the handshake was refused as "the
        # secret differs"), and bytes(10**10) tried to allocate 10 GB
        with pytest.raises(ConfigError, match="secret must be a str or bytes"):
            auth.read_secret(secret=secret, env={})

    def test_unreadable_file_names_the_parameter_or_the_flag(self, tmp_path):
        with pytest.raises(ConfigError, match="cannot read secret_file .*missing") as info:
            auth.read_secret(str(tmp_path / "missing"))
        assert info.value.cli_message.startswith(f"cannot read --secret-file {tmp_path}")

    @pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
    def test_a_file_that_is_not_regular_is_refused_at_once(self, tmp_path, kind):
        # before: a FIFO's open waited for a writer for ever; /dev/zero (mode 0666) was
        # "open to other users. Run `chmod 600 /dev/zero`", and read without end at 0600
        path = {"fifo": str(tmp_path / "secret.fifo"), "device": "/dev/null",
                "directory": str(tmp_path)}[kind]
        if kind == "fifo":
            os.mkfifo(path, 0o600)
        with pytest.raises(ConfigError, match=f"the secret file {path} is not a regular file"):
            auth.read_secret(path, None, {})

    @pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o660])
    def test_file_open_to_other_users_is_refused_with_the_fix(self, tmp_path, mode):
        f = tmp_path / "cluster.secret"
        f.write_text(auth.generate_secret() + "\n")
        f.chmod(mode)
        with pytest.raises(ConfigError) as info:
            auth.read_secret(str(f), None, {})
        message = str(info.value)
        assert f"chmod 600 {f}" in message and f"{mode:04o}" in message

    @pytest.mark.parametrize("mode", [0o600, 0o400])
    def test_private_file_is_accepted(self, tmp_path, mode):
        f = tmp_path / "cluster.secret"
        f.write_text("a-private-secret-0123456789\n")
        f.chmod(mode)
        assert auth.read_secret(str(f), None, {}) == b"a-private-secret-0123456789"

    def test_written_secret_file_is_private_and_never_overwritten(self, tmp_path):
        f = tmp_path / "cluster.secret"
        auth.write_secret_file(str(f), "written-secret-0123456789")
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        assert auth.read_secret(str(f), None, {}) == b"written-secret-0123456789"
        with pytest.raises(ConfigError, match="already exists"):
            auth.write_secret_file(str(f), "another-secret-0123456789")
        assert auth.read_secret(str(f), None, {}) == b"written-secret-0123456789"

    def test_generated_secrets_are_long_and_fresh(self):
        a, b = auth.generate_secret(), auth.generate_secret()
        assert a != b and len(a.encode()) >= 32
        assert auth.read_secret(secret=a) == a.encode()


class TestKeys:
    def test_keypair_is_deterministic_per_secret(self):
        assert auth.curve_keypair(SECRET) == auth.curve_keypair(bytes(SECRET))
        public, secret = auth.curve_keypair(SECRET)
        assert len(public) == len(secret) == 40
        assert len(z85.decode(public)) == len(z85.decode(secret)) == 32
        assert zmq.curve_public(secret) == public

    def test_keypair_differs_between_secrets(self):
        one, two = auth.curve_keypair(SECRET), auth.curve_keypair(OTHER_SECRET)
        assert one[0] != two[0] and one[1] != two[1]
        assert auth.curve_keypair(SECRET + b"!")[0] != one[0]

    def test_security_carries_the_derived_keys(self):
        public, secret = auth.curve_keypair(SECRET)
        s = Security.curve(SECRET)
        assert (s.mode, s.public_key, s.secret_key) == ("curve", public, secret)
        assert "secret_key" not in repr(s) and secret.decode() not in repr(s)
        assert Security.ipc().public_key is None


class TestPrivateDir:
    def test_mode_0700_and_fresh(self):
        a, b = auth.private_dir(), auth.private_dir()
        try:
            assert a != b
            for path in (a, b):
                st_ = os.stat(path)
                assert stat.S_ISDIR(st_.st_mode)
                assert stat.S_IMODE(st_.st_mode) == 0o700
                assert st_.st_uid == os.getuid()
        finally:
            os.rmdir(a)
            os.rmdir(b)
