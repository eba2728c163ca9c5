"""Who is trusted: the one place that decides.

Two mechanisms, both ZeroMQ's own, never a home-made scheme:

* ``ipc``: the embedded local cluster binds ``ipc://`` endpoints inside a fresh directory
  that only the current user can open (mode 0700). The kernel refuses everyone else; there
  is no crypto cost. Trust = "same user on this machine".
* ``curve``: a multi-host cluster uses CurveZMQ. Every member derives the cluster's key pair
  from the shared cluster secret; a ZAP authenticator allow-lists exactly that public key, so
  a peer without the secret fails the handshake and none of its bytes reach the runtime.
  Each received message also carries the client key libzmq authenticated (``User-Id``), and
  the node drops any message whose key is not on the allow-list. Trust = "holds the secret".

Nothing is unpickled before one of these has said yes (actorpy.wire.serde.loads is called
only by the node's receive loop, after ``Security.is_trusted``).
"""
from __future__ import annotations

import hashlib
import logging
import os
import secrets as _secrets
import shlex
import stat
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.utils import z85

from actorpy.errors import ConfigError
from actorpy.log import Throttle

log = logging.getLogger(__name__)

MIN_SECRET_BYTES = 16
_KEY_PERSON = b"actorpy-curve-1"
ZAP_DOMAIN = "actorpy"


def generate_secret() -> str:
    """A fresh random cluster secret (URL-safe text, 256 bits)."""
    return _secrets.token_urlsafe(32)


def read_secret(secret_file: str | None = None, secret: str | bytes | None = None,
                env: dict[str, str] | None = None) -> bytes | None:
    """The cluster secret: explicit value > ``--secret-file`` > ``ACTORPY_SECRET`` > None.

    A secret file must be private to its owner (like an ssh private key): one that other
    users can read or change is refused, since whoever holds the secret can run code on
    every member.

    Raises:
        ConfigError: the file cannot be read, is open to other users, or the secret is
            shorter than 16 bytes.
    """
    env = os.environ if env is None else env
    value: bytes | None
    # Leading and trailing whitespace is not part of the secret, however it comes: a file's
    # is dropped, so `secret=open(f).read()` or an ACTORPY_SECRET with the file's newline
    # must give the same key, not a handshake refused as "the secret differs".
    if secret is not None:
        if not isinstance(secret, (str, bytes, bytearray, memoryview)):
            # bytes(16) is 16 NUL bytes, a secret nobody else holds: the handshake was
            # refused as "the secret differs"; bytes(10**10) tried to allocate 10 GB
            raise ConfigError(f"secret must be a str or bytes (or give secret_file=), got "
                              f"{type(secret).__name__}")
        value = (secret.encode() if isinstance(secret, str) else bytes(secret)).strip()
    elif secret_file:
        try:
            # O_NONBLOCK: a FIFO's open would wait for a writer, for ever
            fd = os.open(secret_file, os.O_RDONLY | os.O_NONBLOCK)
            try:
                mode = os.fstat(fd).st_mode
                if not stat.S_ISREG(mode):   # /dev/zero would be read until memory ran out
                    raise ConfigError(f"the secret file {secret_file} is not a regular file "
                                      "(a pipe, a device, a directory); make one with "
                                      "`actorpy secret --out F`")
                check_private_file(secret_file, mode)
                value = b"".join(iter(lambda: os.read(fd, 1 << 16), b"")).strip()
            finally:
                os.close(fd)
        except OSError as exc:
            err = ConfigError(f"cannot read secret_file {secret_file}: {exc}")
            err.cli_message = f"cannot read --secret-file {secret_file}: {exc}"
            raise err from exc
    elif env.get("ACTORPY_SECRET"):
        value = env["ACTORPY_SECRET"].encode().strip()
    else:
        return None
    if len(value) < MIN_SECRET_BYTES and secret is None and secret_file:
        # `actorpy secret --out F`, the hint before, refuses an F that exists
        name = shlex.quote(os.fspath(secret_file))
        raise ConfigError(f"the cluster secret must be at least {MIN_SECRET_BYTES} bytes, and "
                          f"the secret file {secret_file} holds {len(value)}; replace it with "
                          f"a fresh one: `rm {name} && actorpy secret --out {name}`, then copy "
                          "it to every host")
    if len(value) < MIN_SECRET_BYTES:
        raise ConfigError(f"the cluster secret must be at least {MIN_SECRET_BYTES} bytes; "
                          "make one with `actorpy secret --out cluster.secret`")
    return value


def check_private_file(path: str, mode: int) -> None:
    """Refuse a secret file that users other than its owner may read or write (any of the
    mode bits 077), as ssh refuses such private keys.

    Raises:
        ConfigError: naming the file, its mode and the ``chmod`` that fixes it.
    """
    if os.name == "posix" and stat.S_IMODE(mode) & 0o077:
        raise ConfigError(
            f"the secret file {path} is open to other users (mode {stat.S_IMODE(mode):04o}); "
            f"anyone who can read it can run code on the cluster. Run `chmod 600 {path}` "
            "and try again")


def write_secret_file(path: str, secret: str) -> None:
    """Write ``secret`` to a new file ``path`` that only its owner can read (mode 0600).

    Raises:
        ConfigError: ``path`` already exists (it is never overwritten) or cannot be created.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} already exists; remove it first, or pick another name") \
            from None
    except OSError as exc:
        raise ConfigError(f"cannot create {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(secret + "\n")


def curve_keypair(secret: bytes) -> tuple[bytes, bytes]:
    """The cluster's CURVE (public, secret) key pair in Z85, derived from the cluster secret."""
    raw = hashlib.blake2b(secret, digest_size=32, person=_KEY_PERSON).digest()
    secret_key = z85.encode(raw)
    return zmq.curve_public(secret_key), secret_key


class _AllowList:
    """ZAP credentials provider: allow exactly the cluster's key, log the refusals.

    Throttled per cause, not per key: the client key is the outsider's choice (anyone can
    mint one, and the server's public key is no secret), so one fresh key per connection
    logged a line per connection (~2 000 in 20 s from one script). One line per interval
    names the key that triggered it and counts the refusals held back since."""

    #: the throttle's key for every refusal here (the one cause: not the cluster's key)
    CAUSE = "unknown CURVE client key"

    def __init__(self, allowed: frozenset[bytes]) -> None:
        self.allowed = allowed
        self._throttle = Throttle()

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.allowed:
            return True
        allowed, held = self._throttle.allow(self.CAUSE)
        if allowed:
            log.warning("rejected a connection: CURVE client key %s is not a member of this "
                        "cluster (wrong or missing secret)%s", key.decode("ascii", "replace"),
                        f"; {held} more rejected connections (any key) since the last report"
                        if held else "")
        return False


@dataclass(frozen=True)
class Security:
    """How a node's sockets authenticate. Make one with ``Security.ipc()`` or
    ``Security.curve(secret)``; apply it to every socket the node opens."""

    mode: str
    public_key: bytes | None = None
    secret_key: bytes | None = field(default=None, repr=False)

    @classmethod
    def ipc(cls) -> Security:
        return cls("ipc")

    @classmethod
    def curve(cls, secret: bytes) -> Security:
        if not zmq.has("curve"):
            raise ConfigError("this libzmq has no CURVE support; multi-host clusters need it")
        public, private = curve_keypair(secret)
        return cls("curve", public, private)

    @property
    def chunk_bytes(self) -> int:
        """The frame size large buffers are split into under this mechanism."""
        from actorpy.wire import serde

        return serde.ENCRYPTED_CHUNK_BYTES if self.mode == "curve" else serde.DEFAULT_CHUNK_BYTES

    @property
    def user_id(self) -> str | None:
        """The ``User-Id`` libzmq attaches to messages from members (curve mode)."""
        return self.public_key.decode("ascii") if self.public_key else None

    def start_authenticator(self, context: zmq.Context) -> Any:
        """Start the ZAP handler for ``context`` (curve mode); returns it, to ``stop()``."""
        if self.mode != "curve":
            return None
        from zmq.auth.thread import ThreadAuthenticator

        auth = ThreadAuthenticator(context, log=logging.getLogger(__name__ + ".zap"))
        auth.start()
        assert self.public_key is not None
        auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=_AllowList(
            frozenset({self.public_key})))
        return auth

    def apply_server(self, sock: zmq.Socket) -> None:
        if self.mode == "curve":
            sock.curve_secretkey = self.secret_key
            sock.curve_publickey = self.public_key
            sock.curve_server = True
            sock.zap_domain = ZAP_DOMAIN.encode()

    def apply_client(self, sock: zmq.Socket) -> None:
        if self.mode == "curve":
            sock.curve_secretkey = self.secret_key
            sock.curve_publickey = self.public_key
            sock.curve_serverkey = self.public_key

    def is_trusted(self, frame: Any) -> bool:
        """Whether a received frame came from an authenticated member."""
        if self.mode != "curve":
            return True  # ipc: the kernel already refused everyone else
        try:
            return frame.get("User-Id") == self.user_id
        except (zmq.ZMQError, AttributeError):
            return False


def private_dir(prefix: str = "actorpy-") -> str:
    """A fresh directory that only this user can open, for ipc endpoints."""
    import tempfile

    path = tempfile.mkdtemp(prefix=prefix)  # mkdtemp creates it with mode 0700
    os.chmod(path, 0o700)
    return path
