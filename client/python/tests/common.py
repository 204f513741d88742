"""Helpers shared by the tests."""

import contextlib
import json
import os
import unittest
import warnings

import reft
from fakeagent import FakeAgent

VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "conformance", "vectors.json")
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


def vectors():
    with open(VECTORS) as f:
        return json.load(f)


class AgentCase(unittest.TestCase):
    """A test with a fresh fake agent in self.agent."""

    agent_options = {}

    def setUp(self):
        self.agent = FakeAgent(**self.agent_options)
        self.addCleanup(self.agent.close)

    def session(self, **kw):
        kw.setdefault("socket_path", self.agent.path)
        kw.setdefault("rank", 0)
        kw.setdefault("world", 1)
        kw.setdefault("local_rank", 0)
        s = reft.Session(**kw)
        self.addCleanup(_close_quietly, s)
        return s

    def requests(self, name):
        return [p for t, p in self.agent.log if t == name]


def _close_quietly(s):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.suppress(reft.Error):
            s.close()


def pattern(n, seed):
    return bytearray((i * 7 + seed) & 0xFF for i in range(n))
