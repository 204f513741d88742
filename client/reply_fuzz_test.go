package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/reft-hpc/reft/agent/proto"
)

// socketPair is a connected pair of unix stream sockets: the client's end
// as conn uses it, and the fake agent's.
func socketPair(t *testing.T) (*net.UnixConn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var cs [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c
	}
	return cs[0].(*net.UnixConn), cs[1]
}

// FuzzCall: whatever bytes come back on the agent's socket, a request
// returns: nil with its reply decoded, an *Error (the agent's error
// frame), or an error that leaves the connection broken, so that a later
// request never reads the rest of a bad stream as its reply.
func FuzzCall(f *testing.F) {
	frame := func(t proto.Type, id uint32, v any) []byte {
		p, err := json.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		b, err := proto.Append(nil, proto.Frame{Version: proto.Version, Type: t, ID: id, Payload: p})
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	f.Add(frame(proto.TSave|proto.ReplyBit, 1, proto.ArenaReply{Step: 1, ArenaSize: 4096, Buffers: []proto.BufferPlace{{Name: "a", Size: 8}}}))
	f.Add(frame(proto.TError, 1, proto.Error{Code: proto.CodeCorrupt, Message: "x", BadChunks: []proto.BadChunk{{Buffer: "a"}}}))
	f.Add(frame(proto.TError, 0, proto.Error{Code: "x"}))
	f.Add(frame(proto.TSave|proto.ReplyBit, 2, proto.ArenaReply{}))
	f.Add(frame(proto.TRestore|proto.ReplyBit, 1, proto.ArenaReply{}))
	f.Add(frame(proto.TSave|proto.ReplyBit, 1, []int{1}))
	f.Add([]byte{0, 0, 0, 9, 1})
	f.Fuzz(func(t *testing.T, reply []byte) {
		cc, agent := socketPair(t)
		defer agent.Close()
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, err := proto.Decode(agent); err == nil {
				agent.Write(reply)
			}
			agent.(*net.UnixConn).CloseWrite()
		}()
		c := &conn{c: cc, r: bufio.NewReader(cc)}
		defer c.close()
		var rep proto.ArenaReply
		err := c.call(context.Background(), proto.TSave, proto.StepReq{Step: 1}, &rep)
		<-done
		var ae *Error
		switch {
		case err == nil, errors.As(err, &ae):
			if c.broken != nil {
				t.Fatalf("a reply (%v) broke the connection: %v", err, c.broken)
			}
		case c.broken == nil:
			t.Fatalf("error %v left the connection usable", err)
		}
	})
}

// FuzzLayoutOf: a save or restore reply's layout either fails the
// client's checks or names only arena and buffer ranges that exist, so the
// copy the client then does never slices out of bounds.
func FuzzLayoutOf(f *testing.F) {
	add := func(rep proto.ArenaReply, save bool) {
		b, err := json.Marshal(rep)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, save)
	}
	places := []proto.BufferPlace{{Name: "a", Size: 100}, {Name: "b", Size: 0}, {Name: "c", Size: 50}}
	add(proto.ArenaReply{ArenaSize: 8192, Buffers: []proto.BufferPlace{{Name: "a", Offset: 0, Size: 100}, {Name: "b"}, {Name: "c", Offset: 4096, Size: 50}}}, true)
	add(proto.ArenaReply{ArenaSize: 200, Buffers: places, Sections: []proto.Section{{Name: "s", Size: 150}},
		Regions: []proto.Region{{Buffer: "c", Size: 50}, {Buffer: "a", Size: 100, ArenaOffset: 50}}}, true)
	add(proto.ArenaReply{ArenaSize: 200, Buffers: places, Sections: []proto.Section{{Name: "s", Size: 200}},
		Regions: []proto.Region{{Buffer: "a", Offset: 90, Size: 10, ArenaOffset: 190}}}, false)
	add(proto.ArenaReply{ArenaSize: 100, Buffers: []proto.BufferPlace{{Name: "a", Offset: -1, Size: 100}, {Name: "b"}, {Name: "c", Offset: 9223372036854775807, Size: 50}}}, true)
	add(proto.ArenaReply{ArenaSize: 100, Buffers: places, Sections: []proto.Section{{Name: "s", ArenaOffset: 9223372036854775807, Size: 1}},
		Regions: []proto.Region{{Buffer: "a", Offset: 9223372036854775807, Size: 9223372036854775807, ArenaOffset: 1}}}, false)
	f.Fuzz(func(t *testing.T, payload []byte, save bool) {
		var rep proto.ArenaReply
		if (proto.Frame{Payload: payload}).Unmarshal(&rep) != nil {
			return
		}
		data := map[string][]byte{"a": make([]byte, 100), "b": nil, "c": make([]byte, 50)}
		c := &Client{bufs: []buffer{{name: "a", data: data["a"]}, {name: "b"}, {name: "c", data: data["c"]}}}
		regions, sections, err := c.layoutOf(&rep, save)
		if err != nil {
			return
		}
		if rep.ArenaSize > 1<<20 {
			return // too big to allocate per input; the small ones exercise the same checks
		}
		arena := make([]byte, rep.ArenaSize)
		for _, s := range sections {
			_ = arena[s.ArenaOffset : s.ArenaOffset+s.Size]
		}
		for _, r := range regions {
			copy(arena[r.ArenaOffset:r.ArenaOffset+r.Size], data[r.Buffer][r.Offset:r.Offset+r.Size])
		}
	})
}
