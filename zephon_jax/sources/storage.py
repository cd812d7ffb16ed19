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
Transient errors (connection resets, timeouts, throttling, 5xx) are retried with
bounded exponential backoff, each retry logged on the ``zephon_jax.storage``
logger; a permanent error (missing object, denied access) raises at once and
names the URL.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from zephon_jax.errors import ZephonError

__all__ = [
    "Location",
    "StorageError",
    "filesystem",
    "is_url",
    "join",
    "kvstore_spec",
    "retry_call",
    "split_url",
]

log = logging.getLogger("zephon_jax.storage")

SUPPORTED_SCHEMES = ("s3", "gs", "gcs", "file")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.S)
MAX_RETRIES = 6
INITIAL_DELAY_S = 0.1
MAX_DELAY_S = 5.0

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
        opts.update(given)
        return opts
    if scheme == "gs":
        if "endpoint_url" not in given and os.environ.get("STORAGE_EMULATOR_HOST"):
            given["endpoint_url"] = os.environ["STORAGE_EMULATOR_HOST"]
        if given.get("endpoint_url") and "token" not in given:
            given["token"] = "anon"  # an emulator takes no credentials
        return given
    return given


def filesystem(
    path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> tuple[Any, str]:
    """``(fsspec filesystem, path inside it)`` for a local path or a URL."""
    import fsspec

    scheme, rest = split_url(path)
    if scheme is None:
        return fsspec.filesystem("file"), os.path.abspath(rest)
    if scheme == "gs":
        # The experimental hierarchical-namespace probe of recent gcsfs versions needs gRPC
        # access to the real service; plain JSON-API access works everywhere.
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    try:
        fs = fsspec.filesystem(scheme, **fsspec_options(scheme, storage_options))
    except ImportError as e:
        extra = "s3" if scheme == "s3" else "gcs"
        raise StorageError(
            f"reading {os.fspath(path)!r} needs the {extra!r} extra: pip install "
            f"'zephon_jax[{extra}]' ({e})"
        ) from e
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
    """Bounded request retries for the object-store drivers, and a bounded cache pool.

    The cache pool keeps shard indexes and recently decoded chunks, so that a random
    read of a TokenStore on an object store costs about one request, not two.
    """
    retries = {
        "max_retries": MAX_RETRIES,
        "initial_delay": f"{INITIAL_DELAY_S}s",
        "max_delay": f"{MAX_DELAY_S}s",
    }
    return {
        "s3_request_retries": retries,
        "gcs_request_retries": retries,
        "cache_pool": {"total_bytes_limit": CACHE_POOL_BYTES},
    }


# ----- retries -------------------------------------------------------------------------

_TRANSIENT_TEXT = re.compile(
    r"UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|ABORTED|SlowDown|Throttl|"
    r"RequestTimeout|InternalError|ServiceUnavailable|Connection reset|timed out|"
    r"\b50[0234]\b",
)
_PERMANENT_ERRNOS = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR}


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is worth retrying (network trouble, throttling, 5xx)."""
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, StorageError)):
        return False
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    if isinstance(error, OSError) and error.errno in _PERMANENT_ERRNOS:
        return False
    if isinstance(error, (OSError, ValueError, RuntimeError)):
        return bool(_TRANSIENT_TEXT.search(str(error)))
    return False


def retry_call(
    fn: Callable[[], T],
    url: str,
    what: str = "reading",
    *,
    max_retries: int = MAX_RETRIES,
    initial_delay: float = INITIAL_DELAY_S,
    max_delay: float = MAX_DELAY_S,
) -> T:
    """``fn()``, retried on transient errors with bounded, logged, jittered backoff.

    A permanent error, or a transient one after ``max_retries`` retries, raises
    StorageError naming ``url`` (the original error chained as ``__cause__``); a
    missing object raises FileNotFoundError naming ``url``.
    """
    delay = initial_delay
    for attempt in range(max_retries + 1):
        try:
            return fn()
        except Exception as e:
            if not is_transient(e):
                if isinstance(e, StorageError):
                    raise
                if isinstance(e, FileNotFoundError):
                    raise FileNotFoundError(f"{what} {url}: not found ({e})") from e
                raise StorageError(f"{what} {url} failed: {e!r}") from e
            if attempt == max_retries:
                raise StorageError(
                    f"{what} {url} failed after {max_retries} retries: {e!r}; check the "
                    "endpoint and the network, then rerun"
                ) from e
            wait = min(max_delay, delay) * (0.5 + random.random() / 2)
            log.warning(
                "%s %s: %r; retry %d of %d in %.2f s", what, url, e, attempt + 1, max_retries, wait
            )
            time.sleep(wait)
            delay *= 2
    raise AssertionError("unreachable")


# ----- a directory of keys: a local directory or an object-store prefix -----------------

_context_lock = threading.Lock()
_context: tuple[int, Any] | None = None


def ts_context() -> Any:
    """One TensorStore context per process (with bounded request retries), recreated after a fork."""
    import tensorstore as ts

    global _context
    with _context_lock:
        if _context is None or _context[0] != os.getpid():
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
