"""Where each record of an LMDB environment lies in ``data.mdb``: a page table for read-ahead.

LMDB maps its file and reads a value by page faults, one 4 KB page at a time: from a disk, at
queue depth one. To hint the pages of the next records (readers/remote/readahead.py) their places are
needed without touching the values, so this walks the B-tree itself with ``os.pread``, reading
only branch and leaf pages (a few hundred for 40,000 records), never an overflow page.

The on-disk format (LMDB's ``mdb.c``, 64-bit builds): pages 0 and 1 are meta pages, the one with
the higher transaction id is current and names the main database's root page. A page starts with
a 16-byte header (``pgno`` u64, pad u16, ``flags`` u16, ``lower`` u16, ``upper`` u16; an overflow
page holds its page count where lower/upper are), then ``(lower - 16) / 2`` u16 offsets of its
nodes. A node is ``lo`` u16, ``hi`` u16, ``flags`` u16, ``ksize`` u16, the key, then (leaf) the
value, or with ``F_BIGDATA`` the u64 number of the first of the overflow pages holding it; in a
branch page ``lo | hi << 16 | flags << 32`` is the child page. Keys of samples are 8 bytes
(readers/formats/lmdb/reader.py); other keys (``meta/labels``) are skipped.
"""

from __future__ import annotations

import os
import struct

import numpy as np

from readers.errors import ManifestError

PAGE_HEADER = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
NODE = struct.Struct("<HHHH")  # lo, hi, flags, ksize
# At 88 of a meta page: pad, flags, depth, branch, leaf and overflow pages, entries, root page.
MAIN_DB = struct.Struct("<IHHQQQQQ")
MAIN_DB_AT = 88
TXNID_AT = 144
P_BRANCH, P_LEAF, P_OVERFLOW, P_LEAF2 = 0x01, 0x02, 0x04, 0x20
F_BIGDATA = 0x01
P_INVALID = (1 << 64) - 1
KEY_SIZE = 8
MAX_DEPTH = 32


class PageTableError(ManifestError):
    """data.mdb's B-tree is not what LMDB writes (damaged): read-ahead is skipped for it."""


class PageTable:
    """For each local index of an environment: the byte range of its value in data.mdb and the
    leaf page that holds its node (``value_offset``, ``value_length``, ``leaf_page``; offset -1
    where the environment has no such key). 16 bytes a record."""

    def __init__(self, fd: int, count: int, where: str):
        self.where = where
        size = os.fstat(fd).st_size
        psize = _page_size(fd, where)
        self.page_size = psize
        self.value_offset = np.full(count, -1, dtype=np.int64)
        self.value_length = np.zeros(count, dtype=np.uint32)
        self.leaf_page = np.zeros(count, dtype=np.uint32)
        root = _main_root(fd, psize, where)
        if root == P_INVALID:
            return
        level, seen = [root], set()
        for _ in range(MAX_DEPTH):
            if not level:
                return
            children: list[int] = []
            for pgno in sorted(level):  # in file order: the reads move one way over the disk
                if pgno in seen or pgno >= 1 << 32 or (pgno + 1) * psize > size:
                    self._bad(f"page {pgno} is outside the file or part of a loop")
                seen.add(pgno)
                page = os.pread(fd, psize, pgno * psize)
                children += self._page(page, pgno, psize, size)
            level = children
        self._bad(f"the B-tree is deeper than {MAX_DEPTH} levels")

    def extents(self, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, lengths) in data.mdb of the values of the local indices ``local`` that the
        environment holds. Not their leaf pages: building this table has just read every one,
        and each lookup touches them again, so they stay cached."""
        local = local[self.value_offset[local] >= 0]
        return self.value_offset[local], self.value_length[local].astype(np.int64)

    def _bad(self, what: str) -> None:
        raise PageTableError(f"{self.where}: {what}; the LMDB file is damaged, run `pack verify` or re-pack")

    def _page(self, page: bytes, pgno: int, psize: int, size: int) -> list[int]:
        """The children of a branch page (a leaf page's records go into the table)."""
        if len(page) < psize:
            self._bad(f"page {pgno} is cut short")
        stored, _, flags, lower, upper = PAGE_HEADER.unpack_from(page)
        if stored != pgno or not PAGE_HEADER.size <= lower <= upper <= psize or flags & P_LEAF2:
            self._bad(f"page {pgno} has a bad header")
        if not flags & (P_BRANCH | P_LEAF):
            self._bad(f"page {pgno} is neither a branch nor a leaf page")
        raw = np.frombuffer(page, dtype=np.uint8)
        at = raw[PAGE_HEADER.size : lower].view("<u2").astype(np.int64)  # the nodes' offsets
        if ((at < upper) | (at + NODE.size > psize)).any():
            self._bad(f"page {pgno} has a node outside its page")
        lo, hi, node_flags, ksize = _fields(raw, at, NODE.size, "<u2").T
        key_at = at + NODE.size
        if (key_at + ksize > psize).any():
            self._bad(f"page {pgno} has a key outside its page")
        if flags & P_BRANCH:
            return (lo | hi << 16 | node_flags << 32).tolist()
        mine = ksize == KEY_SIZE  # the samples (meta/labels has a longer key)
        at, lo, hi, node_flags, key_at = at[mine], lo[mine], hi[mine], node_flags[mine], key_at[mine]
        index = _fields(raw, key_at, KEY_SIZE, ">u8")[:, 0]
        inside = (index >= 0) & (index < len(self.value_offset))  # others: the reader's count check
        length = lo | hi << 16
        value_at = key_at + KEY_SIZE
        big = (node_flags & F_BIGDATA).astype(bool)
        if (value_at + np.where(big, 8, length) > psize).any():
            self._bad(f"page {pgno} has a value outside its page")
        offset = pgno * psize + value_at
        if big.any():
            first = _fields(raw, value_at[big], 8, "<u8")[:, 0]
            pages = -(-(PAGE_HEADER.size + length[big]) // psize)
            if ((first < 2) | (first + pages > size // psize)).any():
                self._bad(f"page {pgno} names overflow pages outside the file")
            offset[big] = first.astype(np.int64) * psize + PAGE_HEADER.size
        index, offset, length = index[inside], offset[inside], length[inside]
        self.leaf_page[index] = pgno
        self.value_length[index] = length
        self.value_offset[index] = offset
        return []


def _fields(raw: np.ndarray, at: np.ndarray, width: int, dtype: str) -> np.ndarray:
    """The ``width`` bytes at each of ``at`` in ``raw``, as rows of ``dtype`` values."""
    rows = raw[at[:, None] + np.arange(width)]
    return np.ascontiguousarray(rows).view(dtype).astype(np.int64)  # a huge u64 turns negative


def _page_size(fd: int, where: str) -> int:
    head = os.pread(fd, 48, 0)
    if len(head) < 48:
        raise PageTableError(f"{where}: too short for an LMDB file; re-pack")
    (psize,) = struct.unpack_from("<I", head, 40)
    if psize < 512 or psize & (psize - 1) or psize > 1 << 16:
        raise PageTableError(f"{where}: LMDB header holds page size {psize}; the file is damaged, re-pack")
    return psize


def _main_root(fd: int, psize: int, where: str) -> int:
    """The main database's root page, from the meta page with the higher transaction id."""
    best = None
    for meta in (0, 1):
        page = os.pread(fd, TXNID_AT + 8, meta * psize)
        if len(page) < TXNID_AT + 8 or struct.unpack_from("<I", page, 16)[0] != 0xBEEFC0DE:
            continue
        (txnid,) = struct.unpack_from("<Q", page, TXNID_AT)
        root = MAIN_DB.unpack_from(page, MAIN_DB_AT)[-1]
        if best is None or txnid > best[0]:
            best = (txnid, root)
    if best is None:
        raise PageTableError(f"{where}: no valid LMDB meta page; the file is damaged, re-pack")
    return best[1]
