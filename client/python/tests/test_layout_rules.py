"""The client's check of the regions and sections an agent names
(docs/PROTOCOL.md, "Regions and sections"): the same table as agent/proto's
TestCheckLayout."""

import copy
import unittest

from reft import session as S


def _buf(name, size):
    return S._Buffer(name, memoryview(bytearray(size)), True)


BUFS = {b.name: b for b in (_buf("w", 10000), _buf("m", 5000), _buf("empty", 0))}
SECS = [{"name": "a", "arena_offset": 0, "size": 8192},
        {"name": "b", "arena_offset": 8192, "size": 6808},
        {"name": "z", "arena_offset": 16384, "size": 0}]
REGS = [{"buffer": "m", "offset": 0, "size": 5000, "arena_offset": 0},
        {"buffer": "w", "offset": 7000, "size": 3000, "arena_offset": 5000},
        {"buffer": "w", "offset": 0, "size": 192, "arena_offset": 8000},
        {"buffer": "w", "offset": 192, "size": 6808, "arena_offset": 8192}]


def _set(where, i, **kw):
    def f(s, r):
        (s if where == "s" else r)[i].update(kw)
        return s, r
    return f


CASES = [
    # name, edit of (sections, regions), error on save ("" none), on restore
    ("valid", lambda s, r: (s, r), "", ""),
    ("only empty buffers", lambda s, r: ([{"name": "empty", "arena_offset": 0, "size": 0}], []), "", ""),
    ("unknown buffer", _set("r", 0, buffer="x"), "not registered", "not registered"),
    ("empty region", _set("r", 0, size=0), "is empty", "is empty"),
    ("region leaves its buffer", _set("r", 1, offset=7001), "leaves the buffer", "leaves the buffer"),
    ("negative buffer offset", _set("r", 1, offset=-1), "leaves the buffer", "leaves the buffer"),
    ("region leaves the arena", _set("r", 3, arena_offset=1 << 62), "leaves the arena", "leaves the arena"),
    ("regions overlap in the arena", _set("r", 1, arena_offset=4999), "overlap in the arena", "overlap in the arena"),
    ("region spans two sections", lambda s, r: _set("r", 3, offset=292, arena_offset=8292, size=6708)(*_set("r", 2, size=292)(s, r)),
     "not inside one section", "not inside one section"),
    ("region outside every section", _set("r", 3, arena_offset=15100, size=100), "not inside one section", "not inside one section"),
    ("gap in a section", lambda s, r: (s, r[1:]), "fill 3192 of its 8192", ""),
    ("overlap in a buffer", _set("r", 2, offset=100), "", "must not overlap in a buffer"),
    ("duplicate section", _set("s", 1, name="a"), "not unique", "not unique"),
    ("section leaves the arena", _set("s", 2, size=1), "does not fit", "does not fit"),
    ("sections overlap", _set("s", 1, arena_offset=8000), "overlap", "overlap"),
    ("regions without sections", lambda s, r: (None, r), "both lists or neither", "both lists or neither"),
    ("not a number", _set("r", 0, size="5000"), "not numbers", "not numbers"),
]


class LayoutRules(unittest.TestCase):
    def test_rules(self):
        for name, edit, on_save, on_restore in CASES:
            for save, want in ((True, on_save), (False, on_restore)):
                with self.subTest(name, save=save):
                    s, r = edit(copy.deepcopy(SECS), copy.deepcopy(REGS))
                    try:
                        got = S._check_layout(BUFS, 16384, s, r, save)
                    except S._LayoutError as e:
                        self.assertTrue(want, "refused: %s" % e)
                        self.assertIn(want, str(e))
                        continue
                    self.assertFalse(want, "accepted, want %r" % want)
                    ats = [at for _, _, _, at in got]
                    self.assertEqual(ats, sorted(ats))  # in arena order, for the copier

    def test_regions_come_back_in_arena_order(self):
        got = S._check_layout(BUFS, 16384, SECS, REGS[::-1], True)
        self.assertEqual([(b.name, off, size, at) for b, off, size, at in got],
                         [(r["buffer"], r["offset"], r["size"], r["arena_offset"]) for r in REGS])


if __name__ == "__main__":
    unittest.main()
