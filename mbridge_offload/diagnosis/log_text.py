"""A LOG file's bytes as the text a user saw: decompressed (gzip, bzip2, xz: logs are often kept compressed),
decoded (UTF-8, or the UTF-16 of a Windows redirect, with or without its byte-order mark; a stray byte never
stops the reading), without terminal colour codes. What is not text at all (a checkpoint shard, a core file)
is refused with a LogError that says so, rather than searched. What the reading has to tell about a file it did
read (a compressed file cut short or damaged part-way) is a note, one line each, for the report."""

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
# the run still wrote it) still gives the lines it holds; fed in blocks, so that one damaged part-way gives the text
# before the damage
_DECOMPRESSORS = (
    (b"\x1f\x8b", "gzip", lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)),
    (b"BZh", "bzip2", bz2.BZ2Decompressor),
    (b"\xfd7zXZ\x00", "xz", lzma.LZMADecompressor),
)
_BLOCK_BYTES = 16 * 1024  # a damaged block loses the text it held: small, for what came before it


class LogError(Exception):
    """A LOG that cannot be read: the message names the file, what is wrong with it and what to give instead."""


def _decompressed(path: Path, data: bytes, notes: list[str]) -> bytes:
    """``data`` decompressed where its magic bytes name a format; a note where it ends before its stream does (cut
    short) or is damaged part-way, with what came before read; LogError where nothing of it can be."""
    for magic, name, decompressor in _DECOMPRESSORS:
        if not data.startswith(magic):
            continue
        out, rest, stream = [], data, None
        try:
            while rest.startswith(magic):  # concatenated members (gzip -c a >> log.gz) follow one another
                stream, at = decompressor(), 0
                while at < len(rest) and not stream.eof:
                    out.append(stream.decompress(rest[at:at + _BLOCK_BYTES]))
                    at += _BLOCK_BYTES
                rest = stream.unused_data + rest[at:] if stream.eof else b""
        except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as error:
            if not any(out):
                raise LogError(f"{path} is a {name} file that cannot be decompressed ({error}): give the log "
                               "uncompressed, or a complete copy of the compressed file") from None
            notes.append(f"{path} is a {name} file damaged part-way ({type(error).__name__}: {error}): only the "
                         f"{sum(map(len, out))} bytes of text before the damage were read")
            return b"".join(out)
        if stream is not None and not stream.eof and not any(out):
            raise LogError(f"{path} is a {name} file cut short before any of its text (bzip2 and xz give theirs a "
                           "block at a time): give a complete copy of it, or the log uncompressed")
        if stream is not None and not stream.eof:
            notes.append(f"{path} is a {name} file cut short (its end is missing, as in a copy made while the run "
                         "still wrote it): the text it holds was read, but lines after its end are not in it")
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


def log_text(path: Path, notes: list[str] | None = None) -> list[tuple[int, str]]:
    """The text of one LOG file as (number of its first line, text) parts: the whole file, or where it is larger than
    MAX_LOG_BYTES its first HEAD_BYTES (the command and the header the fix is computed from) and its end (where the
    failure is), each from the start of a line. ``notes`` gets what the reading has to tell about the file."""
    notes = [] if notes is None else notes
    if path == STDIN:
        try:
            data = sys.stdin.buffer.read()
        except (OSError, ValueError) as error:  # closed, or not readable (a detached terminal, a test's capture)
            raise LogError(f"cannot read standard input: {error}: give the log as a file") from None
        return _texts(path, [(1, data)], notes)
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
    return _texts(path, parts, notes)


def _texts(path: Path, parts: list[tuple[int, bytes]], notes: list[str]) -> list[tuple[int, str]]:
    """Each part's text; LogError where the file is not text."""
    texts = [(first, _NULS.sub("", without_terminal_codes(_decoded(_decompressed(path, data, notes)))))
             for first, data in parts]
    sample = texts[0][1][:65536]
    if sample and len(_NOT_TEXT.findall(sample)) > NOT_TEXT_SHARE * len(sample):
        raise LogError(f"{path} is not a text log (binary data): give the run's printed output (the file torchrun's "
                       "or srun's stdout/stderr went to, a run folder's log.txt, or its failure.json)")
    return texts
