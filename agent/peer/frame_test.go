package peer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"github.com/reft-hpc/reft/internal/crc32c"
	"io"
	"math"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		typ     Type
		id      uint32
		arg     uint64
		payload []byte
	}{
		{"empty ping", TPing, 0, 0, nil},
		{"hello", THello, 0, 0, []byte(`{"protocol":1,"job":"77"}`)},
		{"credit with a large arg", TCredit, 7, 1 << 40, nil},
		{"chunk", TChunk, 0xffffffff, 12345, bytes.Repeat([]byte{0xab}, 70000)},
		{"error", TError, 3, 0, []byte(`{"code":"busy","message":"x"}`)},
		{"unknown type still framed", Type(0x42), 9, 1, []byte("{}")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := AppendFrame(nil, tc.typ, tc.id, tc.arg, tc.payload)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != HeaderSize+len(tc.payload) {
				t.Fatalf("encoded %d bytes, want %d", len(b), HeaderSize+len(tc.payload))
			}
			f, err := Decode(bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			if f.Type != tc.typ || f.ID != tc.id || f.Arg != tc.arg || !bytes.Equal(f.Payload, tc.payload) || f.Version != Version {
				t.Fatalf("decoded %+v", f.Header)
			}
		})
	}
}

func TestFrameRejects(t *testing.T) {
	good, _ := AppendFrame(nil, THello, 1, 0, []byte(`{}`))
	// mod edits a copy of good; reseal recomputes the header CRC so that
	// the check under test is the one that fires.
	mod := func(f func(b []byte), reseal bool) []byte {
		b := bytes.Clone(good)
		f(b)
		if reseal {
			binary.BigEndian.PutUint32(b[28:32], crc32c.Checksum(b[:28]))
		}
		return b
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty stream", nil, io.EOF},
		{"short header", good[:20], io.ErrUnexpectedEOF},
		{"short payload", good[:len(good)-1], io.ErrUnexpectedEOF},
		{"bad magic", mod(func(b []byte) { b[0] = 'X' }, true), ErrMagic},
		{"http request", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n......"), ErrMagic},
		{"header bit flip", mod(func(b []byte) { b[9] ^= 1 }, false), ErrHeaderCRC},
		{"version 2", mod(func(b []byte) { b[4] = 2 }, true), ErrVersion},
		{"reserved flags", mod(func(b []byte) { b[7] = 1 }, true), ErrFlags},
		{"control payload over 1 MiB", mod(func(b []byte) { binary.BigEndian.PutUint32(b[12:16], MaxControl+1) }, true), ErrTooLarge},
		{"chunk over max payload", mod(func(b []byte) {
			b[5] = byte(TChunk)
			binary.BigEndian.PutUint32(b[12:16], MaxPayload+1)
		}, true), ErrTooLarge},
		{"length 4 GiB", mod(func(b []byte) { binary.BigEndian.PutUint32(b[12:16], 0xffffffff) }, true), ErrTooLarge},
		{"payload bit flip", mod(func(b []byte) { b[HeaderSize] ^= 1 }, false), ErrPayload},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(bytes.NewReader(tc.in))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Decode: %v, want %v", err, tc.want)
			}
		})
	}
}

func TestAppendFrameTooLarge(t *testing.T) {
	if _, err := AppendFrame(nil, TWatermarksReply, 1, 0, make([]byte, MaxControl+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("control payload over the limit: %v", err)
	}
}

// FuzzDecode: the decoder never panics or over-allocates on any input,
// and whatever it accepts re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, seed := range []struct {
		t Type
		p []byte
	}{
		{THello, []byte(`{"protocol":1,"job":"1","method":"munge","nonce":"AAAA"}`)},
		{TChunk, bytes.Repeat([]byte{1, 2, 3}, 100)},
		{TCredit, nil},
		{TError, []byte(`{"code":"not_found","message":"m","chunk":3}`)},
	} {
		b, _ := AppendFrame(nil, seed.t, 5, 77, seed.p)
		f.Add(b)
	}
	f.Add([]byte("RFTP"))
	f.Add(make([]byte, HeaderSize))
	f.Fuzz(func(t *testing.T, in []byte) {
		fr, err := Decode(bytes.NewReader(in))
		if err != nil {
			return
		}
		if int(fr.Length) != len(fr.Payload) || fr.Length > maxLength(fr.Type) {
			t.Fatalf("accepted length %d with %d payload bytes", fr.Length, len(fr.Payload))
		}
		out, err := AppendFrame(nil, fr.Type, fr.ID, fr.Arg, fr.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, in[:len(out)]) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", in[:len(out)], out)
		}
	})
}

func TestTypeNames(t *testing.T) {
	for _, typ := range []Type{THello, TAuth, TPing, TWatermarks, TManifest, TFetch, TCredit, TCancel,
		TChallenge, TAuthReply, TWatermarksReply, TManifestReply, TChunk, TError, TStatus, TStatusReply} {
		if !typ.known() {
			t.Errorf("type 0x%02x (%s) is not known", uint8(typ), typ)
		}
	}
	if Type(0x42).known() {
		t.Error("0x42 is known")
	}
}

// TestNumChunksNoOverflow: a peer's buffer size near the int64 limit
// gives the right chunk count, not a wrapped one (issue 14, finding 7).
func TestNumChunksNoOverflow(t *testing.T) {
	for _, tc := range []struct{ n, cs, want int64 }{
		{0, 4096, 0}, {1, 4096, 1}, {4096, 4096, 1}, {4097, 4096, 2},
		{math.MaxInt64, MaxPayload, math.MaxInt64/MaxPayload + 1},
	} {
		if got := numChunks(tc.n, tc.cs); got != tc.want {
			t.Errorf("numChunks(%d, %d) = %d, want %d", tc.n, tc.cs, got, tc.want)
		}
	}
}
