"""reft.torch with a real torch.compile'd module (torch 2.x): its parameters
are named "_orig_mod.<name>"; the Checkpointer names them without it, so a
compiled model and the plain one share snapshots, and a compiled trainer
(dropout, LR scheduler, shuffled sampler, RNG) resumes bit-identical.

backend="aot_eager": dynamo's graph capture and AOT autograd, without
inductor's code generation. Inductor's CPU backend compiles C++ and the
torch 2 lane's root has no C++ compiler: the default backend fails there
with "InvalidCxxCompiler: No working C++ compiler found in
torch._inductor.config.cpp.cxx: (None, 'g++')". The names and the
snapshot path do not depend on the backend (the wrapper is the same
OptimizedModule); the GPU script (tests/gpu) runs the default one.

    cd client/python && python3 -m unittest discover -s tests_torch2 -v
"""

import os
import random
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import test_torch  # noqa: E402
import test_torch_resume  # noqa: E402
from test_torch import TorchCase, raw, torch  # noqa: E402
from test_torch_resume import fingerprint, run, trainer  # noqa: E402

BACKEND = "aot_eager"


def setUpModule():
    test_torch.setUpModule()


def tearDownModule():
    test_torch.tearDownModule()


def compiled_trainer(seed):
    model, opt, sched, sampler = trainer(seed)
    return torch.compile(model, backend=BACKEND), opt, sched, sampler


class TestCompiled(TorchCase):
    def setUp(self):
        torch._dynamo.reset()

    def test_names_drop_orig_mod(self):
        model, opt, sched, sampler = compiled_trainer(1)
        self.assertIsInstance(model, torch._dynamo.eval_frame.OptimizedModule)
        names = [n for n, _ in model.named_parameters()]
        self.assertTrue(names and all(n.startswith("_orig_mod.") for n in names), names)
        ck = self.checkpointer(model, opt, self.agent(), jit=False)
        got = sorted(b.name for b in ck.session._buffers if b.name.startswith(("param/", "optim/")))
        self.assertEqual(len(got), 4 + 4 * 3, got)  # 4 parameters, AdamW's 3 tensors each
        self.assertFalse([n for n in got if "_orig_mod" in n], got)
        self.assertIn("param/0:0.weight", got)

    def test_compiled_and_plain_share_snapshots(self):
        agent = self.agent()
        model, opt, sched, sampler = compiled_trainer(1)
        ck = self.checkpointer(model, opt, agent, jit=False, extra={"sched": sched, "sampler": sampler})
        run(model, opt, sched, sampler, range(1, 4), ck)  # compiled forward and backward
        ck.wait()
        want = [raw(p) for p in model.parameters()] + [raw(v) for st in opt.state.values() for v in st.values()]
        ck.close()
        plain, opt2, sched2, sampler2 = trainer(2)
        ck2 = self.checkpointer(plain, opt2, agent, jit=False, extra={"sched": sched2, "sampler": sampler2})
        self.assertEqual(ck2.restore(), 3)
        got = [raw(p) for p in plain.parameters()] + [raw(v) for st in opt2.state.values() for v in st.values()]
        self.assertEqual(got, want)
        self.assertEqual(sched2.state_dict(), sched.state_dict())
        # ... and back: the plain model's snapshot into a compiled one.
        ck2.save(4).wait()
        ck2.close()
        model3, opt3, sched3, sampler3 = compiled_trainer(3)
        ck3 = self.checkpointer(model3, opt3, agent, jit=False, extra={"sched": sched3, "sampler": sampler3})
        self.assertEqual(ck3.restore(), 4)
        self.assertEqual([raw(p) for p in model3.parameters()], [raw(p) for p in plain.parameters()])

    def test_resumed_compiled_trainer_is_bit_identical(self):
        random.seed(7)
        torch.manual_seed(7)
        model, opt, sched, sampler = compiled_trainer(1)
        run(model, opt, sched, sampler, range(1, 9))
        want = fingerprint(model, opt, sched, sampler)

        torch._dynamo.reset()
        agent = self.agent()
        random.seed(7)
        torch.manual_seed(7)
        model, opt, sched, sampler = compiled_trainer(1)
        ck = self.checkpointer(model, opt, agent, jit=False, extra={"sched": sched, "sampler": sampler})
        run(model, opt, sched, sampler, range(1, 5), ck)
        ck.close()
        # A new process' trainer: other seeds everywhere, a fresh compile.
        torch._dynamo.reset()
        random.seed(99)
        torch.manual_seed(99)
        model, opt, sched, sampler = compiled_trainer(2)
        ck = self.checkpointer(model, opt, agent, jit=False, extra={"sched": sched, "sampler": sampler})
        self.assertEqual(ck.restore(), 4)
        run(model, opt, sched, sampler, range(5, 9), ck)
        ck.wait()
        self.assertEqual(fingerprint(model, opt, sched, sampler), want)


if __name__ == "__main__":
    unittest.main()
