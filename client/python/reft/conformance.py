"""Run the shared client conformance vectors (client/conformance/) with the
Python client.

    PYTHONPATH=client/python python3 -m reft.conformance \\
        --vectors client/conformance/vectors.json --agent-cmd "<shell command>"

frames and bad_frames run in process. Every scenario runs on a fresh agent:
the runner starts the shell command with REFT_CONFORMANCE_SCENARIO=<index>
and REFT_CONFORMANCE_AGENT=<the scenario's "agent", or empty> in its
environment; the command prints the socket path of an agent with an empty
store (in that arena layout) on its first stdout line and keeps running
until its stdin is closed. One line per case, "PASS <kind>: <name>" or "FAIL <kind>: <name>:
<why>"; the exit status is 0 iff every case passed (--no-scenarios runs
only the in-process cases).
"""

import argparse
import glob
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

from . import _wire as W
from ._errors import Error
from .layout import Layout
from .session import Session

AGENT_START_TIMEOUT = 60.0


class Failure(Exception):
    pass


def fill_bytes(size, seed):
    """The vectors' fill pattern for one buffer (seed is seed + k)."""
    c = (seed * 40503) & 0xFFFFFFFF
    return bytes((((i * 2654435761 + c) & 0xFFFFFFFF) >> 13) & 0xFF for i in range(size))


def check_frame(v):
    payload = v["payload_json"].encode("utf-8")
    want = bytes.fromhex(v["hex"])
    got = W.encode(v["type"], v["id"], payload)
    if got != want:
        raise Failure("encoded %s, want %s" % (got.hex(), v["hex"]))
    ftype, fid, obj = W.decode(want)
    expect = json.loads(v["payload_json"]) if v["payload_json"] else {}
    if (ftype, fid, obj) != (v["type"], v["id"], expect):
        raise Failure("decoded type %d id %d payload %r, want %d %d %r"
                      % (ftype, fid, obj, v["type"], v["id"], expect))


def check_bad_frame(v):
    try:
        got = W.decode(bytes.fromhex(v["hex"]))
    except W.FrameError as e:
        if e.kind != v["error"]:
            raise Failure("rejected as %s (%s), want %s" % (e.kind, e, v["error"])) from None
        return
    raise Failure("decoded %r, want a %s error" % (got, v["error"]))


class _Agent:
    """One run of --agent-cmd."""

    def __init__(self, cmd, index, agent=None):
        env = dict(os.environ, REFT_CONFORMANCE_SCENARIO=str(index),
                   REFT_CONFORMANCE_AGENT=agent or "")
        # Own session, so the whole command (shell and children) is stopped
        # by its process group id if it does not exit on its own.
        self.proc = subprocess.Popen(cmd, shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, start_new_session=True)
        self.path = self._first_line()
        # Drain the rest of stdout so the command never blocks on a full pipe.
        self._drain = threading.Thread(target=self.proc.stdout.read, daemon=True)
        self._drain.start()

    def _first_line(self):
        fd, buf, deadline = self.proc.stdout.fileno(), b"", time.monotonic() + AGENT_START_TIMEOUT
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.stop()
                raise Failure("--agent-cmd printed no socket path within %.0f s" % AGENT_START_TIMEOUT)
            chunk = os.read(fd, 4096)
            if not chunk:
                self.stop()
                raise Failure("--agent-cmd exited (status %s) before printing a socket path"
                              % self.proc.poll())
            buf += chunk
        path = buf.split(b"\n", 1)[0].decode().strip()
        if not path:
            self.stop()
            raise Failure("--agent-cmd printed an empty first line")
        return path

    def stop(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        drain = getattr(self, "_drain", None)
        if drain is not None:
            drain.join(5)
        if drain is None or not drain.is_alive():
            self.proc.stdout.close()


class _Scenario:
    def __init__(self, sc, socket_path):
        self.sc = sc
        self.path = socket_path
        self.rank = sc.get("rank", 0)
        self.world = sc.get("world", 1)
        self.chunk = sc.get("chunk_size")
        self.bufs = []  # (name, bytearray, replicated)
        self.handle = None
        self.session = self._open()

    def _open(self):
        kw = {} if self.chunk is None else {"chunk_size": self.chunk}
        # One process plays one rank; with world > 1 it agrees with itself.
        agree = (lambda steps: steps) if self.world > 1 else None
        return Session(layout=Layout(dp=self.world), socket_path=self.path, agree=agree,
                       rank=self.rank, world=self.world, local_rank=0, **kw)

    def run(self):
        try:
            for i, op in enumerate(self.sc["ops"]):
                try:
                    self.op(op)
                except Failure as e:
                    raise Failure("op %d (%s): %s" % (i, op["op"], e)) from None
        finally:
            try:
                self.session.close()
            except Error:
                pass

    def op(self, op):
        want_err = op.get("error")
        sent = self.session._conn.requests
        try:
            result = getattr(self, "op_" + op["op"])(op)
        except Error as e:
            if want_err is None:
                raise Failure("unexpected error: %s" % e) from None
            if want_err == "client":
                if e.code is not None:
                    raise Failure("want a client-side refusal, got agent error %s" % e) from None
                if self.session._conn.requests != sent:
                    raise Failure("the client refused (%s) but only after asking the agent" % e) from None
            elif e.code != want_err:
                raise Failure("want agent error %s, got %s" % (want_err, e)) from None
            return
        if want_err is not None:
            raise Failure("want error %s, the op succeeded (%r)" % (want_err, result))
        if "expect" in op and result != op["expect"]:
            raise Failure("got %r, want %r" % (result, op["expect"]))

    def op_register(self, op):
        buf = bytearray(op["size"])
        self.session.register(op["name"], buf, op.get("replicated", True))
        self.bufs.append((op["name"], buf, op.get("replicated", True)))

    def op_fill(self, op):
        for k, (_, buf, _) in enumerate(self.bufs):
            buf[:] = fill_bytes(len(buf), op["seed"] + k)

    def op_check(self, op):
        for k, (name, buf, _) in enumerate(self.bufs):
            want = fill_bytes(len(buf), op["seed"] + k)
            if buf != want:
                first = next(i for i in range(len(buf)) if buf[i] != want[i])
                raise Failure("buffer %s differs from fill(%d) first at byte %d"
                              % (name, op["seed"] + k, first))

    def op_save(self, op):
        self.handle = self.session.save(op["step"])

    def op_wait(self, op):
        if self.handle is None:
            raise Failure("wait with no save")
        if not self.handle.wait(timeout=120):
            raise Failure("the save did not finish within 120 s")

    def op_generations(self, op):
        return self.session.generations()

    def op_restore(self, op):
        return self.session.restore()

    def op_restore_step(self, op):
        return self.session.restore(step=op["step"])

    def op_reconnect(self, op):
        self.session.close()
        specs = op.get("buffers") or [{"name": n, "size": len(b), "replicated": r} for n, b, r in self.bufs]
        self.bufs, self.handle = [], None
        self.session = self._open()
        for b in specs:
            self.op_register(b)

    def op_corrupt(self, op):
        store = self.session.status().get("store_dir")
        if not store:
            raise Failure("the agent's status reply has no store_dir")
        pattern = os.path.join(store, "r%d" % self.rank, "state", "g%d-*" % op["step"], "MANIFEST")
        found = glob.glob(pattern)
        if len(found) != 1:
            raise Failure("want one manifest at %s, found %d" % (pattern, len(found)))
        with open(found[0]) as f:
            man = json.load(f)
        # The byte's region (a manifest without regions: its buffer, whole).
        regions = man.get("regions")
        if regions is None and man.get("sources") is None:
            regions = [{"buffer": b["name"], "offset": 0, "size": b["size"], "arena_offset": b["offset"]}
                       for b in man["buffers"]]
        at = next((r["arena_offset"] + op["offset"] - r["offset"] for r in regions or []
                   if r["buffer"] == op["buffer"] and 0 <= op["offset"] - r["offset"] < r["size"]), None)
        if at is None:
            raise Failure("manifest %s has no region of buffer %s with byte %d"
                          % (found[0], op["buffer"], op["offset"]))
        arena = os.path.join(os.path.dirname(os.path.dirname(found[0])), man["arena"])
        with open(arena, "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0xFF]))


def run(vectors, agent_cmd, scenarios=True, out=sys.stdout):
    """Run every case; return the number of failures."""
    failures = 0

    def report(kind, name, err):
        nonlocal failures
        if err is None:
            print("PASS %s: %s" % (kind, name), file=out, flush=True)
        else:
            failures += 1
            print("FAIL %s: %s: %s" % (kind, name, err), file=out, flush=True)

    for v in vectors.get("frames", []):
        report("frame", v["name"], _attempt(check_frame, v))
    for v in vectors.get("bad_frames", []):
        report("bad_frame", v["name"], _attempt(check_bad_frame, v))
    if not scenarios:
        return failures
    for i, sc in enumerate(vectors.get("scenarios", [])):
        def one(sc=sc, i=i):
            agent = _Agent(agent_cmd, i, sc.get("agent"))
            try:
                _Scenario(sc, agent.path).run()
            finally:
                agent.stop()
        report("scenario", sc["name"], _attempt(one))
    return failures


def _attempt(fn, *args):
    try:
        fn(*args)
    except Failure as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a crash is a failure of that case
        return "%s: %s" % (type(e).__name__, e)
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m reft.conformance", description=__doc__.split("\n\n")[0])
    ap.add_argument("--vectors", required=True, help="client/conformance/vectors.json")
    ap.add_argument("--agent-cmd", help="shell command that starts a fresh agent and prints its socket path")
    ap.add_argument("--no-scenarios", action="store_true", help="run only frames and bad_frames")
    a = ap.parse_args(argv)
    if not a.agent_cmd and not a.no_scenarios:
        ap.error("--agent-cmd is required to run the scenarios (or pass --no-scenarios)")
    with open(a.vectors) as f:
        vectors = json.load(f)
    failures = run(vectors, a.agent_cmd, scenarios=not a.no_scenarios)
    print("reft.conformance: %d case(s) failed" % failures, file=sys.stderr, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
