"""URLs that fsspec opens (`s3://bucket/...`): the filesystem behind a URL, and a URL that cannot be
read, as one line.

An `s3://` URL opens through s3fs (the `s3` extra), which builds its client with botocore's own
configuration chain, so the endpoint and credentials come from the usual environment variables:
`AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL` (an S3-compatible server: MinIO, Ceph, moto), the
credentials from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (`AWS_SESSION_TOKEN`), `AWS_PROFILE` or
`~/.aws`, and the region from `AWS_REGION` / `AWS_DEFAULT_REGION`. pipebench passes s3fs nothing of
its own, so a URL reads here as it reads in the user's training script.

An object that does not exist is the dataset's bad input (a missing shard: named, or skipped under
`dataset.on_bad_sample=skip`); anything else a URL raises (no library for its protocol, an endpoint
that does not answer, credentials refused) is one line naming the URL, before any job runs.
"""

from typing import Any, Tuple

from pipebench.base.errors import DatasetError
from pipebench.base.extras import MissingExtra, missing_line

__all__ = ["ENDPOINT_SETTINGS", "PROTOCOL_EXTRAS", "protocol_of", "unreadable", "url_fs"]

# The protocols whose fsspec library an extra of pipebench installs: protocol -> (library, extra).
PROTOCOL_EXTRAS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3")}
# Where s3fs (through botocore) takes the endpoint and credentials from, as the unreadable line says.
ENDPOINT_SETTINGS = ("the endpoint comes from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, the credentials from "
                     "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws")


def protocol_of(url: str) -> str:
    """`s3` of `s3://bucket/key`."""
    return url.split("://", 1)[0].lower()


def url_fs(url: str) -> Tuple[Any, str]:
    """(fsspec filesystem, path in it) of `url`; a DatasetError line naming the URL when no library
    reads its protocol (with the pip line of pipebench's extra where one installs it)."""
    import fsspec  # torch's own dependency

    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        protocol = protocol_of(url)
        if protocol in PROTOCOL_EXTRAS:
            library, extra = PROTOCOL_EXTRAS[protocol]
            raise DatasetError(f"{url}: {missing_line([MissingExtra(f'an {protocol}:// URL', library, extra)])}") from None
        raise DatasetError(f"{url}: {exc}") from None
    except ValueError as exc:
        raise DatasetError(f"{url}: not a path or a URL fsspec opens ({exc})") from None


def unreadable(url: str, exc: BaseException) -> DatasetError:
    """The one line for a URL that cannot be read for a reason other than a missing object: the URL,
    the error's first line, and where an s3:// URL's endpoint and credentials come from."""
    if isinstance(exc, DatasetError):
        return exc
    text = str(exc).strip().splitlines()
    why = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    where = f"; {ENDPOINT_SETTINGS}" if protocol_of(url) in PROTOCOL_EXTRAS else ""
    return DatasetError(f"{url}: cannot read it ({why}){where}")
