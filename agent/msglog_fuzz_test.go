package agent

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"testing"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/msglog"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/tmpfs"
)

// bufConn is a net.Conn whose writes land in a buffer: the replies of
// handlers under test.
type bufConn struct {
	net.Conn
	out bytes.Buffer
}

func (c *bufConn) Write(p []byte) (int, error) { return c.out.Write(p) }

// memArena is a message arena in this process's memory.
type memArena struct {
	path string
	b    []byte
	live *int
}

func (a *memArena) Bytes() []byte    { return a.b }
func (a *memArena) Size() int64      { return int64(len(a.b)) }
func (a *memArena) FilePath() string { return a.path }
func (a *memArena) Close() error     { return a.Remove() }
func (a *memArena) Remove() error {
	if a.b == nil {
		return errors.New("freed twice")
	}
	*a.live--
	a.b = nil
	return nil
}

var logTypes = []proto.Type{proto.TLogAppend, proto.TLogCommit, proto.TLogRead, proto.TLogTruncate, proto.TLogSteps}

// FuzzLogFrames: message log requests come from any process of the job's
// user. A sequence of them (payloads split at newlines, each of the type
// its byte of types picks) served on one registered connection is
// answered, each with its reply type or an error of a protocol code
// (malformed for a payload that does not decode); the held bytes stay the
// sum of the rank's messages; and when the connection and the store
// close, every arena is unmapped or freed exactly once.
func FuzzLogFrames(f *testing.F) {
	f.Add([]byte{0, 1, 2, 4, 3}, []byte(`{"stream":"act>1","step":1,"seq":0,"size":100}
{"stream":"act>1","step":1,"seq":0,"crc32c":0}
{"stream":"act>1","step":1,"seq":0}
{"stream":"act>1"}
{"up_to":1}`))
	// 100 zero bytes have CRC-32C 0x07cb9ff6 (the arena starts zeroed).
	f.Add([]byte{0, 1, 0, 1, 2, 0, 1}, []byte(`{"stream":"a","step":2,"seq":1,"size":100}
{"stream":"a","step":2,"seq":1,"crc32c":130785270}
{"stream":"a","step":2,"seq":1,"size":100}
{"stream":"a","step":2,"seq":1,"crc32c":130785270}
{"stream":"a","step":2,"seq":1}
{"stream":"a","step":2,"seq":1,"size":100}
{"stream":"a","step":2,"seq":1,"crc32c":1}`))
	f.Add([]byte{0, 0, 1}, []byte("{\"stream\":\"x\",\"size\":1048577}\n[]\n{\"stream\":7}"))
	store, err := tmpfs.Open(tmpfs.Options{Root: f.TempDir(), JobID: "7"})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { store.Close() })
	f.Fuzz(func(t *testing.T, types []byte, payloads []byte) {
		lines := bytes.Split(payloads, []byte("\n"))
		if len(lines) > 16 || len(types) == 0 {
			return
		}
		live := 0
		m := &msgLogs{attached: &attached{info: Info{Job: "7", MemoryBudget: 8 << 20}, store: store}, regs: &registry{}, warned: &onceWarnings{}}
		m.once.Do(func() {})
		m.st.Store(msglog.New(msglog.Config{Dir: t.TempDir(), Job: "7", UID: -1, Cap: m.capBytes,
			Alloc: func(path string, size int64) (msglog.Arena, error) {
				live++
				return &memArena{path: path, b: make([]byte, (size+4095)/4096*4096), live: &live}, nil
			}}))
		rc := &rankConn{registered: true, key: tmpfs.Key{Rank: 0, Shard: tmpfs.DefaultShard}}
		c := &bufConn{}
		for i, p := range lines {
			typ := logTypes[int(types[i%len(types)])%len(logTypes)]
			if err := m.handle(c, rc, proto.Frame{Version: proto.Version, Type: typ, ID: uint32(i + 1), Payload: p}, zerolog.Nop()); err != nil {
				t.Fatalf("%s: %v", typ, err)
			}
			r, err := proto.Decode(&c.out)
			if err != nil {
				t.Fatalf("%s: reply: %v", typ, err)
			}
			if c.out.Len() != 0 || r.ID != uint32(i+1) {
				t.Fatalf("%s: one reply of id %d expected, got id %d and %d bytes more", typ, i+1, r.ID, c.out.Len())
			}
			if r.Type == proto.TError {
				var e proto.Error
				if err := r.Unmarshal(&e); err != nil {
					t.Fatal(err)
				}
				if !slices.Contains([]string{proto.CodeMalformed, proto.CodeInvalid, proto.CodeBadState, proto.CodeNoSpace,
					proto.CodeNotFound, proto.CodeMismatch, proto.CodeCorrupt}, e.Code) {
					t.Fatalf("%s: error %s: %s", typ, e.Code, e.Message)
				}
				if (proto.Frame{Payload: p}).Unmarshal(&map[string]any{}) != nil && e.Code != proto.CodeMalformed {
					t.Fatalf("%s: a payload that does not decode got %s", typ, e.Code)
				}
			} else if r.Type != typ|proto.ReplyBit {
				t.Fatalf("%s answered with %s", typ, r.Type)
			}
			if st := m.st.Load(); st.Counts().Held != st.RankHeld(0) || st.Counts().Held < 0 {
				t.Fatalf("held %d bytes, rank 0 %d", st.Counts().Held, st.RankHeld(0))
			}
		}
		rc.close()
		if err := m.close(); err != nil {
			t.Fatal(err)
		}
		if live != 0 {
			t.Fatalf("%d arenas not freed", live)
		}
	})
}
