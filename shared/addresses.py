"""URLs that name several servers: a RabbitMQ cluster's nodes, or a Postgres primary and its
standbys, written as libpq writes them, hosts separated by commas:

    amqp://user:pass@10.0.0.1:5672,10.0.0.2:5672,10.0.0.3:5672/vhost
    postgresql://user@db1:5432,db2:5432/saga?target_session_attrs=read-write

asyncpg reads the second form itself (and with ``target_session_attrs=read-write`` picks the
writable one). For the broker, ``one_per_host`` makes one URL per node, which
``saga_shared.transport.bus`` tries in turn."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


def _netloc_parts(url: str) -> tuple[str, str]:
    """``(credentials with their @, hosts)`` of the URL's network location."""
    netloc = urlsplit(url).netloc
    credentials, at, hosts = netloc.rpartition("@")
    return (credentials + at, hosts)


def hosts_of(url: str) -> list[str]:
    """Each ``host[:port]`` the URL names, in order (an IPv6 literal keeps its brackets)."""
    return [h for h in _netloc_parts(url)[1].split(",") if h] or [""]


def one_per_host(url: str) -> list[str]:
    """The URL once per host it names, each with the same credentials, path and query."""
    parts = urlsplit(url)
    credentials, _ = _netloc_parts(url)
    return [urlunsplit(parts._replace(netloc=credentials + host)) for host in hosts_of(url)]


def with_netloc_credentials(url: str, credentials: str) -> str:
    """``url`` with ``credentials`` (``user:password@``, quoted) in place of its own; every
    host kept."""
    parts = urlsplit(url)
    _, hosts = _netloc_parts(url)
    return urlunsplit(parts._replace(netloc=credentials + hosts))


def with_default_query(url: str, name: str, value: str) -> str:
    """``url`` with ``name=value`` added to its query, unless the query names ``name`` itself
    (what the URL says wins)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key == name for key, _ in query):
        return url
    return urlunsplit(parts._replace(query=urlencode([*query, (name, value)])))
