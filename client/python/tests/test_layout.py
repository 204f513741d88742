import os
import unittest
from unittest import mock

import reft
from reft.layout import default_layout


class LayoutTest(unittest.TestCase):
    def test_string_form_round_trips(self):
        l = reft.Layout(dp=2, pp=3, tp=4)
        self.assertEqual(str(l), "dp=2,pp=3,tp=4,order=tp-dp-pp")
        self.assertEqual(reft.Layout.parse(str(l)), l)
        self.assertEqual(reft.Layout.parse("tp=2, order=dp-tp-pp"), reft.Layout(tp=2, order="dp-tp-pp"))

    def test_resolve_derives_dp(self):
        self.assertEqual(reft.Layout(tp=2, pp=2).resolve(16), reft.Layout(dp=4, pp=2, tp=2))
        self.assertEqual(reft.Layout().resolve(5), reft.Layout(dp=5, pp=1, tp=1))

    def test_resolve_checks_the_world(self):
        with self.assertRaisesRegex(reft.Error, r"dp=2 x pp=1 x tp=1 = 2 ranks, but the job has 4"):
            reft.Layout(dp=2).resolve(4)
        with self.assertRaisesRegex(reft.Error, "does not divide the 6 ranks"):
            reft.Layout(tp=4).resolve(6)

    def test_bad_values(self):
        for kw in ({"dp": 0}, {"tp": -1}, {"pp": 1.5}, {"dp": True}, {"order": "tp-dp"},
                   {"order": "tp-tp-pp"}):
            with self.subTest(kw), self.assertRaises(reft.Error):
                reft.Layout(**kw)
        for text in ("dp=x", "dq=2", "dp=2,dp=2", "dp", "dp=0"):
            with self.subTest(text), self.assertRaises(reft.Error):
                reft.Layout.parse(text)

    def test_coords_fastest_first(self):
        l = reft.Layout(dp=2, pp=2, tp=2)  # tp-dp-pp
        self.assertEqual(l.coords(0), {"tp": 0, "dp": 0, "pp": 0})
        self.assertEqual(l.coords(1), {"tp": 1, "dp": 0, "pp": 0})
        self.assertEqual(l.coords(2), {"tp": 0, "dp": 1, "pp": 0})
        self.assertEqual(l.coords(7), {"tp": 1, "dp": 1, "pp": 1})
        with self.assertRaises(reft.Error):
            reft.Layout(tp=2).coords(0)

    def test_from_spec(self):
        self.assertIsNone(reft.Layout.from_spec("arc"))
        self.assertIsNone(reft.Layout.from_spec(""))
        self.assertEqual(reft.Layout.from_spec("arc+aec,dp=4,tp=2,every=5,persist=30m"),
                         reft.Layout(dp=4, tp=2))
        with self.assertRaisesRegex(reft.Error, "REFT_SPEC=arc,tp=zero"):
            reft.Layout.from_spec("arc,tp=zero")

    def test_default_layout(self):
        with mock.patch.dict(os.environ, {"REFT_SPEC": "arc,tp=2"}):
            self.assertEqual(default_layout(None, 8), reft.Layout(dp=4, pp=1, tp=2))
        with mock.patch.dict(os.environ, {"REFT_SPEC": "arc,every=2"}):
            self.assertEqual(default_layout(None, 3), reft.Layout(dp=3, pp=1, tp=1))
        with mock.patch.dict(os.environ, {}, clear=True):
            self.assertEqual(default_layout(None, 2), reft.Layout(dp=2, pp=1, tp=1))
        self.assertEqual(default_layout("pp=2", 4), reft.Layout(dp=2, pp=2, tp=1))
        with self.assertRaises(reft.Error):
            default_layout(42, 1)


if __name__ == "__main__":
    unittest.main()
