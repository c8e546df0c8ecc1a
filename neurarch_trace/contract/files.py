"""Reading and writing ``.neurarch.json`` files: the one reader and the one writer.

:func:`read_graph` loads a file and checks it is a graph (optionally the whole contract);
:func:`write_graph` validates and writes atomically. :func:`default_graph_path` and
:func:`check_output_path` are the output-path rules every front end applies before a trace, so a
bad ``-o`` costs no trace.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import stat
import tempfile
import zlib

from neurarch_trace.contract.document import not_a_graph
from neurarch_trace.contract.validate import check_graph
from neurarch_trace.errors import GraphError, NeurarchError

__all__ = ["check_output_path", "default_graph_path", "dumps_graph", "named_graph_path", "read_graph",
           "unwritable_folder", "write_error", "write_graph", "write_text"]

#: The file name ending of a graph.
SUFFIX = ".neurarch.json"

#: The largest graph read, in bytes (decompressed): a 10,000-layer graph is 7 MB, and the reference
#: plan service takes request bodies of 16 MiB at most. A larger file is not read into memory (a
#: checkpoint given by mistake, ``/dev/zero``).
MAX_GRAPH_BYTES = 256 * 1024 * 1024


def read_graph(path: str | os.PathLike[str], *, strict: bool = False) -> dict:
    """Read a ``.neurarch.json`` file.

    The document must be a graph (an object with ``components`` and ``connections`` arrays whose
    components carry string ids). With ``strict=True`` the whole clean-graph contract is enforced
    (see :func:`~neurarch_trace.contract.validate.validate_graph`); otherwise a graph with, say, a
    dead branch is still returned, so a plan service can report it as a blocker. A gzip-compressed
    file (``model.neurarch.json.gz``, known by its magic bytes) is read through ``gzip``.

    Raises:
        GraphError: the file is missing or unreadable, larger than :data:`MAX_GRAPH_BYTES` (read no
            further), is not UTF-8 JSON (or a damaged gzip file), or is not a graph.
    """
    p = os.fspath(path)
    try:
        with open(p, "rb") as fh:
            data = fh.read(MAX_GRAPH_BYTES + 1)
    except FileNotFoundError:
        raise GraphError(f"graph file {p} does not exist") from None
    except IsADirectoryError:
        raise GraphError(f"graph file {p} is a directory, not a .neurarch.json file") from None
    except OSError as exc:
        raise GraphError(f"cannot read graph file {p}: {exc.strerror or exc}") from exc
    if len(data) > MAX_GRAPH_BYTES:
        raise _too_large(p)
    if data[:2] == _GZIP_MAGIC:
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as unzipped:
                data = unzipped.read(MAX_GRAPH_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            raise GraphError(f"graph file {p} is gzip-compressed but cannot be decompressed ({exc}); "
                             "compress it again or give the .neurarch.json itself") from exc
        if len(data) > MAX_GRAPH_BYTES:
            raise _too_large(p)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GraphError(f"graph file {p} is not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x}): "
                         "a .neurarch.json graph is JSON") from None
    try:
        graph = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GraphError(f"graph file {p} is not JSON ({exc.msg.removesuffix(' at')} at line {exc.lineno})") from exc
    if strict:
        return check_graph(graph, what=f"graph file {p}")
    fault = not_a_graph(graph)
    if fault is not None:
        raise GraphError(f"graph file {p} is not a .neurarch.json graph: {fault.file_sentences[0]}")
    return graph


def _too_large(path: str) -> GraphError:
    return GraphError(f"graph file {path} holds more than {MAX_GRAPH_BYTES // 2 ** 20} MiB, more than any "
                      ".neurarch.json graph (a 10,000-layer graph is 7 MB): give the file the trace wrote")


#: The first two bytes of a gzip file (RFC 1952, section 2.3.1).
_GZIP_MAGIC = b"\x1f\x8b"


def dumps_graph(graph: dict) -> str:
    """Serialise a graph deterministically (key order as built, two-space indent, final newline)."""
    return json.dumps(graph, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def write_graph(graph: dict, path: str | os.PathLike[str], *, validate: bool = True) -> str:
    """Write ``graph`` to ``path`` atomically and return the path written.

    The text goes to a temporary file in the same folder, is flushed to disk, then renamed over
    ``path``: a failure never leaves a partial file and never clobbers an earlier good one.

    A path that is a device or a pipe (``/dev/null``, ``/dev/stdout``, a FIFO) is written into
    instead: it is not a file to replace. A path ending in ``.gz`` gets the JSON gzip-compressed
    (with no timestamp in the header, so the same graph gives the same bytes), as
    :func:`read_graph` reads it.

    Raises:
        GraphError: ``validate`` is true and the graph breaks the contract (nothing is written).
        OSError: the folder does not exist or is not writable; ``str()`` names ``path``.
    """
    if validate:
        check_graph(graph)
    data = dumps_graph(graph).encode("utf-8")
    if os.fspath(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    return _write_bytes(data, path)


def write_text(text: str, path: str | os.PathLike[str]) -> str:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all, as :func:`write_graph` writes a
    graph, and return the path written: a temporary file in the same folder, flushed to disk, given
    the mode of the file it replaces (a new one the mode ``open()`` gives, 0666 less the umask)
    and renamed over ``path``; a device or a pipe is written into.

    Raises:
        OSError: the folder does not exist, ``path`` is a folder, or the folder is not writable;
            its ``strerror`` is one sentence naming ``path``.
    """
    return _write_bytes(text.encode("utf-8"), path)


def _write_bytes(data: bytes, path: str | os.PathLike[str]) -> str:
    """:func:`write_text`'s work, on bytes."""
    p = os.fspath(path)
    if _special(p):  # a device, a pipe (/dev/null, /dev/stdout, a FIFO): written into, never replaced
        try:
            with open(p, "wb") as fh:
                fh.write(data)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot write {p}: {exc.strerror}") from exc
        return p
    target = os.path.realpath(p)  # writing through a symbolic link updates the file it points to
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise OSError(errno.ENOENT, missing_folder(p, folder))
    if os.path.isdir(target):
        raise OSError(errno.EISDIR, f"cannot write {p}: it is a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".neurarch-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write {p}: {exc.strerror} (folder {folder})") from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _mode_of(target))
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p


def _mode_of(path: str) -> int:
    """The permission bits of the file at ``path``, which a replacement keeps (a graph made private
    with ``chmod 600`` stays private), or, when there is none yet, what ``open()`` would give a new
    file: 0666 less the umask (``mkstemp`` makes its file 0600)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (``/proc/self/status``,
    kernel 4.7+; setting it to read it back races with other threads' file creation)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_graph_path(name: str) -> str:
    """``./<name>.neurarch.json`` with every character of ``name`` that is not a letter, a digit,
    ``-``, ``_`` or ``.`` made ``_`` (``model`` when nothing is left)."""
    return f"{_file_stem(name) or 'model'}{SUFFIX}"


def named_graph_path(name: str) -> str:
    """:func:`default_graph_path` of a name the user gave (``--name``), for a graph with no ``-o``.

    Raises:
        NeurarchError: nothing of ``name`` can name a file (``--name '...'``, emoji only): the
            graph would go to ``model.neurarch.json``, where an earlier graph may be.
    """
    if not _file_stem(name):
        raise NeurarchError(f"--name {name!r} has no letter or digit to name the graph's file after; "
                            "give a name with one, or -o FILE as well")
    return default_graph_path(name)


def _file_stem(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name).strip("._")


def missing_folder(path: object, folder: str) -> str:
    """Why ``path`` cannot be written when its ``folder`` is no folder: a file on the way
    (``-o good.json/x.json``), or a folder that does not exist."""
    blocking = folder
    while not os.path.exists(blocking) and os.path.dirname(blocking) != blocking:
        blocking = os.path.dirname(blocking)
    if os.path.exists(blocking) and not os.path.isdir(blocking):
        return f"cannot write {path}: {blocking} is a file, not a folder"
    return f"cannot write {path}: folder {folder} does not exist"


def _special(path: str) -> bool:
    """``path`` exists and is neither a regular file nor a folder: a character or block device, a
    FIFO or a socket, which renaming a temporary file over would replace (as root, ``/dev/null``)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def check_output_path(path: str) -> str:
    """Return ``path`` when a graph can be written there: its folder exists, it is no folder, and
    the folder takes a new file (the temporary file :func:`write_graph` renames over ``path``; a
    read-only folder or ``/proc`` does not). The check makes and removes an empty temporary file,
    as the write itself will; a device or a pipe (``/dev/null``) is written into and not checked.

    Raises:
        NeurarchError: one line naming the path and what is wrong with it.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise NeurarchError(missing_folder(path, folder))
    if os.path.isdir(path):
        raise NeurarchError(f"cannot write {path}: it is a folder; give a file name ending in {SUFFIX}")
    if len(os.path.basename(path).encode()) > _NAME_MAX:
        raise NeurarchError(f"cannot write {path[:60]}...: the file name is longer than {_NAME_MAX} bytes; give a "
                            "shorter -o or --name")
    if not _special(path):
        folder = os.path.dirname(os.path.realpath(path))  # a symbolic link is written through
        if not os.path.isdir(folder):
            raise NeurarchError(missing_folder(path, folder))
        reason = unwritable_folder(folder)
        if reason is not None:
            raise NeurarchError(f"cannot write {path}: {reason} (folder {folder})")
    return path


#: The longest file name most file systems take, in bytes (ext4, XFS, Btrfs, APFS, NTFS: 255).
_NAME_MAX = 255


def unwritable_folder(folder: str) -> str | None:
    """Why no new file can be made in ``folder`` (``"Permission denied"``, ``"Read-only file
    system"``), or ``None`` when one can. One empty temporary file is made there and removed at
    once, as :func:`write_graph` will make one and rename it."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".neurarch-", suffix=".tmp", dir=folder)
    except OSError as exc:  # /proc answers ENOENT for a folder that exists
        return "it takes no new files" if exc.errno == errno.ENOENT else str(exc.strerror or exc)
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:
        pass
    return None


def write_error(exc: OSError, path: str) -> NeurarchError:
    """The one-line error for a :func:`write_graph` that raised ``exc`` writing ``path``."""
    if exc.strerror and str(path) in exc.strerror:
        return NeurarchError(exc.strerror)  # write_graph's own sentence already names the path
    return NeurarchError(f"cannot write {path}: {exc.strerror or exc}")
