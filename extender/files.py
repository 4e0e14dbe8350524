"""Reading documents from disk: the I/O edge in front of the pure parsers in ``extender.core``.

Every read is bounded: only regular files are read (a FIFO nobody writes to hung the reader for
ever; a symlink to ``/dev/zero`` filled memory), and never more than a stated number of bytes.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from extender.core.errors import DocumentError, PolicyError, Problem, UnreadableFileError
from extender.core.policy import Policy, parse_policy
from extender.process import report, report_problems

log = logging.getLogger(__name__)

#: Largest policy, inventory or scenario document read (an inventory of 15,000 nodes is ~10 MB).
MAX_DOCUMENT_BYTES = 64 << 20


def open_regular(path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file; anything else raises ``OSError``.

    Opened non-blocking, so a FIFO is refused instead of waiting for a writer; checked with
    ``fstat`` on the open descriptor (no race with a swap of the path). ``follow_symlinks=False``
    refuses a symbolic link (``O_NOFOLLOW``), for readers that must stay inside a directory.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise UnreadableFileError(errno.ELOOP, "not a regular file (a symbolic link, not followed)") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnreadableFileError(errno.EINVAL, "not a regular file (a FIFO, device, socket or directory)")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], max_bytes: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (:func:`open_regular`); anything else
    raises ``OSError``. Read to at most one byte past the limit, so a file that grows meanwhile is
    refused too."""
    with open_regular(path, follow_symlinks=follow_symlinks) as f:
        st = os.fstat(f.fileno())
        if st.st_size > max_bytes:
            raise UnreadableFileError(errno.EFBIG, f"{st.st_size} bytes, larger than the {max_bytes} byte limit")
        chunks: list[bytes] = []
        size = 0
        while chunk := f.read(min(1 << 20, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise UnreadableFileError(errno.EFBIG, f"grew past the {max_bytes} byte limit while being read")
        return b"".join(chunks)


#: Byte-order marks of the UTF-16 and UTF-32 encodings an editor may save a document in (UTF-32's
#: little-endian mark begins with UTF-16's, so it is looked for first).
_OTHER_ENCODINGS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
                    (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))


def decode_problem(data: bytes, exc: UnicodeDecodeError, source: str) -> Problem:
    """Where and why ``data`` is not UTF-8: the line and byte of the first bad byte, or the encoding
    whose byte-order mark the file starts with."""
    for mark, encoding in _OTHER_ENCODINGS:
        if data.startswith(mark):
            return Problem(source, None, "", f"not UTF-8 text: it is {encoding} (it starts with a {encoding} "
                                             "byte-order mark); save it as UTF-8")
    line = data.count(b"\n", 0, exc.start) + 1
    column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
    return Problem(source, line, "", f"not UTF-8 text: byte 0x{data[exc.start]:02x} at column {column} "
                                     f"({exc.reason}); save the file as UTF-8")


def read_text(path: str | Path, max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """Read a UTF-8 document; a missing, unreadable or oversized file is a located problem, not a traceback."""
    try:
        data = read_regular(path, max_bytes)
    except OSError as exc:
        raise DocumentError([Problem(str(path), None, "", f"cannot read: {exc.strerror or exc}")]) from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError([decode_problem(data, exc, str(path))]) from exc


def policy_version(text: str) -> str:
    """A policy's version: the first 16 hex digits of the SHA-256 of its text (what /readyz shows)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_policy(path: str | Path) -> tuple[Policy, str]:
    """Read and fully check a policy file: ``(policy, version)``; raises :class:`PolicyError` listing every problem.

    Both come from one read, so the version always describes the policy returned with it.
    """
    try:
        text = read_text(path)
    except DocumentError as exc:
        raise PolicyError(exc.problems) from exc
    return parse_policy(text, str(path)), policy_version(text)


def load_policy(path: str | Path) -> Policy:
    """Read and fully check a policy file; raises :class:`PolicyError` listing every problem."""
    return read_policy(path)[0]


def load_policy_to_start(path: str | Path, command: str) -> tuple[Policy, str] | None:
    """The policy (and its version) a long-running command starts with, or ``None`` after printing why it will not.

    A service must refuse to start on an invalid policy rather than run with a guess: every problem
    goes to stderr, then one line saying the command is not starting.
    """
    try:
        return read_policy(path)
    except DocumentError as exc:
        report_problems(exc)
        report(f"extender {command}: not starting: {path} is invalid ({len(exc.problems)} problem(s))",
               policy=str(path))
        return None


@dataclass(frozen=True)
class PolicyPoll:
    """What one look at a policy file found: ``unchanged``, ``reloaded`` (with the new ``policy``),
    ``invalid`` (a new text that does not validate) or ``unreadable``."""

    outcome: Literal["unchanged", "reloaded", "invalid", "unreadable"]
    policy: Policy | None = None


class PolicyFile:
    """A policy file watched for edits: the one hot-reload mechanism of every long-running command
    (each extender worker's refresher, the scaler's loop).

    :meth:`poll` costs one ``stat`` when nothing changed; when the file's identity changed it reads
    it and takes the policy only if its text is new *and* valid. An unreadable or invalid file keeps
    the last good policy and is logged once per distinct problem, and a rejected text is not parsed
    again; :meth:`poll` never raises for what the file holds. The path is made absolute but not
    resolved: kubelet swaps a ConfigMap volume's ``..data`` symlink, and a resolved path would watch
    the old copy forever. The first poll always reads the file, so a process started with an older
    policy (a worker gunicorn restarts after a reload gets the launch-time one) takes the file's
    current one at once.
    """

    def __init__(self, path: str | Path, version: str | None) -> None:
        self.path = Path(os.path.abspath(path))
        #: The version (:func:`policy_version`) of the policy the caller holds; ``None``: unknown.
        self.version = version
        self._signature: tuple[int, int, int] | None = (-1, -1, -1)  # no real file has it
        self._rejected: str | None = None
        self._reported: str | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def poll(self) -> PolicyPoll:
        """Look at the file once (see the class docstring)."""
        signature = self._stat()
        if signature == self._signature:
            return PolicyPoll("unchanged")
        self._signature = signature
        try:
            text = read_text(self.path)
        except DocumentError as exc:
            self._report(exc, "unreadable")
            return PolicyPoll("unreadable")
        version = policy_version(text)
        if version in (self.version, self._rejected):
            return PolicyPoll("unchanged")
        try:
            policy = parse_policy(text, str(self.path))
        except DocumentError as exc:
            self._rejected = version
            self._report(exc, "invalid")
            return PolicyPoll("invalid")
        except Exception as exc:  # a text the parser chokes on is invalid too: the caller's thread must live on
            self._rejected = version
            log.exception("policy %s could not be checked", self.path, extra={"policy": str(self.path)})
            self._report(DocumentError([Problem(str(self.path), None, "",
                                                f"could not be checked ({type(exc).__name__}: {exc})")]), "invalid")
            return PolicyPoll("invalid")
        self.version, self._reported = version, None
        log.info("policy %s reloaded (version %s): %d node class(es), %d profile(s)", self.path, version,
                 len(policy.node_classes), len(policy.profiles), extra={"policy": str(self.path), "version": version})
        return PolicyPoll("reloaded", policy)

    def _report(self, exc: DocumentError, what: str) -> None:
        problems = "\n".join(f"  {p}" for p in exc.problems)
        if problems != self._reported:
            self._reported = problems
            log.error("policy %s is %s; keeping the last good policy. Problems:\n%s", self.path, what, problems,
                      extra={"policy": str(self.path), "problems": [str(p) for p in exc.problems]})
