"""Arenas are registered with the CUDA runtime through torch (monkeypatched
here: this machine has no GPU) only when the process already uses CUDA."""

import sys
import types
import unittest
from unittest import mock

from common import AgentCase, pattern


class FakeCudart:
    """torch.cuda.cudart() stand-in: records calls, refuses on demand."""

    def __init__(self, refuse=0):
        self.registered = {}  # address -> size
        self.calls = []
        self.refuse = refuse

    def cudaHostRegister(self, ptr, size, flags):
        self.calls.append(("register", ptr, size, flags))
        if self.refuse:
            return self.refuse
        if ptr in self.registered:
            return 712  # already registered
        self.registered[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr):
        self.calls.append(("unregister", ptr))
        return 0 if self.registered.pop(ptr, None) is not None else 713


def fake_torch(cudart, available=True, initialized=True):
    state = {"initialized": initialized}
    cuda = types.SimpleNamespace(is_available=lambda: available, is_initialized=lambda: state["initialized"],
                                 cudart=lambda: cudart)
    return types.SimpleNamespace(cuda=cuda), state


class CudaRegistration(AgentCase):
    def run_session(self, torch, state=None, steps=6):
        logs = []
        with mock.patch.dict(sys.modules, {"torch": torch} if torch else {}):
            if torch is None:
                sys.modules.pop("torch", None)
            s = self.session()
            s._log = logs.append
            buf = pattern(10000, 1)
            s.register("w", buf)
            for step in range(steps):
                if step == 1 and state is not None:
                    state["initialized"] = True  # the trainer starts using its GPU
                s.save(step).wait()
            buf[:] = bytes(len(buf))
            self.assertEqual(s.restore(), steps - 1)
            self.assertEqual(buf, pattern(10000, 1))
            before = dict(getattr(torch.cuda.cudart(), "registered", {})) if torch else {}
            s.close()
        return before, logs

    def test_registers_each_arena_once_and_unregisters_at_close(self):
        rt = FakeCudart()
        torch, _ = fake_torch(rt)
        before, logs = self.run_session(torch)
        # The fake agent cycles through three arena files: each registered once.
        self.assertEqual(len(before), 3, rt.calls)
        self.assertEqual(len([c for c in rt.calls if c[0] == "register"]), 3, rt.calls)
        self.assertTrue(all(c[3] == 1 for c in rt.calls if c[0] == "register"))  # portable
        self.assertEqual(rt.registered, {}, "close must unregister every arena")
        self.assertEqual(sorted(c[1] for c in rt.calls if c[0] == "unregister"), sorted(before))
        self.assertEqual(logs, [])

    def test_cuda_initialized_after_the_first_save(self):
        rt = FakeCudart()
        torch, state = fake_torch(rt, initialized=False)
        before, _ = self.run_session(torch, state)
        self.assertEqual(len(before), 3, rt.calls)  # the first arena at its next use
        self.assertEqual(rt.registered, {})

    def test_no_cuda_is_a_no_op(self):
        for name, torch in (("no torch imported", None),
                            ("no GPU", fake_torch(FakeCudart(), available=False)[0]),
                            ("CUDA never initialized", fake_torch(FakeCudart(), initialized=False)[0])):
            with self.subTest(name):
                before, logs = self.run_session(torch)
                self.assertEqual(before, {})
                if torch is not None:
                    self.assertEqual(torch.cuda.cudart().calls, [])
                self.assertEqual(logs, [])

    def test_refusal_is_said_once(self):
        rt = FakeCudart(refuse=2)
        torch, _ = fake_torch(rt)
        before, logs = self.run_session(torch)
        self.assertEqual(before, {})
        self.assertEqual(len([c for c in rt.calls if c[0] == "register"]), 3)  # each arena tried once
        self.assertEqual(len(logs), 1, logs)
        self.assertIn("refused to register snapshot arena", logs[0])
        self.assertIn("(2)", logs[0])


if __name__ == "__main__":
    unittest.main()
