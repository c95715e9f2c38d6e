"""--rdzv-endpoint and --node-rank, checked before anything is written: torchrun would wait out its rendezvous
timeout on a name that does not resolve, and take a node rank outside the world as a peer that never comes."""

from __future__ import annotations

import ipaddress
import re
import socket
import threading

from launcher.backends import backend_spec
from launcher.config.job import Job
from launcher.errors import ConfigError
from launcher.session.options import RunOptions

RESOLVE_TIMEOUT_S = 5.0
"""How long the host's name may take to resolve: a working resolver answers in milliseconds; torchrun itself
would wait its whole rendezvous timeout on one that does not."""
HOST_CHARS = 253
"""The longest DNS name (RFC 1035)."""
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")
EXAMPLE = "give host:port of node 0, e.g. --rdzv-endpoint node0:29400"


def split_endpoint(text: str) -> tuple[str, int | None]:
    """(host, port or None) of torchrun's ``host[:port]`` / ``[ipv6][:port]``; ConfigError naming what is wrong."""
    flag = f"--rdzv-endpoint {text!r}"
    if not text or text != text.strip() or any(c.isspace() for c in text):
        raise ConfigError(f"{flag}: an endpoint has no spaces and is not empty; {EXAMPLE}")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ConfigError(f"{flag}: an IPv6 address is written [address]:port; e.g. [fd00::1]:29400")
        port_text = rest[1:] if rest else None
    elif text.count(":") > 1:
        raise ConfigError(f"{flag}: an IPv6 address needs brackets, [address]:port; e.g. [fd00::1]:29400")
    else:
        host, _, port_text = text.partition(":") if ":" in text else (text, "", None)
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"{flag}: the port {port_text!r} is not a port (1 to 65535); {EXAMPLE}")
    return host, int(port_text)


def host_problem(host: str) -> str | None:
    """Why ``host`` is neither an IP address nor a DNS name by its syntax, or None."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if not host:
        return "has no host before the port"
    if len(host) > HOST_CHARS or not all(_LABEL.match(label) for label in host.removesuffix(".").split(".")):
        return "is no host name (letters, digits, hyphens and dots, at most 253 characters) or IP address"
    return None


def resolves(host: str, port: int | None, timeout_s: float = RESOLVE_TIMEOUT_S) -> str | None:
    """None when ``host`` resolves within ``timeout_s``, else why not. getaddrinfo has no timeout of its own, so it
    runs in a daemon thread that is left behind when it does not answer."""
    found: list[str | None] = []

    def look_up() -> None:
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            found.append(None)
        except (OSError, UnicodeError) as e:
            found.append(getattr(e, "strerror", None) or str(e) or type(e).__name__)

    t = threading.Thread(target=look_up, name="rdzv-resolve", daemon=True)
    t.start()
    t.join(timeout_s)
    if not found:
        return f"no answer from the resolver within {timeout_s:.0f} s"
    return found[0]


def check_rendezvous(job: Job, opts: RunOptions) -> None:
    """--node-rank within 0..nodes-1 and --rdzv-endpoint a host:port that resolves, before anything is written (a
    Slurm job finds its head node itself: launcher.session.run.make_backend refuses both flags there)."""
    if backend_spec(job.launcher).queued:
        return
    if opts.node_rank < 0 or opts.node_rank >= max(job.nodes, 1):
        raise ConfigError(f"--node-rank {opts.node_rank}: node ranks run from 0 to --nodes - 1 "
                          f"({max(job.nodes, 1) - 1} here); give this node's place, 0 on the first node")
    if not opts.rdzv_endpoint:
        return
    text = opts.rdzv_endpoint
    host, port = split_endpoint(text)
    bad = host_problem(host)
    if bad:
        raise ConfigError(f"--rdzv-endpoint {text!r}: {host!r} {bad}; {EXAMPLE}")
    why = resolves(host, port)
    if why:
        raise ConfigError(f"--rdzv-endpoint {text!r}: {host!r} does not resolve ({why}); give the first node's "
                          "name as this node resolves it, or its IP address")
