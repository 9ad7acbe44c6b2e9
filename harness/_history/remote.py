"""A history that is not a local folder: opened with bounded waits, its failures said in one line.

pyarrow opens any URI its filesystems know (``s3://``, ``gs://``, ``abfs://``, ``hdfs://``), but
left as they are its clients wait long on a network that does not answer (an S3 endpoint that
takes the connection and never replies: 99 s; ``gs://`` without a network: until killed), their
credential helpers print on leakgate's stderr (``/bin/sh: 1: az: not found``), and a 404 from
something that is not an S3 server reads as a missing bucket. Here:

- every wait has a limit, :func:`wait_limit` seconds (``LEAKGATE_HISTORY_TIMEOUT``, 30 by
  default). S3's client is given it, retries included (:data:`ATTEMPTS` tries, a third each,
  at least a second); GCS's retries are given it. The first contact (:func:`contact`) is given
  up once it passes for any store but S3 (whose stuck client would hold the process at its
  exit; its own limit bounds it).
- what a client's helpers print during the first contact is kept back, and given back only
  when the contact succeeds: a failure is leakgate's one line.
- a store's error is said as what failed (:func:`problem`): the network, the endpoint, the
  credentials, the bucket; pyarrow's own words follow.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from harness._core.errors import BadInput, one_line

T = TypeVar("T")
TIMEOUT_VARIABLE = "LEAKGATE_HISTORY_TIMEOUT"
DEFAULT_TIMEOUT = 30.0
ATTEMPTS = 3
"""Tries of one S3 request, each given a third of the limit."""
WHOLE_ON_CLOSE = ("s3", "gcs")
"""Stores where an object appears whole when its upload completes, and never before: a run's
file is written under its own name there (a rename would be a copy and a delete)."""
OWN_LIMIT = ("s3",)
"""Stores whose client bounds its own waits, and whose waits are never given up from outside."""


def wait_limit() -> float:
    """The longest wait on a store, in seconds: ``LEAKGATE_HISTORY_TIMEOUT``, else 30.
    ``BadInput`` for a value that is not a number of seconds above zero."""
    given = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not given:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(given)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        said = f"expected a number of seconds above 0, got {given!r}"
        raise BadInput(said, field=TIMEOUT_VARIABLE)
    return seconds


def open_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of ``uri`` (:meth:`pyarrow.fs.FileSystem.from_uri`), its waits
    bounded by :func:`wait_limit` where its client takes a bound."""
    limit = wait_limit()
    scheme = uri.partition("://")[0].lower()
    if scheme in ("gs", "gcs") and "retry_limit_seconds=" not in uri:
        uri += f"{'&' if '?' in uri else '?'}retry_limit_seconds={limit:g}"
    fs, path = pafs.FileSystem.from_uri(uri)
    if isinstance(fs, pafs.S3FileSystem):
        options: dict[str, Any] = fs.__reduce__()[1][0]  # what from_uri chose: region, endpoint
        each = max(limit / ATTEMPTS, 1.0)  # curl counts a silent reply's wait in whole seconds
        options.update(
            connect_timeout=each,
            request_timeout=each,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=ATTEMPTS),
            allow_delayed_open=True,  # a small file is one PutObject, sent when it is closed
        )
        fs = pafs.S3FileSystem(**options)
    return fs, path


def contact(fs: pafs.FileSystem, ask: Callable[[], T], where: str) -> T:
    """``ask()``'s answer: the first request to the store at ``where``, made quietly and given up
    after :func:`wait_limit` (unless the store bounds its own waits). ``BadInput`` (one line) for
    a store that fails or does not answer."""
    limit = wait_limit()
    try:
        with _quiet_stderr():
            if fs.type_name in OWN_LIMIT:
                return ask()
            return _within(ask, limit, where)
    except (OSError, pa.ArrowException) as exc:
        raise BadInput(f"cannot open the history: {problem(exc)}", path=where) from None


def _within(ask: Callable[[], T], limit: float, where: str) -> T:
    """``ask()`` in a thread of its own, given up (and left to end by itself) after ``limit``."""
    answer: list[T] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            answer.append(ask())
        except BaseException as exc:  # handed to the caller below
            raised.append(exc)

    thread = threading.Thread(target=run, name="leakgate-history-contact", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        raise BadInput(
            f"no answer within {limit:g} s: is the network up? ({TIMEOUT_VARIABLE} sets the wait)",
            path=where,
        )
    if raised:
        raise raised[0]
    return answer[0]


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 sent to a temporary file while a store's client starts (its credential
    helpers, run as child processes, write there); given back to stderr once it succeeded."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as kept:
        sys.stderr.flush()
        os.dup2(kept.fileno(), 2)
        succeeded = False
        try:
            yield
            succeeded = True
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if succeeded:
                kept.seek(0)
                said = kept.read()
                if said:
                    os.write(2, said)


SAID = (
    ("NO_SUCH_BUCKET", "the bucket does not exist"),
    ("SIGNATURE_DOES_NOT_MATCH", "the credentials were refused (a wrong secret key)"),
    ("INVALID_ACCESS_KEY_ID", "the credentials were refused (an access key the store never made)"),
    ("ACCESS_DENIED", "access denied: the credentials lack a permission the history needs"),
    ("Could not resolve", "the host name does not resolve: is the network up?"),
    ("Timeout was reached", "no answer within {limit:g} s: is the network up?"),
    ("Could not connect", "nothing answers at the endpoint: is it right, is the network up?"),
    (
        "RESOURCE_NOT_FOUND",
        "the endpoint answered 404 without saying what is missing, as no S3 server does: is "
        "AWS_ENDPOINT_URL right, or is a proxy answering for a network that is down?",
    ),
    ("Retry policy exhausted", "the store did not answer within {limit:g} s of retries"),
)
"""What a store's error means, by the words pyarrow's clients use for it (they give no codes);
``{limit}`` is :func:`wait_limit`."""


UNREACHABLE = ("NETWORK_CONNECTION", "Could not resolve", "Could not connect", "Retry policy")
"""pyarrow's words for a store that was never reached."""


def unreachable(error: BaseException) -> bool:
    """Whether ``error`` says the store was never reached (no answer, no route, no name): asking
    it something else would only wait again."""
    words = one_line(error)
    return any(mark in words for mark in UNREACHABLE)


def problem(error: BaseException) -> str:
    """A store's error as one line: what failed (:data:`SAID`), then pyarrow's words."""
    words = one_line(error)
    for mark, meaning in SAID:
        if mark in words:
            return f"{meaning.format(limit=wait_limit())} ({words})"
    return words
