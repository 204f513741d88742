import json
import unittest

from reft import _wire as W
from common import vectors


class FrameVectors(unittest.TestCase):
    def test_frames_encode_and_decode(self):
        for v in vectors()["frames"]:
            with self.subTest(v["name"]):
                want = bytes.fromhex(v["hex"])
                self.assertEqual(W.encode(v["type"], v["id"], v["payload_json"].encode()), want)
                ftype, fid, obj = W.decode(want)
                self.assertEqual((ftype, fid), (v["type"], v["id"]))
                self.assertEqual(obj, json.loads(v["payload_json"]) if v["payload_json"] else {})

    def test_bad_frames(self):
        for v in vectors()["bad_frames"]:
            with self.subTest(v["name"]):
                with self.assertRaises(W.FrameError) as cm:
                    W.decode(bytes.fromhex(v["hex"]))
                self.assertEqual(cm.exception.kind, v["error"], str(cm.exception))

    def test_message_encoding_is_compact_json_in_field_order(self):
        reg = next(v for v in vectors()["frames"] if v["name"] == "register request")
        obj = json.loads(reg["payload_json"])  # dicts keep the file's key order
        self.assertEqual(W.encode_msg(reg["type"], reg["id"], obj).hex(), reg["hex"])
        self.assertEqual(W.encode_msg(W.T_GENERATIONS, 7), bytes.fromhex("000000080107000000000007"))

    def test_too_large_detected_from_the_length_alone(self):
        calls = []

        def read(n):
            calls.append(n)
            return bytes.fromhex("00100009")[:n] if len(calls) == 1 else b""

        with self.assertRaises(W.FrameError) as cm:
            W.read_frame(read)
        self.assertEqual(cm.exception.kind, "too_large")
        self.assertEqual(calls, [4])

    def test_clean_end_of_stream(self):
        with self.assertRaises(W.FrameError) as cm:
            W.decode(b"")
        self.assertEqual(cm.exception.kind, "eof")

    def test_encoder_refuses_oversized_payload(self):
        import reft
        with self.assertRaises(reft.Error):
            W.encode(W.T_HELLO, 1, b" " * (W.MAX_PAYLOAD + 1))
        self.assertEqual(len(W.encode(W.T_HELLO, 1, b" " * W.MAX_PAYLOAD)), W.MAX_PAYLOAD + 12)

    def test_type_names(self):
        self.assertEqual(W.type_name(W.T_SAVE), "save")
        self.assertEqual(W.type_name(W.T_SAVE | W.REPLY_BIT), "save-reply")
        self.assertEqual(W.type_name(W.T_ERROR), "error")
        self.assertEqual(W.type_name(0x42), "type-0x42")


if __name__ == "__main__":
    unittest.main()
