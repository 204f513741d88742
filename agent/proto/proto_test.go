package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

func frame(ver, typ uint8, flags uint16, id uint32, payload string) []byte {
	b := make([]byte, HeaderSize, HeaderSize+len(payload))
	binary.BigEndian.PutUint32(b, uint32(HeaderSize-4+len(payload)))
	b[4], b[5] = ver, typ
	binary.BigEndian.PutUint16(b[6:], flags)
	binary.BigEndian.PutUint32(b[8:], id)
	return append(b, payload...)
}

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteMsg(&buf, THello, 7, Hello{Client: "test", PID: 12}); err != nil {
		t.Fatal(err)
	}
	if err := Write(&buf, Frame{Type: TStatus, ID: 8}); err != nil {
		t.Fatal(err)
	}
	f, err := Decode(&buf)
	if err != nil || f.Type != THello || f.ID != 7 || f.Version != Version {
		t.Fatalf("first frame %+v, %v", f, err)
	}
	var h Hello
	if err := f.Unmarshal(&h); err != nil || h.Client != "test" || h.PID != 12 {
		t.Fatalf("hello payload %+v, %v", h, err)
	}
	f, err = Decode(&buf)
	if err != nil || f.Type != TStatus || f.ID != 8 || len(f.Payload) != 0 {
		t.Fatalf("second frame %+v, %v", f, err)
	}
	if _, err := Decode(&buf); err != io.EOF {
		t.Fatalf("at end: %v, want io.EOF", err)
	}
}

func TestDecodeErrors(t *testing.T) {
	huge := make([]byte, 4)
	binary.BigEndian.PutUint32(huge, MaxPayload+HeaderSize)
	tests := []struct {
		name  string
		in    []byte
		want  error
		fatal bool
		id    uint32
	}{
		{"empty", nil, io.EOF, true, 0},
		{"short length", []byte{0, 0}, io.ErrUnexpectedEOF, true, 0},
		{"length below header", []byte{0, 0, 0, 3, 1, 1, 0}, ErrLength, true, 0},
		{"too large", huge, ErrTooLarge, true, 0},
		{"truncated header", frame(1, 1, 0, 5, "")[:9], io.ErrUnexpectedEOF, true, 0},
		{"truncated payload", frame(1, 1, 0, 5, `{"a":1}`)[:14], io.ErrUnexpectedEOF, true, 5},
		{"version 0", frame(0, 1, 0, 5, ""), ErrVersion, false, 5},
		{"version 2", frame(2, 1, 0, 6, "{}"), ErrVersion, false, 6},
		{"flags", frame(1, 1, 1, 7, ""), ErrFlags, false, 7},
		{"not json", frame(1, 1, 0, 8, "hello"), ErrPayload, false, 8},
		{"json array", frame(1, 1, 0, 9, "[1]"), ErrPayload, false, 9},
		{"json null", frame(1, 1, 0, 10, "null"), ErrPayload, false, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Decode(bytes.NewReader(tt.in))
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if Fatal(err) != tt.fatal {
				t.Errorf("Fatal(%v) = %v, want %v", err, Fatal(err), tt.fatal)
			}
			if f.ID != tt.id {
				t.Errorf("ID = %d, want %d (for the error reply)", f.ID, tt.id)
			}
		})
	}
}

func TestNonFatalErrorKeepsStreamInSync(t *testing.T) {
	in := append(frame(1, 1, 0, 1, "garbage"), frame(1, 2, 0, 2, "{}")...)
	r := bytes.NewReader(in)
	if _, err := Decode(r); !errors.Is(err, ErrPayload) {
		t.Fatalf("first: %v", err)
	}
	f, err := Decode(r)
	if err != nil || f.Type != TStatus || f.ID != 2 {
		t.Fatalf("second frame after a bad one: %+v, %v", f, err)
	}
}

func TestCall(t *testing.T) {
	tests := []struct {
		name  string
		reply []byte
		want  string
	}{
		{"ok", frame(1, byte(THelloReply), 0, 3, `{"job":"9","node":"n1"}`), ""},
		{"error reply", frame(1, byte(TError), 0, 3, `{"code":"forbidden","message":"no"}`), "agent error forbidden: no"},
		{"wrong id", frame(1, byte(THelloReply), 0, 4, `{}`), "does not match"},
		{"wrong type", frame(1, byte(TStatusReply), 0, 3, `{}`), "reply of type status-reply"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sent bytes.Buffer
			var hr HelloReply
			err := Call(rwPair{bytes.NewReader(tt.reply), &sent}, THello, 3, Hello{}, &hr)
			if f, derr := Decode(&sent); derr != nil || f.Type != THello || f.ID != 3 {
				t.Fatalf("request on the wire: %+v, %v", f, derr)
			}
			if tt.want == "" {
				if err != nil || hr.Job != "9" {
					t.Fatalf("Call = %+v, %v", hr, err)
				}
				return
			}
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tt.want)) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

type rwPair struct {
	io.Reader
	io.Writer
}

// FuzzDecode: Decode never panics, never returns a frame whose payload is
// larger than the limit, and every frame it accepts re-encodes to the same
// bytes. The seed corpus runs in every `go test`.
func FuzzDecode(f *testing.F) {
	f.Add(frame(1, 1, 0, 1, ""))
	f.Add(frame(1, 2, 0, 2, "{}"))
	f.Add(frame(1, 1, 0, 3, `{"client":"x","pid":1}`))
	f.Add(frame(2, 1, 0, 4, ""))
	f.Add(frame(1, 1, 9, 5, ""))
	f.Add(frame(1, 1, 0, 6, "not json"))
	f.Add([]byte{0, 0, 0, 1})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 1, 0, 0, 0, 0, 0, 0})
	f.Add(append(frame(1, 1, 0, 7, "{}"), frame(1, 2, 0, 8, "[]")...))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for i := 0; i < 4; i++ {
			start := len(in) - r.Len()
			fr, err := Decode(r)
			if err != nil {
				if Fatal(err) {
					return
				}
				continue
			}
			if len(fr.Payload) > MaxPayload {
				t.Fatalf("payload of %d bytes accepted", len(fr.Payload))
			}
			end := len(in) - r.Len()
			b, err := Append(nil, fr)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, in[start:end]) {
				t.Fatalf("re-encoding differs:\n got %x\nwant %x", b, in[start:end])
			}
		}
	})
}
