"""A LOG file's bytes as the text a user saw: decompressed (gzip, bzip2, xz: logs are often kept compressed),
decoded (UTF-8, or the UTF-16 of a Windows redirect, with or without its byte-order mark; a stray byte never
stops the reading), without terminal colour codes. What is not text at all (a checkpoint shard, a core file)
is refused with a LogError that says so, rather than searched."""

from __future__ import annotations

import bz2
import lzma
import re
import sys
import zlib
from pathlib import Path

STDIN = Path("-")  # the LOG argument that reads a pasted log from standard input

# A file larger than this is read from its end: a failure is printed last, and a week-long run's output can
# outgrow memory. Its first HEAD_BYTES are read too (the command, the header); line numbers count from the file's
# start.
MAX_LOG_BYTES = 512 * 1024 ** 2
HEAD_BYTES = 1024 ** 2
# Colour and cursor codes (CSI, e.g. "\x1b[31m") and window-title codes (OSC) that loggers and tqdm write
_TERMINAL_CODES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-B]|\x1b[=>]")
# Control characters no text log holds (tab, newline, carriage return, form feed, backspace, escape and
# the bell are text): their share tells a binary file from a log with a few bad bytes
_NOT_TEXT = re.compile(r"[\x00-\x06\x0e-\x1a\x1c-\x1f\ufffd]")
NOT_TEXT_SHARE = 0.05
# NUL bytes in a log are blocks its writer never filled (a node that crashed or rebooted leaves the unwritten end
# of a file it had grown as zeros): no text, so they are dropped before the file is judged and read
_NULS = re.compile("\x00+")

# (magic bytes, name, a new streaming decompressor): streaming, so that a compressed log cut short (copied while
# the run still wrote it) still gives the lines it holds
_DECOMPRESSORS = (
    (b"\x1f\x8b", "gzip", lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)),
    (b"BZh", "bzip2", bz2.BZ2Decompressor),
    (b"\xfd7zXZ\x00", "xz", lzma.LZMADecompressor),
)


class LogError(Exception):
    """A LOG that cannot be read: the message names the file, what is wrong with it and what to give instead."""


def _decompressed(path: Path, data: bytes) -> bytes:
    for magic, name, decompressor in _DECOMPRESSORS:
        if not data.startswith(magic):
            continue
        out, rest = [], data
        try:
            while rest.startswith(magic):  # concatenated members (gzip -c a >> log.gz) follow one another
                stream = decompressor()
                out.append(stream.decompress(rest))
                rest = stream.unused_data
        except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as error:
            if not any(out):
                raise LogError(f"{path} is a {name} file that cannot be decompressed ({error}): give the log "
                               "uncompressed, or a complete copy of the compressed file") from None
        return b"".join(out)
    return data


def _decoded(data: bytes) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    if data.startswith(b"\xef\xbb\xbf"):
        return data[3:].decode("utf-8", errors="replace")
    sample = data[:4096]
    # UTF-16 without a byte-order mark: ASCII text with a NUL byte beside every character
    if len(sample) >= 4 and sample[1::2].count(0) > 0.4 * len(sample[1::2]) and sample[0::2].count(0) == 0:
        return data.decode("utf-16-le", errors="replace")
    if len(sample) >= 4 and sample[0::2].count(0) > 0.4 * len(sample[0::2]) and sample[1::2].count(0) == 0:
        return data.decode("utf-16-be", errors="replace")
    return data.decode("utf-8", errors="replace")


def without_terminal_codes(text: str) -> str:
    return _TERMINAL_CODES.sub("", text)


def _skipped_lines(file, upto: int) -> int:
    """How many line ends the first ``upto`` bytes of ``file`` hold (read in blocks: only the count is kept)."""
    file.seek(0)
    count, left = 0, upto
    while left > 0:
        block = file.read(min(left, 16 * 1024 ** 2))
        if not block:
            break
        count, left = count + block.count(b"\n"), left - len(block)
    return count


def log_text(path: Path) -> list[tuple[int, str]]:
    """The text of one LOG file as (number of its first line, text) parts: the whole file, or where it is larger than
    MAX_LOG_BYTES its first HEAD_BYTES (the command and the header the fix is computed from) and its end (where the
    failure is), each from the start of a line."""
    if path == STDIN:
        return _texts(path, [(1, sys.stdin.buffer.read())])
    try:
        with path.open("rb") as file:
            head = file.read(8)
            file.seek(0, 2)
            size = file.tell()
            file.seek(0)
            compressed = any(head.startswith(magic) for magic, *_ in _DECOMPRESSORS)
            if size <= MAX_LOG_BYTES or compressed:
                parts = [(1, file.read())]
            else:
                start = file.read(HEAD_BYTES)
                start = start[:start.rfind(b"\n") + 1]
                tail_at = size - MAX_LOG_BYTES
                tail_line = 1 + _skipped_lines(file, tail_at)
                file.seek(tail_at)
                tail = file.read()
                cut = tail.find(b"\n")  # the first bytes read end a line that began before: start at the next
                parts = [(1, start), (tail_line + 1, tail[cut + 1:] if cut >= 0 else b"")]
    except OSError as error:
        raise LogError(f"cannot read {path}: {error.strerror or error}") from None
    return _texts(path, parts)


def _texts(path: Path, parts: list[tuple[int, bytes]]) -> list[tuple[int, str]]:
    """Each part's text; LogError where the file is not text."""
    texts = [(first, _NULS.sub("", without_terminal_codes(_decoded(_decompressed(path, data)))))
             for first, data in parts]
    sample = texts[0][1][:65536]
    if sample and len(_NOT_TEXT.findall(sample)) > NOT_TEXT_SHARE * len(sample):
        raise LogError(f"{path} is not a text log (binary data): give the run's printed output (the file torchrun's "
                       "or srun's stdout/stderr went to, a run folder's log.txt, or its failure.json)")
    return texts
