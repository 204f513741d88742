"""The Python client against the real agent: tests/conformance-agent (a
reft agent over a fresh temporary store) built from this tree. Skipped when
that program or the go tool is missing."""

import glob
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

import reft
from reft import conformance
from common import REPO, pattern, vectors

try:
    import numpy
except ImportError:
    numpy = None

_BIN = None


def agent_binary():
    """Build the conformance agent once per test run; without it the tests fail."""
    global _BIN
    if _BIN is None or not os.path.exists(_BIN):  # another module's teardown may have removed it
        if not os.path.isfile(os.path.join(REPO, "tests", "conformance-agent", "main.go")):
            raise AssertionError("tests/conformance-agent is not in this tree")
        go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
        if go is None:
            raise AssertionError("the go tool is needed to build tests/conformance-agent (install Go, or put it on PATH)")
        d = tempfile.mkdtemp(prefix="reft-py-agent-")
        path = os.path.join(d, "conformance-agent")
        r = subprocess.run([go, "build", "-o", path, "./tests/conformance-agent"], cwd=REPO,
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise AssertionError("go build ./tests/conformance-agent failed:\n" + r.stdout + r.stderr)
        _BIN = path
    return _BIN


def tearDownModule():
    if _BIN is not None:
        shutil.rmtree(os.path.dirname(_BIN), ignore_errors=True)


class RealAgent(unittest.TestCase):
    def setUp(self):
        self.agent = conformance._Agent(agent_binary(), 0)
        self.addCleanup(self.agent.stop)

    def session(self, **kw):
        kw.setdefault("rank", 0)
        kw.setdefault("world", 1)
        s = reft.Session(socket_path=self.agent.path, **kw)
        self.addCleanup(s.close)
        return s

    def test_vectors(self):
        import io
        out = io.StringIO()
        failures = conformance.run(vectors(), agent_binary(), out=out)
        self.assertEqual(failures, 0, out.getvalue())

    def test_progress(self):
        s = self.session()
        with self.assertRaisesRegex(reft.Error, "nothing is registered"):
            s.progress(1)
        s.register("w", pattern(4096, 1))
        for bad in (-1, 1.5, True):
            with self.assertRaises(reft.Error):
                s.progress(bad)
        for step in (1, 2, 3):
            s.progress(step)  # the agent answers; hang detection takes it
        self.assertTrue(s.save(4).wait(timeout=60))
        s.progress(5)

    def test_large_buffers_default_chunks(self):
        s = self.session()
        a = bytearray(os.urandom(9 << 20))  # more than two 4 MiB chunks, not a multiple
        b = pattern(123457, 3)
        s.register("a", a)
        s.register("b", b, replicated=False)
        want_a, want_b = bytes(a), bytes(b)
        h = s.save(10)
        self.assertTrue(h.wait(timeout=60))
        self.assertEqual(h.bytes, len(a) + len(b))
        a[:] = bytes(len(a))
        b[:] = bytes(len(b))
        self.assertEqual(s.restore(), 10)
        self.assertTrue(a == want_a and b == want_b)

    def test_scatter_layout(self):
        # REFT_CONFORMANCE_AGENT reaches the agent: its arena holds two
        # scatter sections, and buffers larger than the default chunk
        # survive the round trip through regions in permuted order.
        self.agent.stop()
        self.agent = conformance._Agent(agent_binary(), 0, "scatter")
        self.addCleanup(self.agent.stop)
        s = self.session()
        a = bytearray(os.urandom(9 << 20))
        b = pattern(12345, 7)
        s.register("a", a)
        s.register("b", b, replicated=False)
        want = (bytes(a), bytes(b))
        self.assertTrue(s.save(3).wait(timeout=60))
        store = s.status()["store_dir"]
        mans = glob.glob(os.path.join(store, "r0", "state", "g3-*", "MANIFEST"))
        self.assertEqual(len(mans), 1, mans)
        with open(mans[0]) as f:
            man = json.load(f)
        self.assertEqual([x["name"] for x in man["buffers"]], ["scatter-0", "scatter-1"])
        self.assertEqual(len(man["regions"]), 6)
        a[:] = bytes(len(a))
        b[:] = bytes(len(b))
        self.assertEqual(s.restore(), 3)
        self.assertTrue((bytes(a), bytes(b)) == want)

    def test_hints_and_reconnect(self):
        s = self.session(chunk_size=4096)
        buf = pattern(100000, 1)
        s.register("w", buf)
        s.hint_idle(0)
        h = s.save(1)
        time.sleep(0.2)
        self.assertFalse(h.done())  # no window announced: the copier waits
        self.assertTrue(h.wait(timeout=5))  # waiting copies the rest at once
        s.hint_idle(0)
        h = s.save(2)
        s.close()  # close finishes the pending save
        self.assertTrue(h.done())
        s2 = self.session()
        buf2 = bytearray(100000)
        s2.register("w", buf2)
        self.assertEqual(s2.generations(), [2, 1])
        self.assertEqual(s2.restore(), 2)
        self.assertEqual(buf2, buf)

    def test_numpy(self):
        if numpy is None:
            self.skipTest("numpy is not installed (the client does not need it)")
        s = self.session()
        x = numpy.linspace(0, 1, 300000, dtype=numpy.float64)
        s.register("x", x)
        s.save(0).wait()
        x[:] = -1
        self.assertEqual(s.restore(step=0), 0)
        self.assertTrue((x == numpy.linspace(0, 1, 300000)).all())

    def test_agent_errors_carry_codes(self):
        s = self.session()
        s.register("w", bytearray(100))
        s.save(1).wait()
        with self.assertRaises(reft.Error) as cm:
            s.restore(step=7)
        self.assertEqual(cm.exception.code, "not_found")
        self.assertEqual(s.restore(), 1)

    def test_corrupt_restore_names_the_bad_chunks(self):
        s = self.session(chunk_size=4096)
        w, v = pattern(3 * 4096 + 100, 1), pattern(5000, 2)
        s.register("w", w)
        s.register("v", v, replicated=False)
        for step in (1, 2):
            self.assertTrue(s.save(step).wait(timeout=60))
        store = s.status()["store_dir"]
        mans = glob.glob(os.path.join(store, "r0", "state", "g2-*", "MANIFEST"))
        self.assertEqual(len(mans), 1, mans)
        with open(mans[0]) as f:
            man = json.load(f)
        off = next(b["offset"] for b in man["buffers"] if b["name"] == "w")
        with open(os.path.join(os.path.dirname(os.path.dirname(mans[0])), man["arena"]), "r+b") as f:
            f.seek(off + 4096 + 5)  # chunk 1 of w
            c = f.read(1)
            f.seek(off + 4096 + 5)
            f.write(bytes([c[0] ^ 0xFF]))
        with self.assertRaises(reft.Error) as cm:
            s.restore(step=2)
        self.assertEqual(cm.exception.code, "corrupt")
        self.assertEqual(cm.exception.bad_chunks,
                         [{"buffer": "w", "section": "w", "chunk": 1, "offset": 4096, "length": 4096}])
        self.assertEqual(s.restore(), 1)  # the bad generation left the list
        self.assertEqual(s.status()["store"]["bad_generations"], 1)


class Intersection:
    """agree for the ranks of one process (threads): each rank's n-th call
    joins round n and returns the values every rank passed, as an
    all-gather and an intersection do across processes."""

    def __init__(self, world):
        self.world, self.lock, self.rounds, self.next = world, threading.Lock(), [], [0] * world
        self.calls = 0

    def agree(self, rank):
        def call(mine):
            with self.lock:
                i = self.next[rank]
                self.next[rank] += 1
                self.calls = max(self.calls, self.next[rank])
                while len(self.rounds) <= i:
                    self.rounds.append({"lists": [None] * self.world, "n": 0, "done": threading.Event()})
                rd = self.rounds[i]
                rd["lists"][rank] = set(mine)
                rd["n"] += 1
                if rd["n"] == self.world:
                    rd["out"] = sorted(set.intersection(*rd["lists"]), reverse=True)
                    rd["done"].set()
            if not rd["done"].wait(60):
                raise RuntimeError("rank %d waited 60 s for the other ranks" % rank)
            return list(rd["out"])
        return call


def run_ranks(world, fn):
    """fn(rank) on world threads; returns each rank's result or exception."""
    out = [None] * world

    def run(r):
        try:
            out[r] = fn(r)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            out[r] = e
    ts = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return out


class AllOrNothing(unittest.TestCase):
    """Four ranks agree on step 2; the ranks whose copy of it is corrupt
    cannot restore it, and then no rank's restore() returns: every rank
    raises naming exactly the failed ranks (the failed ones with their own
    corrupt code). Calling restore() again on every rank restores step 1
    everywhere (the agent dropped the corrupt copies). The Go client's
    TestRestoreAllOrNothing checks the same, with the same words."""

    def session(self, **kw):
        s = reft.Session(socket_path=self.agent.path, **kw)
        self.addCleanup(s.close)
        return s

    def corrupt(self, store, rank, step):
        mans = glob.glob(os.path.join(store, "r%d" % rank, "state", "g%d-*" % step, "MANIFEST"))
        self.assertEqual(len(mans), 1, mans)
        with open(mans[0]) as f:
            man = json.load(f)
        with open(os.path.join(store, "r%d" % rank, "state", man["arena"]), "r+b") as f:
            off = man["buffers"][0]["offset"] + 100
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0xFF]))

    def test_restore_all_or_nothing(self):
        world = 4
        for failed, who in (([], ""), ([2], "rank 2"), ([1, 3], "ranks 1, 3")):
            with self.subTest(failed=failed):
                self.agent = conformance._Agent(agent_binary(), 0)
                self.addCleanup(self.agent.stop)
                ag = Intersection(world)
                ss, bufs = [], []
                for r in range(world):
                    s = self.session(rank=r, world=world, agree=ag.agree(r))
                    buf = bytearray(10000)
                    s.register("w", buf, replicated=False)
                    for step in (1, 2):
                        buf[:] = pattern(10000, 10 * r + step)
                        self.assertTrue(s.save(step).wait(timeout=60))
                    buf[:] = bytes(10000)
                    ss.append(s)
                    bufs.append(buf)
                store = ss[0].status()["store_dir"]
                for r in failed:
                    self.corrupt(store, r, 2)
                got = run_ranks(world, lambda r: ss[r].restore())
                want = 2
                if failed:
                    for r, e in enumerate(got):
                        self.assertIsInstance(e, reft.Error, "rank %d: %r" % (r, e))
                        self.assertEqual((e.ranks, e.more, e.step), (failed, False, 2), "rank %d: %s" % (r, e))
                        self.assertIn("restore of step 2 failed on %s: no rank may train" % who, str(e))
                        self.assertEqual(e.code, "corrupt" if r in failed else None, "rank %d: %s" % (r, e))
                    got = run_ranks(world, lambda r: ss[r].restore())  # again, as the error says
                    want = 1
                self.assertEqual(got, [want] * world)
                for r in range(world):
                    self.assertEqual(bufs[r], pattern(10000, 10 * r + want), "rank %d" % r)


if __name__ == "__main__":
    unittest.main()
