package proto

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzLogRequest: a message log request's payload comes from any process
// of the job's user. Decoded and checked as the agent does (JSON, then
// CheckLogAppend, CheckLogKey (commit, read) or CheckLogStream by type), an accepted
// request names a stream of 1 to MaxLogStream bytes of printable ASCII
// without spaces (it reaches the agent's log and error lines), a step
// that is not negative, a seq within [0, MaxLogSeq] and, for an append, a
// positive size.
func FuzzLogRequest(f *testing.F) {
	for _, s := range []string{`{"stream":"act>3","step":1,"seq":0,"size":4096}`, `{"stream":"grad>1","step":7,"seq":2,"crc32c":123}`,
		`{"stream":"a b","step":1}`, `{"stream":"a\n","step":1}`, `{"stream":"","step":-1}`, `{"up_to":5}`, `{"stream":"x","seq":2147483648}`,
		`{"stream":"\u00e9"}`, `{"stream":"act>1","size":-1}`} {
		for typ := range 5 {
			f.Add(uint8(typ), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, typ uint8, payload []byte) {
		fr := Frame{Payload: payload}
		var k LogKey
		switch typ % 5 {
		case 0:
			var a LogAppend
			if fr.Unmarshal(&a) != nil || CheckLogAppend(a) != nil {
				return
			}
			if a.Size <= 0 {
				t.Fatalf("accepted an append of %d bytes", a.Size)
			}
			k = a.LogKey
		case 1:
			var cm LogCommit
			if fr.Unmarshal(&cm) != nil || CheckLogKey(cm.LogKey) != nil {
				return
			}
			k = cm.LogKey
		case 2:
			if fr.Unmarshal(&k) != nil || CheckLogKey(k) != nil {
				return
			}
		case 3:
			tr := LogTruncate{UpTo: -1}
			if fr.Unmarshal(&tr) != nil {
				return
			}
			return // any step: a truncation up to it drops what is at or below
		case 4:
			var s LogStream
			if fr.Unmarshal(&s) != nil || CheckLogStream(s.Stream) != nil {
				return
			}
			k = LogKey{Stream: s.Stream}
		}
		if n := len(k.Stream); n == 0 || n > MaxLogStream {
			t.Fatalf("accepted a stream name of %d bytes", n)
		}
		for i := 0; i < len(k.Stream); i++ {
			if c := k.Stream[i]; c <= ' ' || c > '~' {
				t.Fatalf("accepted stream %q with byte 0x%02x", k.Stream, c)
			}
		}
		if k.Step < 0 || k.Seq < 0 || k.Seq > MaxLogSeq {
			t.Fatalf("accepted step %d seq %d", k.Step, k.Seq)
		}
		if s := k.String(); strings.ContainsAny(s, "\n\r") {
			t.Fatalf("a key prints over lines: %q", s)
		}
	})
}

// FuzzLogReply: log_append and log_read replies come from the agent; the
// Go client maps the arena they name only after CheckLogArena, so an
// accepted reply names an absolute path and an arena that holds the
// message and fits in an int (the length of the mapping).
func FuzzLogReply(f *testing.F) {
	for _, s := range []string{`{"arena":"/dev/shm/reft/1000/42/msglog/arena-0","arena_size":4096,"size":100,"crc32c":5}`,
		`{"arena":"rel","arena_size":4096,"size":1}`, `{"arena":"/a","arena_size":1,"size":2}`, `{"arena":"/a","arena_size":-1,"size":-5}`,
		`{}`, `{"arena":"/a","arena_size":9223372036854775807,"size":1}`} {
		f.Add(false, []byte(s))
		f.Add(true, []byte(s))
	}
	f.Fuzz(func(t *testing.T, read bool, payload []byte) {
		var arena string
		var arenaSize, size int64
		if read {
			var r LogReadReply
			if json.Unmarshal(payload, &r) != nil {
				return
			}
			arena, arenaSize, size = r.Arena, r.ArenaSize, r.Size
		} else {
			var r LogAppendReply
			if json.Unmarshal(payload, &r) != nil {
				return
			}
			arena, arenaSize, size = r.Arena, r.ArenaSize, 4096 // the client's own message size
		}
		if CheckLogArena(arena, arenaSize, size) != nil {
			return
		}
		if !strings.HasPrefix(arena, "/") || size <= 0 || arenaSize < size || int64(int(arenaSize)) != arenaSize {
			t.Fatalf("accepted arena %q of %d bytes for %d", arena, arenaSize, size)
		}
	})
}
