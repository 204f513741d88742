package msglog

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecodeRecord: a record file is read back by the job's next agent on
// the node from a directory the job's user can write. Any bytes decode to
// a valid record or fail with ErrBadRecord, never panic; a record that
// decodes encodes back to exactly its bytes (one encoding per record, so
// nothing is read that the writer could not have written).
func FuzzDecodeRecord(f *testing.F) {
	for _, r := range []Record{
		{Job: "7", Arena: 3, Rank: 1, Key: Key{Stream: "act>1", Step: 12, Seq: 0}, Size: 10000, CRC: 0xdeadbeef},
		{Job: "123456_78", Arena: 1 << 40, Rank: 1<<31 - 1, Key: Key{Stream: string(bytes.Repeat([]byte("s"), 64)), Step: 1 << 62, Seq: 1<<31 - 1}, Size: 1 << 40},
	} {
		b, err := EncodeRecord(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:RecordSize-1])
	}
	f.Add([]byte(recordMagic))
	f.Add(make([]byte, RecordSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRecord(b)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("error %v does not wrap ErrBadRecord", err)
			}
			return
		}
		if err := r.check(); err != nil {
			t.Fatalf("decoded an invalid record %+v: %v", r, err)
		}
		again, err := EncodeRecord(r)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("record %+v encodes to other bytes (%v)", r, err)
		}
	})
}
