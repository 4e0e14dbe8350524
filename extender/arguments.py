"""Command-line pieces shared by the commands: argparse value types (each rejects a bad value with a
message that says why), the inventory store options, the logging options, deprecated flag names.

Conventions every command follows (docs/cli.md):

* durations and sizes are typed as in a policy: ``15s``, ``2m``, ``1h30m``, ``250ms``, ``64MiB``,
  ``3.9GB`` (:mod:`extender.core.units`); a plain number is seconds, or bytes;
* a command that uses the inventory store takes ``--redis-url``, ``--data-dir`` and ``--prefix``;
  one that talks to Kubernetes takes ``--kubeconfig`` and ``--context``; one that serves TLS takes
  the ``--tls-*`` family;
* every command takes ``--log-level`` and ``--log-format``;
* a renamed flag keeps its old name as a deprecated alias: it still works and the command warns.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from extender.core.errors import InvalidValueError, UnitError
from extender.core.images import check_reference
from extender.core.units import format_duration, parse_bytes, parse_duration, read_float, read_int
from extender.process import LOG_FORMATS, LOG_LEVELS

if TYPE_CHECKING:
    from extender.state.connection import Client
    from extender.state.store import InventoryStore


class Parser(argparse.ArgumentParser):
    """argparse's parser, reading an argument that starts with ``-`` and a digit as a value.

    Stock argparse takes only plain negative numbers (``-5``, ``-.5``) for values, so ``--interval -5s``
    failed with "expected one argument", as if the value were missing. Here ``-5s`` reaches the
    option's type, which says what is wrong with it. No option of ours starts with ``-`` and a digit,
    so nothing else changes. Subparsers inherit the class (``add_subparsers`` builds ``type(self)``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Any script's digit on purpose (re.UNICODE says so): ``-١s`` then reaches the type, which says
        # it is not a number, instead of argparse's "expected one argument".
        self._negative_number_matcher = re.compile(r"^-\.?\d", re.UNICODE)


def finite_number(minimum: float, *, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number >= ``minimum`` (> with ``above``), in ASCII digits
    (:func:`~extender.core.units.read_float`); NaN and infinity are refused here rather than deep in
    whatever the number reaches."""
    sign = ">" if above else ">="

    def parse(text: str) -> float:
        try:
            value = read_float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and (value > minimum if above else value >= minimum)):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number {sign} {minimum:g}")
        return value
    return parse


def whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum`` (and <= ``maximum`` when given), in ASCII digits
    (:func:`~extender.core.units.read_int`: ``1_000``, ``١٢`` and ``１２`` are refused)."""
    def parse(text: str) -> int:
        try:
            value = read_int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{text!r} must be at most {maximum}")
        return value
    return parse


#: A whole number >= 1 (counts with no natural bound: history points, decisions shown).
positive_int = whole_number(1)

#: The most server processes: each holds its own copy of the inventory and polls Redis on its own, so
#: memory and store load grow with the count, while kube-scheduler sends its calls one pod at a time.
MAX_WORKERS = 64
#: The most request threads per process: a thread runs only a complete request and holds its body (up
#: to ``--max-body``, 64 MiB by default), and one Python process runs one thread at a time.
MAX_THREADS = 256
#: ``--workers``: 1 to :data:`MAX_WORKERS`.
workers = whole_number(1, MAX_WORKERS)
#: ``--threads``: 1 to :data:`MAX_THREADS`.
threads = whole_number(1, MAX_THREADS)


def duration(text: str) -> float:
    """A duration > 0 in seconds, in the policy's units: ``15s``, ``2m``, ``1h30m``, ``250ms``; ``15`` is 15 s."""
    try:
        value = parse_duration(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than zero")
    return value


def duration_or_zero(text: str) -> float:
    """A duration >= 0 in seconds, as :func:`duration`; zero in any spelling (``0``, ``0m``, ``0.0``) turns
    off what it sets."""
    try:
        value = parse_duration(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value if value > 0 else 0.0


def duration_or_zero_up_to(maximum: float) -> Callable[[str], float]:
    """An argparse type: :func:`duration_or_zero`, at most ``maximum`` seconds (the bound of the field the
    flag sets, so that a flag that overrides a checked field is checked the same way)."""
    def parse(text: str) -> float:
        value = duration_or_zero(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{text!r} must be at most {format_duration(maximum)}")
        return value
    return parse


def file_name(text: str) -> str:
    """A file's name, not blank: ``--tls-client-ca "$CA"`` with ``$CA`` unset gave the empty name, which
    read as the flag left out (no client certificates asked for, TLS off), not as a mistake."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} names no file")
    return text


def directory(text: str) -> Path:
    """A directory's path, not blank (``Path("")`` is ``.``: a blank ``--root`` worked in the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} names no directory")
    return Path(text)


def unix_socket(text: str) -> Path:
    """A unix socket's path, as a path or as crictl's endpoint ``unix:///run/containerd/containerd.sock``;
    not blank (``Path("")`` is ``.``), and no other scheme (``tcp://``: a CRI runtime listens on a unix socket)."""
    path = text[len("unix://"):] if text.startswith("unix://") else text
    if "://" in path:
        raise argparse.ArgumentTypeError(f"{text!r} is not a unix socket (give its path, or unix://PATH)")
    if not path.strip():
        raise argparse.ArgumentTypeError(f"{text!r} names no socket")
    return Path(path)


def comma_list(text: str) -> list[str]:
    """The names of a comma-separated flag value, blanks around them dropped, each kept once, in order."""
    return list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


def size(text: str) -> int:
    """A size >= 1 byte, in the policy's units: ``64MiB``, ``3.9GB``, ``512KiB``; ``4096`` is bytes."""
    try:
        value = parse_bytes(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least one byte")
    return value


def image_reference(text: str) -> str:
    """An image reference kubelet can pull (:func:`extender.core.images.check_reference`)."""
    try:
        return check_reference(text)
    except InvalidValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: Schemes ``--redis-url`` takes (extender.state.connection): Redis, Redis over TLS, a socket, Sentinel.
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")


def redis_url(text: str) -> str:
    """A Redis URL: ``redis://``, ``rediss://``, ``unix://`` or ``redis[s]+sentinel://``, of a form the store
    can connect with (:func:`extender.state.connection.url_problem`: port, database path, query options);
    whether a server answers there is checked when connecting. The message never repeats the URL, which
    may hold a password."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in REDIS_SCHEMES or not rest:
        raise argparse.ArgumentTypeError(f"not a Redis URL (scheme {scheme.lower()!r}): expected "
                                         f"{', '.join(s + '://...' for s in REDIS_SCHEMES)}" if sep else
                                         f"not a Redis URL: expected {', '.join(s + '://...' for s in REDIS_SCHEMES)}")
    from extender.state.connection import url_problem  # redis is imported only where a URL is given

    if problem := url_problem(text):
        raise argparse.ArgumentTypeError(f"not a usable Redis URL: {problem}")
    return text


def bind_address(text: str) -> str:
    """``HOST:PORT`` or ``:PORT`` (all interfaces), as gunicorn's ``--bind`` takes it."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 0 < read_int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return text if host else f"0.0.0.0:{port}"


def add_metrics_bind_option(parser: Any) -> None:
    """``--metrics-bind HOST:PORT``: serve ``/metrics``, ``/healthz`` and ``/readyz`` there (default: off)."""
    parser.add_argument("--metrics-bind", type=bind_address, default=None, metavar="HOST:PORT",
                        help="serve /metrics, /healthz and /readyz over plain HTTP at this address "
                             "(e.g. :9090; default: not served)")


# ---- renamed flags --------------------------------------------------------------------------------

#: Where parsing leaves ``(old flag, new flag)`` for each deprecated name used (reported by the CLI
#: once logging is set up, so the warning comes in the format asked for).
DEPRECATED_DEST = "deprecated_flags"


class _Renamed(argparse.Action):
    """Stores like ``store`` (or ``store_true`` with ``nargs=0``); an old option string is noted as deprecated."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, deprecated: Sequence[str] = (),
                 flag: bool = False, **kwargs: Any) -> None:
        self.deprecated = tuple(deprecated)
        self.flag = flag
        if flag:
            kwargs.update(nargs=0, default=kwargs.get("default", False))
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, True if self.flag else values)
        if option_string in self.deprecated:
            current = next(o for o in self.option_strings if o not in self.deprecated)
            used = [*getattr(namespace, DEPRECATED_DEST, []), (option_string, current)]
            setattr(namespace, DEPRECATED_DEST, used)


def add_renamed(group: Any, name: str, *old: str, text: str, flag: bool = False, **kwargs: Any) -> argparse.Action:
    """Add ``name`` with help ``text`` and its former names ``old`` (accepted, and reported as deprecated)."""
    note = f" (deprecated name{'s' if len(old) > 1 else ''}: {', '.join(old)})"
    action: argparse.Action = group.add_argument(name, *old, action=_Renamed, deprecated=old, flag=flag,
                                                 help=text + note, **kwargs)
    return action


def deprecated_flags(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(old, new)`` for every deprecated flag name the command line used."""
    return list(getattr(args, DEPRECATED_DEST, []))


# ---- logging --------------------------------------------------------------------------------------


def add_logging_options(parser: argparse.ArgumentParser, *, inherited: bool = False) -> None:
    """``--log-level`` and ``--log-format``; ``inherited``: a subcommand's copy, which sets nothing unless given
    (so ``extender --log-format json serve`` and ``extender serve --log-format json`` mean the same)."""
    group = parser.add_argument_group("logging")
    group.add_argument("--log-level", choices=LOG_LEVELS, default=argparse.SUPPRESS if inherited else None,
                       help="lowest level logged (default: info for the long-running serve, agent, sync, scale "
                            "and keda-scaler, and for simulate, which logs the demand it loaded; warning for the "
                            "others)")
    group.add_argument("--log-format", choices=LOG_FORMATS, default=argparse.SUPPRESS if inherited else "text",
                       help="text: one line per record for people; json: one JSON object per line "
                            "(time, level, logger, message, fields) (default: text)")


def subparsers_of(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every subcommand's parser below ``parser``, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # an alias maps to the same parser
                yield sub
                yield from subparsers_of(sub)


#: Where the embedded Redis keeps its data when neither --data-dir nor $EXTENDER_DATA_DIR is set.
DEFAULT_DATA_DIR = "./var/redis"


def add_kube_options(parser: argparse.ArgumentParser, *, what: str = "") -> None:
    """``--kubeconfig`` and ``--context``, the same on every command that talks to Kubernetes."""
    group = parser.add_argument_group("Kubernetes")
    group.add_argument("--kubeconfig", metavar="FILE",
                       help=f"kubeconfig{what} (default: the pod's service account, else $KUBECONFIG, "
                       "else ~/.kube/config)")
    group.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current one)")


def add_tls_options(group: Any, *, client_ca_help: str, client_ca_old: Sequence[str] = ()) -> None:
    """The ``--tls-*`` family of a serving command: ``--tls-cert``, ``--tls-key``, ``--tls-client-ca``."""
    group.add_argument("--tls-cert", type=file_name, metavar="FILE", help="serving certificate (PEM); needs --tls-key")
    group.add_argument("--tls-key", type=file_name, metavar="FILE", help="private key of --tls-cert (PEM)")
    if client_ca_old:
        add_renamed(group, "--tls-client-ca", *client_ca_old, type=file_name, metavar="FILE", text=client_ca_help)
    else:
        group.add_argument("--tls-client-ca", type=file_name, metavar="FILE", help=client_ca_help)


def tls_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the ``--tls-*`` family as given, or ``None``: a certificate needs its key (and
    the key its certificate); a client CA (mutual TLS) needs both."""
    cert, key, client_ca = getattr(args, "tls_cert", None), getattr(args, "tls_key", None), \
        getattr(args, "tls_client_ca", None)
    if bool(cert) != bool(key):
        return "--tls-cert and --tls-key go together"
    if client_ca and not cert:
        return "--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)"
    return None


# ---- checks of the parsed flags -------------------------------------------------------------------

#: A command's check of its parsed flags: the problem it refuses to start with (its usage error,
#: exit 2), or ``None``. It reads the environment only from the mapping it is given.
FlagCheck = Callable[[argparse.Namespace, Mapping[str, str]], "str | None"]

#: Where a subcommand's parser keeps its :data:`FlagCheck` (``set_defaults(flag_check=...)``).
FLAG_CHECK = "flag_check"
#: Set true (``set_defaults``) by a short action of a long-running command (``scale explain``): it
#: logs at WARNING by default, as every short command does, not at its command's INFO.
SHORT_ACTION = "short_action"


def flag_problem(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> str | None:
    """The problem the parsed command line would be refused for before its command starts, or ``None``.

    Runs the check the command registered (the same one its handler runs first), so a command line
    can be checked without starting anything: tests check every container command the chart renders
    this way, with the container's environment as ``environ`` (default: this process's).
    """
    environ = os.environ if environ is None else environ
    if problem := store_problem(args, environ):
        return problem
    check: FlagCheck | None = getattr(args, FLAG_CHECK, None)
    return None if check is None else check(args, environ)


def store_problem(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """What is wrong with ``$REDIS_URL`` where a command of the store options would use it, or ``None``.

    ``--redis-url`` is checked by argparse; the variable stands in for it when the flag is absent, so it
    is refused the same way (a usage error) rather than by every connection attempt later, and the
    message names the variable, since the command line has no URL in it.
    """
    if not hasattr(args, "redis_url") or args.redis_url:
        return None
    value = environ.get("REDIS_URL")
    if not value:
        return None
    try:
        redis_url(value)
    except argparse.ArgumentTypeError as exc:
        return f"$REDIS_URL (used as --redis-url is not given): {exc}"
    return None


#: Key prefix of every Redis key when --prefix is not given.
DEFAULT_PREFIX = "extender"


def add_store_options(parser: argparse.ArgumentParser) -> None:
    """``--redis-url``, ``--data-dir`` and ``--prefix``; environment defaults are read when the command runs."""
    group = parser.add_argument_group("inventory store")
    group.add_argument(
        "--redis-url",
        type=redis_url,
        metavar="URL",
        help="redis://, rediss://, unix:// or redis[s]+sentinel:// URL, credentials inside (default: $REDIS_URL; "
        "without either, an embedded Redis is started in --data-dir)",
    )
    group.add_argument(
        "--data-dir",
        metavar="DIR",
        help=f"data directory of the embedded Redis (default: $EXTENDER_DATA_DIR, else {DEFAULT_DATA_DIR})",
    )
    group.add_argument(
        "--prefix",
        metavar="PREFIX",
        help=f"prefix of every Redis key; the same for every process sharing an inventory "
        f"(default: {DEFAULT_PREFIX}; with Redis Cluster a hash tag such as {{extender}})",
    )


def data_dir_from_args(args: argparse.Namespace) -> str:
    """The embedded Redis's data directory: ``--data-dir``, then ``$EXTENDER_DATA_DIR``, then the default."""
    return getattr(args, "data_dir", None) or os.environ.get("EXTENDER_DATA_DIR") or DEFAULT_DATA_DIR


def redis_url_from_args(args: argparse.Namespace) -> str | None:
    """``--redis-url``, then ``$REDIS_URL``; ``None``: the embedded Redis."""
    return getattr(args, "redis_url", None) or os.environ.get("REDIS_URL") or None


def prefix_from_args(args: argparse.Namespace) -> str:
    """``--prefix``, else :data:`DEFAULT_PREFIX`."""
    return getattr(args, "prefix", None) or DEFAULT_PREFIX


def connect_from_args(args: argparse.Namespace) -> Client:
    """The client selected by the store options (flag, then environment, then embedded default)."""
    from extender.state import connect  # Redis only when a command needs the store

    return connect(redis_url_from_args(args), data_dir_from_args(args))


def inventory_from_args(args: argparse.Namespace, client: Client | None = None) -> InventoryStore:
    """The inventory store the store options select (on ``client`` when given), under ``--prefix``."""
    from extender.state.store import InventoryStore

    return InventoryStore(client if client is not None else connect_from_args(args), prefix=prefix_from_args(args))

