"""A worker that keeps Megatron Bridge loaded between commands, so that a dry run or a plan of a configuration
never validated before answers in seconds instead of the ~40 s that loading Megatron Bridge takes on a small
machine (the cache of ``store`` answers only what it has seen).

The first dry run or plan that finds no worker starts one in the background and answers itself; the worker
loads Megatron Bridge and this plugin once, then waits on a Unix socket in the cache folder. A later command
sends it its arguments, working folder, environment and its own stdout/stderr; the worker forks, the child
runs the same command's ``main`` on them (its output goes straight to the user's terminal) and returns the
exit code. Nothing is launched there: only ``run_recipe.py --dry-run`` and ``plan_offload.py`` ask it.

Never stale: the socket's name is a key of the installed stack and of every source file of the plugin; a
change of either is another worker (the old one exits when idle). The worker exits after ``IDLE_EXIT_S``
without a request. ``MBRIDGE_OFFLOAD_NO_WORKER=1`` (or ``MBRIDGE_OFFLOAD_NO_CACHE=1``) turns it off.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from mbridge_offload.fast_check import store

IDLE_EXIT_S = float(os.environ.get("MBRIDGE_OFFLOAD_WORKER_IDLE_S", 900))
IN_WORKER_ENV = "MBRIDGE_OFFLOAD_IN_WORKER"  # set in the worker's children: they answer, never ask a worker
COMMANDS = {"run_recipe": "mbridge_offload.cli.run_recipe", "plan_offload": "mbridge_offload.cli.plan_offload"}
PACKAGES_OF_THE_PLUGIN = ("mbridge_offload", "recipes", "overrides")
_LENGTH = struct.Struct("!I")
_CODE = struct.Struct("!i")


def enabled() -> bool:
    return (store.enabled() and os.environ.get("MBRIDGE_OFFLOAD_NO_WORKER", "") in ("", "0")
            and not os.environ.get(IN_WORKER_ENV))


@functools.lru_cache(maxsize=None)
def worker_key() -> str:
    """The installed stack's key, every source file of the plugin, the packages importable and the machine: a worker
    answers only for these (its socket sits in the cache folder, which a shared home directory shares between
    machines; a Unix socket answers only on the machine that made it, and the worker reads that machine's GPUs)."""
    from mbridge_offload.validation.installed import importable_modules

    digest = hashlib.sha256(store.stack_key().encode() + b"\0" + socket.gethostname().encode())
    digest.update(repr(importable_modules()).encode())  # a package installed since the worker loaded
    for package in PACKAGES_OF_THE_PLUGIN:
        for path in sorted((store.ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(store.ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def socket_path() -> Path:
    return store.cache_root() / f"worker-{worker_key()}.sock"


def _started_line() -> str:
    minutes = IDLE_EXIT_S / 60
    return (f"(started a checking worker that keeps Megatron Bridge loaded for {minutes:g} idle minutes: the next "
            "dry runs and plans answer in seconds; MBRIDGE_OFFLOAD_NO_WORKER=1 turns it off)")


def ask(command: str, argv: list[str]) -> int | None:
    """Run ``command``'s main(argv) in the warm worker, on this process's stdout/stderr, working folder and
    environment: its exit code; None when no worker answers (one is started for the next command)."""
    if not enabled():
        return None
    path = socket_path()
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(path))
    except OSError:
        connection.close()
        if _start(path):
            print(_started_line(), file=sys.stderr, flush=True)
        return None
    with connection:
        sys.stdout.flush()
        sys.stderr.flush()
        request = pickle.dumps({"command": command, "argv": argv, "cwd": os.getcwd(),
                                "environ": dict(store.START_ENVIRON)})
        try:
            socket.send_fds(connection, [_LENGTH.pack(len(request)) + request],
                            [sys.stdout.fileno(), sys.stderr.fileno()])
            reply = _receive_exactly(connection, _CODE.size)
        except OSError:
            reply = None
    if reply is None:
        print("the checking worker stopped without an answer: answering here (MBRIDGE_OFFLOAD_NO_WORKER=1 skips "
              "the worker)", file=sys.stderr, flush=True)
        return None
    return _CODE.unpack(reply)[0]


def _receive_exactly(connection: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = connection.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _start(path: Path) -> subprocess.Popen | None:
    """Start a worker for ``path`` in the background (detached: it outlives this command)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        log = (path.parent / f"{path.stem}.log").open("ab")
    except OSError:
        return None
    with log:
        return subprocess.Popen([sys.executable, "-m", __name__, str(path)], cwd=store.ROOT,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                env={**os.environ, IN_WORKER_ENV: ""})


def serve(path: Path) -> None:
    """The worker: load everything once, then answer requests until idle for IDLE_EXIT_S."""
    lock = open(path.with_suffix(".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another worker for this key is up (or starting)
    from mbridge_offload.facts.import_notices import quiet_import_notices

    quiet_import_notices()
    import importlib

    import megatron.bridge.training.config  # noqa: F401  (what every answer needs, loaded once)

    for module in COMMANDS.values():
        importlib.import_module(module)
    import mbridge_offload.prepare  # noqa: F401
    import mbridge_offload.validation.upstream  # noqa: F401

    # what importing the stack set in this process's environment, as a command's own imports would set it
    added_by_imports = {k: v for k, v in os.environ.items() if k not in store.START_ENVIRON}
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(8)
    listener.settimeout(IDLE_EXIT_S)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # answered children are reaped by the kernel
    # Python warns on fork() in a process with threads; the one native thread the stack leaves here is
    # jemalloc's background thread, which jemalloc itself makes fork-safe (its pthread_atfork handlers)
    warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks", category=DeprecationWarning)
    try:
        while True:
            try:
                connection, _ = listener.accept()
            except socket.timeout:
                return
            with connection:
                _answer(connection, added_by_imports)
    finally:
        path.unlink(missing_ok=True)
        listener.close()


def _answer(connection: socket.socket, added_by_imports: dict[str, str]) -> None:
    header, fds, _, _ = socket.recv_fds(connection, _LENGTH.size, 2)
    try:
        (length,) = _LENGTH.unpack(header)
        body = _receive_exactly(connection, length)
        request: dict[str, Any] = pickle.loads(body) if body else {}
    except (struct.error, pickle.UnpicklingError, EOFError):
        request = {}
    if len(fds) != 2 or request.get("command") not in COMMANDS:
        for fd in fds:
            os.close(fd)
        return
    if os.fork() == 0:
        code = 1
        try:
            code = _run_request(request, fds, added_by_imports)
        finally:
            try:
                connection.sendall(_CODE.pack(code))
            finally:
                os._exit(0)
    for fd in fds:
        os.close(fd)


def _run_request(request: dict[str, Any], fds: list[int], added_by_imports: dict[str, str]) -> int:
    """In the forked child: the command's main on the caller's output, folder and environment."""
    import importlib

    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**request["environ"], **added_by_imports, IN_WORKER_ENV: "1"})
    store.START_ENVIRON.clear()
    store.START_ENVIRON.update(request["environ"])
    main = importlib.import_module(COMMANDS[request["command"]]).main
    try:
        code = main(request["argv"])
    except SystemExit as stop:  # argparse and the commands' own refusals, as the interpreter would end them
        code = 0 if stop.code is None else stop.code
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001  (shown to the user as the command itself would)
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return int(code or 0)


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
