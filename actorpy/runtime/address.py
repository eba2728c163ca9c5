"""Cluster addresses: which security an address implies, and where a node should bind.
Shared by ``actorpy.connect`` and the CLI so both apply the same rules."""
from __future__ import annotations

import errno
import os
import re
import socket
import stat
from typing import TypeVar

from actorpy.errors import ActorpyError, ConfigError
from actorpy.wire import auth
from actorpy.wire.auth import Security

_ENDPOINT = re.compile(r"^(tcp://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.*-]+):(\d{1,5}|\*)"
                       r"|ipc://[^\s\x00]+)$")


def is_endpoint(address: object) -> bool:
    """Whether ``address`` looks like an endpoint a node can listen on or connect to.

    >>> is_endpoint("tcp://10.0.0.5:7400"), is_endpoint("ipc:///tmp/x"), is_endpoint("tcp://h")
    (True, True, False)
    """
    if not isinstance(address, str) or not _ENDPOINT.match(address):
        return False
    return not address.startswith("tcp://") or address.endswith(":*") or \
        0 <= int(address.rsplit(":", 1)[1]) < 65536


def _why_not(address: object) -> str:
    """What is wrong with an address that is almost right (said after the general rule).

    >>> _why_not("ipc:///tmp/my dir/m"), _why_not("tcp://h:99999"), _why_not("http://h")
    (': an ipc path may hold no spaces or NUL characters', ': the port is 0 to 65535', '')
    """
    if not isinstance(address, str):
        return ""
    if address.startswith("ipc://") and re.search(r"[\s\x00]", address[6:]):
        return ": an ipc path may hold no spaces or NUL characters"
    if address == "ipc://":
        return ": an ipc address needs a path"
    port = re.fullmatch(r"tcp://[^\s/:]+:(\d+)", address)
    if port and int(port.group(1)) > 65535:
        return ": the port is 0 to 65535"
    return ""


def security_for(address: str, *, secret: str | bytes | None = None,
                 secret_file: str | None = None) -> Security:
    """The security an address implies: ipc -> the directory's permissions, tcp -> CURVE.

    Raises:
        ConfigError: a malformed address, an ipc directory that is missing or open to other
            users, or tcp without a cluster secret.
    """
    if not is_endpoint(address):
        raise ConfigError(f"address must be tcp://HOST:PORT or ipc://PATH, not {address!r}"
                          + _why_not(address))
    refuse_ipv6(address)
    if address.startswith("ipc://"):
        folder = os.path.dirname(address[len("ipc://"):]) or "."
        try:
            info = os.stat(folder)
        except OSError as exc:
            raise ConfigError(f"ipc directory {folder}: {exc.strerror}") from None
        if info.st_mode & stat.S_ISVTX or info.st_uid != os.getuid():
            # a shared directory (/tmp, /var/tmp) or another user's: `chmod 700` there, as
            # this said for /tmp, would lock every other user and service out of it
            raise ConfigError(f"ipc directory {folder} is shared with other users or not "
                              "yours; put the socket in a directory of your own that only "
                              "you can open: `mkdir -m 700 DIR`, then ipc://DIR/NAME")
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"ipc directory {folder} can be opened by other users; "
                              f"`chmod 700 {folder}` first (ipc trust is the directory's)")
        return Security.ipc()
    key = auth.read_secret(secret_file, secret)
    if key is None:
        raise secret_error(ConfigError, "tcp needs the cluster secret: give it with {how}; "
                                        "make one with `actorpy secret --out F`")
    return Security.curve(key)


#: how a caller gives the cluster secret: to ``connect()``, and on the command line
SECRET_PARAMS = "secret=/secret_file= (or ACTORPY_SECRET)"
SECRET_FLAGS = "--secret-file (or ACTORPY_SECRET)"
E = TypeVar("E", bound=ActorpyError)


def secret_error(cls: type[E], text: str) -> E:
    """``cls(text)`` with its ``{how}`` naming ``connect()``'s parameters, and a
    ``cli_message`` naming the command line's flags.

    >>> err = secret_error(ConfigError, "give it with {how}")
    >>> print(err, "|", err.cli_message)
    give it with secret=/secret_file= (or ACTORPY_SECRET) | give it with --secret-file
    (or ACTORPY_SECRET)
    """
    err = cls(text.format(how=SECRET_PARAMS))
    err.cli_message = text.format(how=SECRET_FLAGS)
    return err


def refuse_ipv6(address: str) -> None:
    """Refuse ``tcp://[IPv6]:PORT``: our sockets are IPv4 only (ZeroMQ's bind says "No such
    device", a route lookup "Address family for hostname not supported", a dial waits)."""
    if address.startswith("tcp://["):
        raise ConfigError(f"{address} is an IPv6 address: nodes listen and dial on IPv4 only; "
                          "give an IPv4 address or a host name that resolves to one")


def advertise_host(manager_address: str) -> str:
    """The local IP address that routes to the manager (where peers can reach us).

    Raises:
        ConfigError: the manager's host name does not resolve.
    """
    host = manager_address[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host in ("0.0.0.0", "*", "localhost", "127.0.0.1"):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))  # no packet is sent: this only picks the route
            return s.getsockname()[0]
    except OSError as exc:
        raise ConfigError(f"cannot find a route to the manager host {host!r}: {exc}") from None


def node_bind(manager_address: str, node_id: str, host: str | None = None) -> str:
    """Where a node joining ``manager_address`` binds: next to it (ipc) or on a free port
    of the address that routes to it (tcp)."""
    if manager_address.startswith("ipc://"):
        return f"ipc://{os.path.dirname(manager_address[len('ipc://'):])}/{node_id}"
    if host is not None and ":" in host:
        # our sockets are IPv4 only; ZeroMQ's own word for an IPv6 host is "No such device"
        raise ConfigError(f"host {host!r} looks like an IPv6 address: nodes listen on IPv4 "
                          "only; give an IPv4 address or a host name that resolves to one")
    return f"tcp://{host or advertise_host(manager_address)}:*"


#: hosts that mean "every interface" to a bind, and that no other machine can dial
ALL_INTERFACES = frozenset({"0.0.0.0", "*"})


def worker_bind(bind: str) -> str:
    """What ZeroMQ binds for a worker's ``--bind tcp://HOST:PORT``; port 0 or ``*``: any
    free one.

    >>> worker_bind("tcp://0.0.0.0:7401"), worker_bind("tcp://10.0.0.5:0")
    ('tcp://0.0.0.0:7401', 'tcp://10.0.0.5:*')

    Raises:
        ConfigError: not a tcp://HOST:PORT.
    """
    if not (bind.startswith("tcp://") and is_endpoint(bind)):
        raise ConfigError(f"--bind must be tcp://HOST:PORT (HOST 0.0.0.0: every interface; "
                          f"PORT 0: any free port), not {bind!r}" + _why_not(bind))
    refuse_ipv6(bind)
    host, _, port = bind.rpartition(":")
    return f"{host}:{'*' if port in ('*', '0') else int(port)}"


def check_host(host: str) -> str:
    """A ``--host``: the bare host name or IPv4 address other nodes dial (no port).

    Raises:
        ConfigError: empty, a port or scheme with it, or an address nobody can dial.
    """
    if host in ALL_INTERFACES:
        raise ConfigError(f"--host {host} is not an address other nodes can dial: to listen "
                          "on every interface, give --bind tcp://0.0.0.0:PORT, and --host the "
                          "address the others reach this machine at")
    if ":" in host or not is_endpoint(f"tcp://{host}:1"):
        # our sockets are IPv4 only; ZeroMQ's own word for an IPv6 host is "No such device"
        raise ConfigError(f"--host must be a host name or an IPv4 address, without a port "
                          f"(that comes from --bind), not {host!r}")
    return host


def advertised(bound: str, host: str | None, manager_address: str) -> str:
    """Where other nodes reach a node bound at ``bound`` (its real port): at ``host`` if
    given, else at the bound host, else (bound to every interface) at the address that
    routes to the manager. An ipc address is its own.

    >>> advertised("tcp://0.0.0.0:7401", "203.0.113.7", "tcp://10.0.0.4:7400")
    'tcp://203.0.113.7:7401'
    """
    if not bound.startswith("tcp://"):
        return bound
    bound_host, _, port = bound[len("tcp://"):].rpartition(":")
    if host is None and bound_host in ALL_INTERFACES:
        host = advertise_host(manager_address)
    return f"tcp://{host or bound_host}:{port}"


def refuse_served_ipc(bind: str) -> None:
    """Refuse an ipc path another process listens on: ZeroMQ's bind would replace its
    socket file without a word, and that process would no longer be reachable there."""
    if not bind.startswith("ipc://"):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(bind[len("ipc://"):])
    except OSError:  # no such file, a stale one, or a path too long: the bind decides
        return
    finally:
        probe.close()
    raise ConfigError(f"cannot bind {bind}: another process listens there")


def bind_refused(bind: str, exc: OSError) -> ConfigError:
    """The error for a bind the system refused (``exc``, a ``zmq.ZMQError``): a tcp host that
    is not this machine's says so and how to listen everywhere, where the system's words
    alone ("No such device", "Cannot assign requested address") named neither."""
    reason = str(exc.strerror or exc).split(" (addr=")[0]   # the address is said already
    text = f"cannot bind {bind}: {reason}"
    if bind.startswith("tcp://") and exc.errno in (errno.ENODEV, errno.EADDRNOTAVAIL):
        text += ("; that host is not an address or interface of this machine "
                 "(tcp://0.0.0.0:PORT listens on every interface)")
    return ConfigError(text)
