"""URLs that fsspec opens (`s3://bucket/...`): the filesystem behind a URL, and a URL that cannot be
read, as one line.

An `s3://` URL opens through s3fs (the `s3` extra), which builds its client with botocore's own
configuration chain, so the endpoint and credentials come from the usual environment variables:
`AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL` (an S3-compatible server: MinIO, Ceph, moto), the
credentials from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (`AWS_SESSION_TOKEN`), `AWS_PROFILE` or
`~/.aws`, and the region from `AWS_REGION` / `AWS_DEFAULT_REGION`. pipebench passes s3fs nothing of
its own but the bounds below, so a URL reads here as it reads in the user's training script.

Every read is bounded: an endpoint that accepts the connection and never answers (a black hole) gave
no output for over 400 s under s3fs's and botocore's defaults, which multiply (s3fs retries each call 5
times, botocore each request 5 times, 15 s a read). pipebench gives botocore a connect and a read timeout
and a total attempt count (STORE_CONNECT_TIMEOUT_S, STORE_READ_TIMEOUT_S, STORE_ATTEMPTS) and leaves s3fs's
own loop one try, so a black hole ends within STORE_ATTEMPTS x the read timeout, in a line that names the
URL, the attempts and the time. The user's own settings win: `AWS_MAX_ATTEMPTS` (botocore's), and
fsspec's configuration for the protocol (`FSSPEC_S3='{"config_kwargs": {"read_timeout": 60}}'`, or
`fsspec.config.conf["s3"]`). An `http(s)://` URL (fsspec's HTTP filesystem, aiohttp) gets the same two
timeouts and one attempt.

An object that does not exist is the dataset's bad input (a missing shard: named, or skipped under
`dataset.on_bad_sample=skip`); anything else a URL raises (no library for its protocol, an endpoint
that does not answer, credentials refused) is one line naming the URL, before any job runs.
"""

import os
from typing import Any, Dict, Optional, Tuple

from pipebench.base.errors import DatasetError
from pipebench.base.extras import MissingExtra, installed, missing_line

__all__ = ["PROTOCOL_EXTRAS", "STORE_ATTEMPTS", "STORE_CONNECT_TIMEOUT_S", "STORE_READ_TIMEOUT_S",
           "access_denied", "is_url", "protocol_of", "read_failure", "store_options", "unreadable", "url_fs"]

# The protocols whose fsspec library an extra of pipebench installs: protocol -> (library, extra).
PROTOCOL_EXTRAS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3")}
# Where s3fs (through botocore) takes the endpoint and credentials from, as the unreadable line says.
ENDPOINT_SETTINGS = ("the endpoint comes from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, the credentials from "
                     "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws")


# Seconds a connection to the store may take to open: s3fs's own default; a store in the same region or
# on the LAN opens one in milliseconds, so 5 s is a store that is not there.
STORE_CONNECT_TIMEOUT_S = 5.0
# Seconds a request may wait for its next bytes (botocore's socket read timeout, not the whole transfer):
# s3fs's own default. A shard's ranged GET streams continuously; 15 s of silence is a store that hangs.
STORE_READ_TIMEOUT_S = 15.0
# Attempts a request gets, the first included (botocore's standard retry mode, with its jittered
# backoff of at most 1 s then 2 s): a throttled or restarted store recovers, a black hole ends in about
# 3 x 15 s + 3 s, where the defaults took more than 400 s.
STORE_ATTEMPTS = 3
# botocore reads the user's attempt count from here when its Config names none.
ATTEMPTS_VARIABLE = "AWS_MAX_ATTEMPTS"
HTTP_PROTOCOLS = ("http", "https")


def is_url(path: str) -> bool:
    """Whether `path` names a URL fsspec opens (`s3://`, `https://`, `file://`) rather than a local path."""
    return "://" in path


def protocol_of(url: str) -> str:
    """`s3` of `s3://bucket/key`."""
    return url.split("://", 1)[0].lower()


def _attempts() -> int:
    """The attempts botocore gives a request: the user's AWS_MAX_ATTEMPTS, else STORE_ATTEMPTS."""
    try:
        return max(1, int(os.environ[ATTEMPTS_VARIABLE]))
    except (KeyError, ValueError):
        return STORE_ATTEMPTS


def _s3_config(user: Dict[str, Any]) -> Dict[str, Any]:
    """botocore's Config arguments: pipebench's timeouts and retries, under those of the user's fsspec s3
    configuration `user`."""
    config: Dict[str, Any] = {"connect_timeout": STORE_CONNECT_TIMEOUT_S, "read_timeout": STORE_READ_TIMEOUT_S}
    if ATTEMPTS_VARIABLE not in os.environ:
        config["retries"] = {"total_max_attempts": STORE_ATTEMPTS, "mode": "standard"}
    return {**config, **user.get("config_kwargs", {})}


def _fsspec_conf(protocols: Tuple[str, ...]) -> Dict[str, Any]:
    """fsspec's configuration for the first of `protocols` that has one."""
    import fsspec.config

    return next((dict(fsspec.config.conf[p]) for p in protocols if p in fsspec.config.conf), {})


def store_options(url: str) -> Dict[str, Any]:
    """The storage options that bound every read of `url` ({} for a protocol read without a network)."""
    protocol = protocol_of(url)
    if protocol in PROTOCOL_EXTRAS and installed("s3fs"):  # fsspec's s3 configuration, with botocore's bounds
        user = _fsspec_conf(("s3",))
        return {**user, "config_kwargs": _s3_config(user)}
    if protocol in HTTP_PROTOCOLS and installed("aiohttp"):  # aiohttp's timeouts, under fsspec's http config
        import aiohttp  # fsspec's HTTP filesystem needs it

        user = _fsspec_conf(HTTP_PROTOCOLS)
        timeout = aiohttp.ClientTimeout(sock_connect=STORE_CONNECT_TIMEOUT_S, sock_read=STORE_READ_TIMEOUT_S)
        return {**user, "client_kwargs": {"timeout": timeout, **user.get("client_kwargs", {})}}
    return {}


def url_fs(url: str) -> Tuple[Any, str]:
    """(fsspec filesystem, path in it) of `url`, its reads bounded (store_options); a DatasetError line
    naming the URL when no library reads its protocol (with the pip line of pipebench's extra where one
    installs it)."""
    import fsspec  # torch's own dependency

    protocol = protocol_of(url)
    try:
        fs, path = fsspec.core.url_to_fs(url, **store_options(url))
        if protocol in PROTOCOL_EXTRAS:
            fs.retries = 1  # s3fs's own loop around botocore's would multiply the attempts
        return fs, path
    except ImportError as exc:
        if protocol in PROTOCOL_EXTRAS:
            library, extra = PROTOCOL_EXTRAS[protocol]
            raise DatasetError(f"{url}: {missing_line([MissingExtra(f'an {protocol}:// URL', library, extra)])}") from None
        raise DatasetError(f"{url}: {exc}") from None
    except ValueError as exc:
        raise DatasetError(f"{url}: not a path or a URL fsspec opens ({exc})") from None


def _endpoint_hint(location: str) -> str:
    """Where the endpoint and credentials come from, for an s3:// URL's line ('' for any other)."""
    return f"; {ENDPOINT_SETTINGS}" if protocol_of(location) in PROTOCOL_EXTRAS else ""


def access_denied(reader: str, where: str, exc: BaseException, location: str) -> DatasetError:
    """The line for a file the storage refuses to let `reader` read (a bucket's 403, a file's mode): named
    as a denial, not as a damaged file, with where an s3:// URL's endpoint and credentials come from."""
    return DatasetError(f"{reader}: {where}: access denied ({exc}){_endpoint_hint(location)}")


def unreadable(url: str, exc: BaseException) -> DatasetError:
    """The one line for a URL that cannot be read for a reason other than a missing object: the URL,
    the error's first line, and where an s3:// URL's endpoint and credentials come from."""
    if isinstance(exc, DatasetError):
        return exc
    text = str(exc).strip().splitlines()
    why = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    where = _endpoint_hint(url)
    waited = _no_answer(url, exc)
    if waited is not None:
        return DatasetError(f"{url}: the store gave no answer: {waited} ({why}){where}")
    return DatasetError(f"{url}: cannot read it ({why}){where}")


def read_failure(location: str, exc: BaseException, where: Optional[str] = None) -> BaseException:
    """What a reader raises for a read of `location` that failed in a way it does not name itself: for a
    URL, whose store raises its own errors (botocore's, not only OSError), the one unreadable line naming
    `where` (the location unless given); for a local path, the error itself."""
    return unreadable(where or location, exc) if is_url(location) else exc


def _no_answer(url: str, exc: BaseException) -> Optional[str]:
    """For a read that timed out: its attempts and the time they took as the bounds give them (each
    attempt waits out its timeout), and what changes them. None for any other error."""
    name = type(exc).__name__
    if not (isinstance(exc, TimeoutError) or name.endswith(("TimeoutError", "Timeout"))):
        return None
    what = "connect" if "Connect" in name else "read"
    if protocol_of(url) in PROTOCOL_EXTRAS:
        config = _s3_config(_fsspec_conf(("s3",)))
        attempts = config.get("retries", {}).get("total_max_attempts", _attempts())
        change = f"fsspec's s3 config_kwargs or {ATTEMPTS_VARIABLE} change them"
    else:
        config, attempts, change = {}, 1, "fsspec's client_kwargs change them"
    each = float(config.get(f"{what}_timeout", STORE_CONNECT_TIMEOUT_S if what == "connect" else STORE_READ_TIMEOUT_S))
    return f"{attempts} attempt(s) of a {each:g} s {what} timeout, about {attempts * each:g} s ({change})"
