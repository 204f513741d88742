"""A small stand-in for reft-agent, for the Python client's unit tests.

It speaks the frames and snapshot messages of docs/PROTOCOL.md over a real
Unix socket, with arena files in a temporary directory laid out like the
node-local store (r<rank>/state/arena-<n>, g<step>-<seq>/MANIFEST). It is
NOT the agent: it keeps everything in memory, checks chunks with zlib's
CRC-32 instead of CRC-32C, and exists only to test the client's behaviour
(and fault injection) where the real agent is not available. Conformance
against the real agent is tests/test_conformance_agent.py.

Run as a program it follows the --agent-cmd contract of reft.conformance:
prints the socket path on its first stdout line, serves until stdin closes.
"""

import json
import os
import socketserver
import sys
import tempfile
import threading
import time
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from reft import _wire as W  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
KEEP = 1  # completed generations kept besides the newest, like the agent's default


class AgentError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class _RankStore:
    def __init__(self, directory):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.gens = []  # dicts: step, seq, arena, bytes, crc, chunk, places; oldest first
        self.arena_size = None
        self.arenas = []  # arena file names
        self.pinned = {}  # arena name -> count (restored, not yet released)
        self.writing = set()


class FakeAgent:
    """Options for fault injection: protocol (hello's protocol number),
    forbid (refuse every connection), commit_delay (seconds),
    commit_error (code), id0_errors (answer errors with id 0), degraded
    (a function of the committed step: the commit reply's degraded
    reasons, a list, or None for none)."""

    def __init__(self, protocol=1, forbid=False, commit_delay=0.0, commit_error=None,
                 id0_errors=False, disabled=False, degraded=None):
        self.tmp = tempfile.TemporaryDirectory(prefix="reft-fake-agent-")
        self.store_dir = os.path.join(self.tmp.name, "store")
        self.path = os.path.join(self.tmp.name, "agent.sock")
        self.protocol, self.forbid, self.disabled = protocol, forbid, disabled
        self.commit_delay, self.commit_error, self.id0_errors = commit_delay, commit_error, id0_errors
        self.degraded = degraded
        self.lock = threading.Lock()
        self.seq = 0
        self.ranks = {}
        self.log = []  # (type name, payload) of every request, for assertions
        self.commits = []  # (step, time)
        self.conns = set()
        agent = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                agent._serve(self.request)

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(self.path, Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self):
        """Stop, dropping open connections (as an agent that exits)."""
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(2)
                except OSError:
                    pass
        self.server.shutdown()
        self.server.server_close()
        self.tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- connection ------------------------------------------------------

    def _serve(self, sock):
        with self.lock:
            self.conns.add(sock)
        rfile = sock.makefile("rb")
        if self.forbid:
            sock.sendall(W.encode_msg(W.T_ERROR, 0, {"code": "forbidden", "message": "uid 1 may not use this agent"}))
            return
        conn = {"rank": None, "open": None, "restored": {}}
        try:
            while True:
                try:
                    ftype, fid, payload = W.read_frame(rfile.read)
                except W.FrameError as e:
                    if e.kind == "eof":
                        return
                    sock.sendall(W.encode_msg(W.T_ERROR, 0, {"code": "malformed", "message": str(e)}))
                    if e.kind in ("length", "too_large", "truncated"):
                        return
                    continue
                with self.lock:
                    self.log.append((W.type_name(ftype), payload))
                if ftype == W.T_COMM:
                    continue  # a notice: never answered
                try:
                    reply = self._handle(conn, ftype, payload)
                    sock.sendall(W.encode_msg(ftype | W.REPLY_BIT, fid, reply))
                except AgentError as e:
                    sock.sendall(W.encode_msg(W.T_ERROR, 0 if self.id0_errors else fid,
                                              {"code": e.code, "message": str(e)}))
        except OSError:
            return
        finally:
            with self.lock:
                self.conns.discard(sock)
                if conn["open"] is not None:  # the open save is aborted
                    st = self.ranks[conn["rank"]]
                    st.writing.discard(conn["open"]["arena"])
                for arena, n in conn["restored"].values():
                    self.ranks[conn["rank"]].pinned[arena] -= n

    def _handle(self, conn, ftype, p):
        if ftype == W.T_HELLO:
            return {"protocol": self.protocol, "job": "42", "node": "fake", "spec": "arc",
                    "agent_version": "fake", "restart": 0}
        if ftype == W.T_STATUS:
            return {"job": "42", "node": "fake", "spec": "arc", "agent_version": "fake",
                    "pid": os.getpid(), "store_dir": self.store_dir, "bad_frames": 0}
        if ftype == W.T_COMMIT and self.commit_delay:
            time.sleep(self.commit_delay)
        with self.lock:
            if ftype == W.T_REGISTER:
                return self._register(conn, p)
            if ftype in (W.T_SAVE, W.T_COMMIT, W.T_ABORT, W.T_GENERATIONS, W.T_RESTORE, W.T_RELEASE):
                if conn["rank"] is None:
                    raise AgentError("bad_state", "%s before register" % W.type_name(ftype))
                return getattr(self, "_" + W.type_name(ftype))(conn, self.ranks[conn["rank"]], p)
        raise AgentError("unknown_type", "unknown message type 0x%02x" % ftype)

    def _register(self, conn, p):
        if self.disabled:
            raise AgentError("disabled", "the agent has no snapshot store (SPEC off)")
        if conn["rank"] is not None:
            raise AgentError("bad_state", "a second register")
        rank, bufs = p.get("rank"), p.get("buffers")
        if not isinstance(rank, int) or rank < 0:
            raise AgentError("invalid", "rank %r" % rank)
        places, off, seen = [], 0, set()
        for b in bufs or []:
            if not b.get("name") or b["name"] in seen or b.get("size", -1) < 0:
                raise AgentError("invalid", "buffer %r" % b)
            seen.add(b["name"])
            places.append({"name": b["name"], "offset": off, "size": b["size"],
                           "replicated": bool(b.get("replicated"))})
            off += -(-b["size"] // PAGE) * PAGE
        st = self.ranks.get(rank) or _RankStore(os.path.join(self.store_dir, "r%d" % rank, "state"))
        self.ranks[rank] = st
        conn.update(rank=rank, places=places, arena_size=max(off, PAGE),
                    chunk=p.get("chunk_size") or (4 << 20))
        return {"rank": rank, "chunk_size": conn["chunk"], "arena_size": conn["arena_size"],
                "buffers": places}

    def _free_arena(self, st, size):
        used = {g["arena"] for g in st.gens} | st.writing | {a for a, n in st.pinned.items() if n}
        for name in st.arenas:
            if name not in used and os.path.getsize(os.path.join(st.dir, name)) == size:
                return name
        name = "arena-%d" % len(st.arenas)
        with open(os.path.join(st.dir, name), "wb") as f:
            f.truncate(size)
        st.arenas.append(name)
        return name

    def _save(self, conn, st, p):
        step = p.get("step")
        if not isinstance(step, int) or step < 0:
            raise AgentError("invalid", "step %r" % step)
        if conn["open"] is not None:
            raise AgentError("bad_state", "save while a save is open")
        arena = self._free_arena(st, conn["arena_size"])
        st.writing.add(arena)
        conn["open"] = {"step": step, "arena": arena}
        return {"step": step, "arena": os.path.join(st.dir, arena),
                "arena_size": conn["arena_size"], "buffers": conn["places"]}

    def _commit(self, conn, st, p):
        o = conn["open"]
        if o is None or o["step"] != p.get("step"):
            raise AgentError("bad_state", "commit of step %r with no such open save" % p.get("step"))
        if self.commit_error:
            raise AgentError(self.commit_error, "injected commit failure")
        conn["open"] = None
        st.writing.discard(o["arena"])
        with open(os.path.join(st.dir, o["arena"]), "rb") as f:
            data = f.read()
        crc = [[zlib.crc32(data[b["offset"] + i:b["offset"] + min(i + conn["chunk"], b["size"])])
                for i in range(0, b["size"], conn["chunk"])] for b in conn["places"]]
        self.seq += 1
        g = {"step": o["step"], "seq": self.seq, "arena": o["arena"], "crc": crc,
             "bytes": sum(b["size"] for b in conn["places"]), "chunk": conn["chunk"],
             "places": conn["places"], "arena_size": conn["arena_size"]}
        gdir = os.path.join(st.dir, "g%d-%d" % (g["step"], g["seq"]))
        os.makedirs(gdir)
        with open(os.path.join(gdir, "MANIFEST"), "w") as f:
            json.dump({"format": 1, "step": g["step"], "seq": g["seq"], "arena": g["arena"],
                       "arena_size": g["arena_size"], "chunk_size": g["chunk"],
                       "buffers": [dict(b, crc32c=c) for b, c in zip(g["places"], crc)]}, f)
        # The new step supersedes older generations of the same or a later
        # step (an abandoned timeline), then retention keeps KEEP older.
        st.gens = [x for x in st.gens if x["step"] < g["step"]] + [g]
        st.gens = st.gens[-(KEEP + 1):]
        self.commits.append((g["step"], time.monotonic()))
        reply = {"step": g["step"], "seq": g["seq"], "bytes": g["bytes"], "checksum_s": 0.0}
        why = self.degraded(g["step"]) if self.degraded else None
        if why:
            reply["degraded"] = why
        return reply

    def _abort(self, conn, st, p):
        o = conn["open"]
        if o is None or o["step"] != p.get("step"):
            raise AgentError("bad_state", "abort of step %r with no such open save" % p.get("step"))
        conn["open"] = None
        st.writing.discard(o["arena"])
        return {"step": o["step"]}

    def _generations(self, conn, st, p):
        return {"rank": conn["rank"], "generations": [
            {"step": g["step"], "seq": g["seq"], "bytes": g["bytes"], "source": "memory"}
            for g in reversed(st.gens)] or None}

    def _restore(self, conn, st, p):
        step = p.get("step", -1)
        cands = [g for g in reversed(st.gens) if step in (-1, g["step"])]
        if not cands:
            raise AgentError("not_found", "rank %d has no generation of step %s" % (conn["rank"], step))
        g = cands[0]
        for mine, theirs in zip(conn["places"], g["places"]):
            if (mine["name"], mine["size"]) != (theirs["name"], theirs["size"]):
                raise AgentError("mismatch", "buffer %s: registered %d bytes, generation has %d"
                                 % (mine["name"], mine["size"], theirs["size"]))
        if len(conn["places"]) != len(g["places"]):
            raise AgentError("mismatch", "buffer count differs")
        with open(os.path.join(st.dir, g["arena"]), "rb") as f:
            data = f.read()
        for b, crcs in zip(g["places"], g["crc"]):
            for k, i in enumerate(range(0, b["size"], g["chunk"])):
                if zlib.crc32(data[b["offset"] + i:b["offset"] + min(i + g["chunk"], b["size"])]) != crcs[k]:
                    st.gens.remove(g)
                    raise AgentError("corrupt", "step %d buffer %s chunk %d failed its checksum"
                                     % (g["step"], b["name"], k))
        st.pinned[g["arena"]] = st.pinned.get(g["arena"], 0) + 1
        arena, n = conn["restored"].get(g["step"], (g["arena"], 0))
        conn["restored"][g["step"]] = (arena, n + 1)
        return {"step": g["step"], "seq": g["seq"], "arena": os.path.join(st.dir, g["arena"]),
                "arena_size": g["arena_size"], "buffers": g["places"]}

    def _release(self, conn, st, p):
        step = p.get("step")
        if step not in conn["restored"]:
            raise AgentError("bad_state", "release of step %r, not restored" % step)
        arena, n = conn["restored"].pop(step)
        st.pinned[arena] -= n
        return {"step": step}


def main():
    agent = FakeAgent()
    print(agent.path, flush=True)
    sys.stdin.read()  # until the runner closes our stdin
    agent.close()


if __name__ == "__main__":
    main()
