"""Where data lives: local paths and object-store URLs (``s3://``, ``gs://``).

Files (JSONL, Parquet, index sidecars) are read through fsspec filesystems;
TokenStore arrays through TensorStore kvstore drivers. Both take their endpoint
and credentials from the standard environment, and an explicit
``storage_options`` mapping overrides it:

============  =====================================================  ==========================
scheme        environment                                            ``storage_options`` keys
============  =====================================================  ==========================
``s3://``     ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,           ``endpoint_url``, ``key``,
              ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,      ``secret``, ``token``,
              ``AWS_REGION``, ``AWS_PROFILE``                         ``region``, ``profile``,
                                                                     ``anon``
``gs://``     ``GOOGLE_APPLICATION_CREDENTIALS``; emulators:         ``token``, ``project``,
              ``STORAGE_EMULATOR_HOST`` (fsspec) and                 ``endpoint_url``
              ``TENSORSTORE_GCS_HTTP_URL`` (TensorStore)
============  =====================================================  ==========================

Any other scheme raises :class:`StorageError`: a URL is never taken as a local path.
Transient errors (connection resets, timeouts, throttling, 5xx, responses cut
short) are retried within one budget per read, :class:`RetryPolicy` (set by
``ZEPHON_JAX_STORAGE_RETRY`` or :func:`set_retry_policy`), whatever library makes
the requests: the libraries' own retries are turned off. Each retry is logged on
the ``zephon_jax.storage`` logger; a permanent error (missing object, denied
access) raises at once and names the URL.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import random
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from zephon_jax.errors import ZephonError

__all__ = [
    "Location",
    "RetryPolicy",
    "ShortReadError",
    "StorageError",
    "filesystem",
    "is_url",
    "join",
    "kvstore_spec",
    "retry_call",
    "retry_policy",
    "set_retry_policy",
    "split_url",
]

log = logging.getLogger("zephon_jax.storage")

SUPPORTED_SCHEMES = ("s3", "gs", "gcs", "file")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.S)

T = TypeVar("T")


class StorageError(ZephonError, OSError):
    """A location cannot be used: an unsupported URL scheme, or a permanent storage error."""


def split_url(path: str | os.PathLike[str]) -> tuple[str | None, str]:
    """``(scheme, rest)`` of a URL, ``(None, path)`` of a local path.

    ``file://`` URLs are local paths. Raises StorageError for a scheme other than
    ``s3``, ``gs`` (alias ``gcs``) and ``file``.
    """
    text = os.fspath(path)
    if not isinstance(text, str):
        raise StorageError(f"a path must be a str or os.PathLike, got {type(path).__name__}")
    m = _URL.match(text)
    if m is None:
        return None, text
    scheme = m.group(1).lower()
    if scheme not in SUPPORTED_SCHEMES:
        raise StorageError(
            f"unsupported URL scheme {scheme!r} in {text!r}: zephon_jax reads and writes local "
            f"paths, s3:// and gs:// URLs; copy the data to one of those"
        )
    if scheme == "file":
        return None, m.group(2)
    return ("gs" if scheme == "gcs" else scheme), m.group(2)


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an object-store URL (``s3://`` or ``gs://``)."""
    return split_url(path)[0] is not None


def join(base: str, *names: str) -> str:
    """``base/name/...`` for a local path or a URL."""
    out = os.fspath(base)
    for name in names:
        out = out.rstrip("/") + "/" + name if is_url(out) else os.path.join(out, name)
    return out


def _bucket_and_key(scheme: str, rest: str, url: str) -> tuple[str, str]:
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise StorageError(f"{url!r} names no bucket; write {scheme}://BUCKET/PATH")
    return bucket, key


# ----- fsspec (files) --------------------------------------------------------------


def fsspec_options(scheme: str | None, storage_options: Mapping[str, Any] | None) -> dict:
    """fsspec filesystem arguments for ``scheme``: the environment, then ``storage_options``."""
    given = dict(storage_options or {})
    if scheme == "s3":
        opts: dict[str, Any] = {}
        endpoint, region = _s3_endpoint_and_region(given)
        if endpoint:
            opts["endpoint_url"] = endpoint
        if region:
            opts["client_kwargs"] = {"region_name": region}
        if "profile" in given:
            opts["profile"] = given.pop("profile")
        opts["config_kwargs"] = {**_botocore_config(), **given.pop("config_kwargs", {})}
        opts.update(given)
        return opts
    if scheme == "gs":
        if "endpoint_url" not in given and os.environ.get("STORAGE_EMULATOR_HOST"):
            given["endpoint_url"] = os.environ["STORAGE_EMULATOR_HOST"]
        if given.get("endpoint_url") and "token" not in given:
            given["token"] = "anon"  # an emulator takes no credentials
        return given
    return given


def _botocore_config() -> dict[str, Any]:
    """botocore settings of an s3fs filesystem: the policy's timeouts, no retries of its own."""
    policy = retry_policy()
    return {
        "connect_timeout": policy.timeout,
        "read_timeout": policy.timeout,
        "retries": {"total_max_attempts": 1},
    }


def filesystem(
    path: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    *,
    stream: bool = False,
) -> tuple[Any, str]:
    """``(fsspec filesystem, path inside it)`` for a local path or a URL.

    An s3fs filesystem makes one try per request (its own retries and botocore's are off),
    with the timeouts of :func:`retry_policy`: :func:`retry_call` retries within one budget.
    With ``stream``, for a file read from start to end that no caller can restart, it is
    a filesystem of its own whose requests s3fs tries up to ``attempts`` times each.
    """
    import fsspec

    scheme, rest = split_url(path)
    if scheme is None:
        return fsspec.filesystem("file"), os.path.abspath(rest)
    if scheme == "gs":
        # The experimental hierarchical-namespace probe of recent gcsfs versions needs gRPC
        # access to the real service; plain JSON-API access works everywhere.
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    try:
        options = fsspec_options(scheme, storage_options)
        if stream and scheme == "s3":
            options["skip_instance_cache"] = True
        fs = fsspec.filesystem(scheme, **options)
    except ImportError as e:
        extra = "s3" if scheme == "s3" else "gcs"
        raise StorageError(
            f"reading {os.fspath(path)!r} needs the {extra!r} extra: pip install "
            f"'zephon_jax[{extra}]' ({e})"
        ) from e
    if scheme == "s3":  # s3fs's own loop: one try, retry_call retries; or the budget's tries
        fs.retries = retry_policy().attempts if stream else 1
    return fs, rest


def url_of(scheme: str | None, path: str) -> str:
    """The user-facing name of ``path`` inside a filesystem of ``scheme``."""
    return path if scheme is None else f"{scheme}://{path}"


# ----- TensorStore (TokenStore arrays) ------------------------------------------------

_credential_files: dict[tuple, tuple[str, str]] = {}


def _static_aws_profile(key: str, secret: str, token: str | None) -> dict[str, Any]:
    """A TensorStore profile credential spec for an explicit key pair (a private temp file)."""
    ident = (key, secret, token)
    paths = _credential_files.get(ident)
    if paths is None or not all(os.path.exists(p) for p in paths):
        fd, cred = tempfile.mkstemp(prefix="zephon_jax-aws-", suffix=".ini")
        with os.fdopen(fd, "w") as f:  # mkstemp creates the file with mode 0600
            f.write(f"[zephon_jax]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n")
            if token:
                f.write(f"aws_session_token = {token}\n")
        fd, config = tempfile.mkstemp(prefix="zephon_jax-aws-config-", suffix=".ini")
        with os.fdopen(fd, "w") as f:
            f.write("[profile zephon_jax]\n")
        paths = _credential_files[ident] = (cred, config)
    return {
        "type": "profile",
        "profile": "zephon_jax",
        "credentials_file": paths[0],
        "config_file": paths[1],
    }


def kvstore_spec(
    path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A TensorStore kvstore spec for a local directory or an ``s3://`` / ``gs://`` prefix."""
    scheme, rest = split_url(path)
    url = os.fspath(path)
    given = dict(storage_options or {})
    if scheme is None:
        return {"driver": "file", "path": os.path.abspath(rest).rstrip("/") + "/"}
    bucket, key = _bucket_and_key(scheme, rest, url)
    prefix = key.strip("/") + "/" if key.strip("/") else ""
    if scheme == "gs":
        unknown = set(given) - {"endpoint_url", "token", "project"}
        if unknown:
            raise StorageError(f"storage_options {sorted(unknown)} are not supported for {url!r}")
        if given.get("endpoint_url"):
            os.environ["TENSORSTORE_GCS_HTTP_URL"] = given["endpoint_url"]
        return {"driver": "gcs", "bucket": bucket, "path": prefix}
    spec: dict[str, Any] = {"driver": "s3", "bucket": bucket, "path": prefix}
    endpoint, region = _s3_endpoint_and_region(given)
    if endpoint:
        spec["endpoint"] = endpoint
    if region:
        spec["aws_region"] = region
    key_id, secret = given.pop("key", None), given.pop("secret", None)
    token, profile = given.pop("token", None), given.pop("profile", None)
    anon = given.pop("anon", False)
    if given:
        raise StorageError(f"storage_options {sorted(given)} are not supported for {url!r}")
    if anon:
        spec["aws_credentials"] = {"type": "anonymous"}
    elif key_id and secret:
        spec["aws_credentials"] = _static_aws_profile(key_id, secret, token)
    elif profile:
        spec["aws_credentials"] = {"type": "profile", "profile": profile}
    elif os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        spec["aws_credentials"] = {"type": "environment"}
    return spec


CACHE_POOL_BYTES = 64 << 20


def tensorstore_context_spec() -> dict[str, Any]:
    """No request retries of its own for the object-store drivers, and a bounded cache pool.

    zephon_jax retries each read within one budget (:class:`RetryPolicy`), so TensorStore's
    retries are turned off: one try of a read is one request per key. The cache pool keeps
    shard indexes and recently decoded chunks, so that a random read of a TokenStore on an
    object store costs about one request, not two.
    """
    no_retries = {"max_retries": 0}
    return {
        "s3_request_retries": no_retries,
        "gcs_request_retries": no_retries,
        "cache_pool": {"total_bytes_limit": CACHE_POOL_BYTES},
    }


def _set_tensorstore_timeouts(policy: RetryPolicy) -> None:
    """The policy's request timeout for TensorStore's HTTP transport (unless set already).

    A request that connects in no more than ``timeout`` seconds and then receives less than
    one byte a second for ``timeout`` seconds is abandoned. TensorStore reads these
    variables when it first makes an HTTP request in a process.
    """
    seconds = str(max(1, math.ceil(policy.timeout)))
    os.environ.setdefault("TENSORSTORE_CURL_CONNECT_TIMEOUT_SECONDS", seconds)
    os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", seconds)
    os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES", "1")


# ----- retries -------------------------------------------------------------------------

RETRY_ENV = "ZEPHON_JAX_STORAGE_RETRY"
_POLICY_KEYS = {
    "attempts": "attempts",
    "seconds": "seconds",
    "timeout": "timeout",
    "delay": "initial_delay",
    "max_delay": "max_delay",
}


@dataclass(frozen=True)
class RetryPolicy:
    """The retry budget of one read (or write) of an object store, whatever library performs it.

    A read is tried at most ``attempts`` times (the first try included); no retry starts more
    than ``seconds`` after the first try began, and the waits between tries (exponential from
    ``initial_delay``, doubling up to ``max_delay``, with random jitter) are cut to fit. A
    request that receives nothing for ``timeout`` seconds is abandoned, which fails its try.
    An outage is therefore reported within ``seconds`` plus one ``timeout`` (a refused
    connection: within ``seconds``). The libraries' own request retries (TensorStore, s3fs,
    botocore) are turned off, so this budget is the only one.
    """

    attempts: int = 6
    seconds: float = 6.0
    timeout: float = 10.0
    initial_delay: float = 0.1
    max_delay: float = 2.0

    def __post_init__(self) -> None:
        a = self.attempts
        if isinstance(a, bool) or not isinstance(a, int) or a < 1:
            raise StorageError(f"RetryPolicy.attempts must be an int >= 1, got {a!r}")
        for name in ("seconds", "timeout", "initial_delay", "max_delay"):
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v < 0 or (name == "timeout" and v == 0):
                least = "> 0" if name == "timeout" else ">= 0"
                raise StorageError(
                    f"RetryPolicy.{name} must be a finite number of seconds {least}, got {v!r}"
                )

    def to_env(self) -> str:
        """This policy as the value of ``ZEPHON_JAX_STORAGE_RETRY``."""
        return ",".join(f"{k}={getattr(self, f)!r}" for k, f in _POLICY_KEYS.items())

    @classmethod
    def from_env(cls, text: str) -> RetryPolicy:
        """A policy from ``"attempts=6,seconds=6,timeout=10"`` (keys left out keep defaults)."""
        values: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            field = _POLICY_KEYS.get(key.strip())
            if not sep or field is None:
                raise StorageError(
                    f"{RETRY_ENV}={text!r}: cannot read {item!r}; write comma-separated "
                    f"KEY=VALUE pairs with keys among {sorted(_POLICY_KEYS)}, e.g. "
                    f"'attempts=10,seconds=60'"
                )
            try:
                values[field] = int(value) if field == "attempts" else float(value)
            except ValueError:
                raise StorageError(
                    f"{RETRY_ENV}={text!r}: {key.strip()} must be a number, got {value.strip()!r}"
                ) from None
        try:
            return cls(**values)
        except StorageError as e:
            raise StorageError(f"{RETRY_ENV}={text!r}: {e}") from None


_policy_cache: tuple[str, RetryPolicy] | None = None


def retry_policy() -> RetryPolicy:
    """The retry budget in force: ``ZEPHON_JAX_STORAGE_RETRY``, else the defaults."""
    global _policy_cache
    text = os.environ.get(RETRY_ENV, "")
    cached = _policy_cache
    if cached is not None and cached[0] == text:
        return cached[1]
    policy = RetryPolicy.from_env(text)
    _policy_cache = (text, policy)
    return policy


def set_retry_policy(
    policy: RetryPolicy | None = None,
    *,
    attempts: int | None = None,
    seconds: float | None = None,
    timeout: float | None = None,
) -> RetryPolicy:
    """Sets the retry budget of every object-store read; returns the previous policy.

    Give a :class:`RetryPolicy`, or the fields to change in the current one. The policy is
    stored in ``ZEPHON_JAX_STORAGE_RETRY``, so loader worker processes started afterwards
    use it too. TensorStore reads its request timeout once per process, when it first
    opens an object store.
    """
    previous = retry_policy()
    new = policy if policy is not None else previous
    changes: dict[str, Any] = {"attempts": attempts, "seconds": seconds, "timeout": timeout}
    new = replace(new, **{k: v for k, v in changes.items() if v is not None})
    os.environ[RETRY_ENV] = new.to_env()
    return previous


_TRANSIENT_TEXT = re.compile(
    r"UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|ABORTED|SlowDown|Throttl|"
    r"RequestTimeout|InternalError|ServiceUnavailable|Connection reset|timed out|"
    r"reduce your request rate|was not satisfied by response|File too short|\b50[0234]\b",
)
_PERMANENT_ERRNOS = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR}
# s3fs reports throttling (SlowDown) as EBUSY.
_TRANSIENT_ERRNOS = {errno.EBUSY, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET}
# Network errors of the HTTP libraries under fsspec, which are not OSErrors.
_TRANSIENT_CLASSES = (
    ("aiohttp", ("ClientPayloadError", "ClientConnectionError", "ServerTimeoutError")),
    (
        "botocore.exceptions",
        ("HTTPClientError", "IncompleteReadError", "ResponseStreamingError"),
    ),
    ("urllib3.exceptions", ("ProtocolError", "IncompleteRead", "TimeoutError")),
)


class ShortReadError(OSError):
    """A response had fewer bytes than were asked for: transient, the read is tried again."""


def _network_error(error: BaseException) -> bool:
    for module_name, names in _TRANSIENT_CLASSES:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        classes = tuple(c for c in (getattr(module, n, None) for n in names) if c is not None)
        if classes and isinstance(error, classes):
            return True
    return False


_NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
# How TensorStore and ArrayRecord report a full disk or quota (as text, in other errors).
_NO_SPACE_TEXT = re.compile(r"No space left on device|Disk quota exceeded|os_error_code='28'")


def is_no_space(error: BaseException | None) -> bool:
    """Whether ``error`` (or an error it was raised from) is a full disk or quota
    (ENOSPC, EDQUOT), as an ``OSError`` or in the text of another library's error."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, OSError) and error.errno in _NO_SPACE_ERRNOS:
            return True
        if _NO_SPACE_TEXT.search(str(error)):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is worth retrying (network trouble, throttling, 5xx, short
    reads); a full disk is not: it does not go away by waiting a second."""
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, StorageError)):
        return False
    if is_no_space(error):
        return False
    if isinstance(error, (ConnectionError, TimeoutError, ShortReadError)) or _network_error(error):
        return True
    if isinstance(error, OSError) and error.errno in _PERMANENT_ERRNOS:
        return False
    if isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS:
        return True
    if isinstance(error, (OSError, ValueError, RuntimeError)):
        if _TRANSIENT_TEXT.search(str(error)):
            return True
    cause = error.__cause__ or error.__context__
    return cause is not None and cause is not error and is_transient(cause)


def backoff(policy: RetryPolicy, retry: int) -> float:
    """The wait before retry number ``retry`` (1, 2, ...): exponential, capped, jittered."""
    base = min(policy.max_delay, policy.initial_delay * 2 ** (retry - 1))
    return base * (0.5 + random.random() / 2)


def retry_call(
    fn: Callable[[], T],
    url: str,
    what: str = "reading",
    *,
    policy: RetryPolicy | None = None,
) -> T:
    """``fn()``, retried on transient errors within one budget (:func:`retry_policy`).

    Each retry is logged on the ``zephon_jax.storage`` logger. A permanent error raises at
    once: StorageError naming ``url`` (FileNotFoundError for a missing object), the original
    error chained as ``__cause__``. When the budget runs out (``attempts`` tries, or no time
    left for another), StorageError names ``url``, the tries made, the time spent, the last
    error and the fix.
    """
    policy = policy or retry_policy()
    start = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as e:
            if not is_transient(e):
                if isinstance(e, StorageError):
                    raise
                if isinstance(e, FileNotFoundError):
                    raise FileNotFoundError(f"{what} {url}: not found ({e})") from e
                if is_no_space(e):
                    full = StorageError(
                        f"{what} {url} failed: no space left on device (ENOSPC; {e!r}); free "
                        "space on that filesystem, or write to one with room"
                    )
                    full.errno = errno.ENOSPC
                    raise full from e
                raise StorageError(f"{what} {url} failed: {e!r}") from e
            spent = time.monotonic() - start
            wait = backoff(policy, attempt)
            if attempt >= policy.attempts or spent + wait > policy.seconds:
                raise StorageError(_budget_message(what, url, attempt, spent, policy, e)) from e
            log.warning(
                "%s %s: %r; retry %d of at most %d in %.2f s",
                what,
                url,
                e,
                attempt,
                policy.attempts - 1,
                wait,
            )
            time.sleep(wait)


def _budget_message(
    what: str, url: str, attempts: int, spent: float, policy: RetryPolicy, error: BaseException
) -> str:
    return (
        f"{what} {url} failed after {attempts} attempt{'s' if attempts != 1 else ''} in "
        f"{spent:.1f} s (retry budget: {policy.attempts} attempts, {policy.seconds:g} s, "
        f"request timeout {policy.timeout:g} s); last error: {error!r}. Check the credentials, "
        f"the endpoint (AWS_ENDPOINT_URL or storage_options['endpoint_url'] for s3://) and the "
        f"network; if the store is only slow or throttling, raise the budget: "
        f"{RETRY_ENV}='attempts=10,seconds=60' or "
        f"zephon_jax.sources.set_retry_policy(attempts=10, seconds=60)"
    )


# ----- a directory of keys: a local directory or an object-store prefix -----------------

_context_lock = threading.Lock()
_context: tuple[int, Any] | None = None


def ts_context() -> Any:
    """One TensorStore context per process (:func:`tensorstore_context_spec`), new after a fork."""
    import tensorstore as ts

    global _context
    with _context_lock:
        if _context is None or _context[0] != os.getpid():
            _set_tensorstore_timeouts(retry_policy())
            _context = (os.getpid(), ts.Context(tensorstore_context_spec()))
        return _context[1]


class Location:
    """A directory-like prefix read and written by key: a local directory or a URL prefix.

    Writes of one key are atomic: a local key is written to a temporary file, fsynced
    and renamed; an object-store key is one PUT.
    """

    def __init__(
        self, path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
    ) -> None:
        self.name = os.fspath(path)
        self.scheme, rest = split_url(path)
        self.storage_options = dict(storage_options or {})
        self.local: Path | None = Path(rest) if self.scheme is None else None
        self._kv: Any = None

    def __repr__(self) -> str:
        return f"Location({self.name!r})"

    def kvstore(self, sub: str = "") -> dict[str, Any]:
        """TensorStore kvstore spec of the prefix ``sub`` inside this location."""
        spec = kvstore_spec(self.name, self.storage_options)
        if sub:
            spec["path"] = spec["path"] + sub.strip("/") + "/"
        return spec

    def _store(self) -> Any:
        import tensorstore as ts

        if self._kv is None:
            spec = self.kvstore()
            self._kv = retry_call(
                lambda: ts.KvStore.open(spec, context=ts_context()).result(), self.name, "opening"
            )
        return self._kv

    def child(self, name: str) -> str:
        """The path or URL of ``name`` inside this location."""
        return join(self.name, name)

    def is_file(self) -> bool:
        """Whether a local path names a file (never for URLs)."""
        return self.local is not None and self.local.is_file()

    def names(self) -> set[str]:
        """Names of the entries directly inside (empty if the location does not exist)."""
        if self.local is not None:
            return {p.name for p in self.local.iterdir()} if self.local.is_dir() else set()
        keys = retry_call(lambda: self._store().list().result(), self.name, "listing")
        return {k.decode().split("/", 1)[0] for k in keys}

    def exists(self) -> bool:
        """Whether the location holds anything (a local directory, even empty, exists)."""
        if self.local is not None:
            return self.local.exists()
        return bool(self.names())

    def read(self, name: str) -> bytes | None:
        """The bytes of key ``name``; None if it does not exist."""
        if self.local is not None:
            try:
                return (self.local / name).read_bytes()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return None
        res = retry_call(lambda: self._store().read(name).result(), self.child(name))
        return None if res.state != "value" else bytes(res.value)

    def write(self, name: str, data: bytes) -> None:
        """Atomically replace key ``name`` with ``data``."""
        if self.local is None:
            retry_call(
                lambda: self._store().write(name, data).result(), self.child(name), "writing"
            )
            return
        self.local.mkdir(parents=True, exist_ok=True)
        # Not mkstemp: it creates mode 0600; this file gets the umask's usual mode (0644).
        tmp = str(self.local / f".{name}.{secrets.token_hex(6)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.local / name)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        dir_fd = os.open(self.local, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def mkdir(self) -> None:
        """Create a local directory (object-store prefixes need none)."""
        if self.local is not None:
            self.local.mkdir(parents=True, exist_ok=True)

    def delete_all(self) -> None:
        """Delete everything under this location."""
        if self.local is not None:
            if self.local.is_dir():
                shutil.rmtree(self.local)
            elif self.local.exists():
                self.local.unlink()
            return
        import tensorstore as ts

        retry_call(
            lambda: self._store().delete_range(ts.KvStore.KeyRange()).result(),
            self.name,
            "deleting",
        )


def _s3_endpoint_and_region(given: dict[str, Any]) -> tuple[str | None, str | None]:
    """The S3 endpoint and region: from ``given`` (popped), else the standard variables."""
    env = os.environ
    endpoint = (
        given.pop("endpoint_url", None)
        or env.get("AWS_ENDPOINT_URL_S3")
        or env.get("AWS_ENDPOINT_URL")
    )
    region = given.pop("region", None) or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    return endpoint, region
