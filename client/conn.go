package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/proto"
)

// Error is an error reply from the agent. Use errors.As to get it from an
// error returned by the client; Code is one of the Code* constants.
type Error struct {
	Code    string
	Message string
	// BadChunks, when Code is CodeCorrupt, lists the byte ranges of the
	// rank's buffers whose checksum chunks failed (the other chunks were
	// sound): those bytes can be fetched from elsewhere (a replica, an
	// older step). Empty when the agent could not say.
	BadChunks []BadChunk
}

// BadChunk is one corrupt checksum chunk, or the part of it that held a
// buffer's bytes (docs/PROTOCOL.md, "Errors").
type BadChunk = proto.BadChunk

func (e *Error) Error() string { return "reft agent: " + e.Code + ": " + e.Message }

// conn is the client's one connection to its agent. It carries one request
// at a time: the copier's commit and the caller's requests take turns, and
// every reply is matched by id.
type conn struct {
	mu     sync.Mutex
	wmu    sync.Mutex // one frame at a time on the socket: requests and notices
	comm   bool       // the last comm notice sent (under wmu)
	c      *net.UnixConn
	r      *bufio.Reader
	id     uint32
	broken error // set when the stream can no longer be trusted
}

func dial(ctx context.Context, path string) (*conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connecting to the reft agent at %s: %w", path, err)
	}
	uc := c.(*net.UnixConn)
	if err := checkAgentUID(uc, path); err != nil {
		uc.Close()
		return nil, err
	}
	return &conn{c: uc, r: bufio.NewReader(uc)}, nil
}

// ErrAgentNotOurs: the process at the agent's socket runs as another
// user. The client sends it nothing: a request carries the arena's name
// and the rank's layout, and its replies would decide what is restored.
var ErrAgentNotOurs = errors.New("the reft agent's socket is served by another user")

// ownUID is the uid the agent must run as, this process's own (the agent
// runs as the job's user, never as root). A variable so that tests can
// pose as another user.
var ownUID = os.Getuid

// checkAgentUID reads the uid of the process that serves uc
// (SO_PEERCRED, recorded by the kernel when it listened) and refuses
// any but our own.
func checkAgentUID(uc *net.UnixConn, path string) error {
	raw, err := uc.SyscallConn()
	if err != nil {
		return fmt.Errorf("checking the reft agent at %s: %w", path, err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		cerr = err
	}
	if cerr != nil {
		return fmt.Errorf("checking the reft agent at %s: reading its credentials (SO_PEERCRED): %w", path, cerr)
	}
	if want := ownUID(); int(cred.Uid) != want {
		return fmt.Errorf("%w: %s is served by uid %d (pid %d), this process runs as uid %d; refusing to talk to it "+
			"(another user's process holds the agent's socket path: check REFT_AGENT_SOCKET, and tell the admin)",
			ErrAgentNotOurs, path, cred.Uid, cred.Pid, want)
	}
	return nil
}

// call sends one request and decodes its reply into resp (nil: ignore the
// payload). An error reply comes back as *Error.
func (c *conn) call(ctx context.Context, t proto.Type, req, resp any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return c.broken
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s request: %w", t, err)
	}
	c.id++
	if c.id == 0 { // 0 is reserved for errors about the connection
		c.id = 1
	}
	id := c.id
	// A cancelled context unblocks the socket through its deadline.
	cut := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		c.c.SetDeadline(time.Unix(1, 0))
		close(cut)
	})
	defer func() {
		if !stop() { // it ran or is running: undo its deadline after it
			<-cut
			c.c.SetDeadline(time.Time{})
		}
	}()
	c.wmu.Lock()
	werr := proto.WriteMsg(c.c, t, id, req)
	c.wmu.Unlock()
	f, rerr := proto.Decode(c.r)
	if werr != nil && (rerr != nil || f.Type != proto.TError) {
		// The agent may have refused the connection (an error frame, then
		// close) before the request went out: its error frame wins.
		return c.fail(ctx, fmt.Errorf("sending %s request: %w", t, werr))
	}
	if rerr != nil {
		return c.fail(ctx, fmt.Errorf("reading the %s reply: %w", t, rerr))
	}
	if f.ID != id && !(f.Type == proto.TError && f.ID == 0) {
		return c.fail(ctx, fmt.Errorf("the agent answered request id %d with id %d", id, f.ID))
	}
	switch f.Type {
	case proto.TError:
		var e proto.Error
		if err := f.Unmarshal(&e); err != nil {
			return c.fail(ctx, fmt.Errorf("error reply to %s: %w", t, err))
		}
		return &Error{Code: e.Code, Message: e.Message, BadChunks: e.BadChunks}
	case t | proto.ReplyBit:
		if resp == nil {
			return nil
		}
		if err := f.Unmarshal(resp); err != nil {
			return c.fail(ctx, fmt.Errorf("%s reply: %w", t, err))
		}
		return nil
	}
	return c.fail(ctx, fmt.Errorf("the agent answered a %s request with a frame of type 0x%02x", t, uint8(f.Type)))
}

// comm sends a comm notice when the phase changes. Notices are never
// answered, so it does not wait for a request in flight, only for its
// frame to be written.
func (c *conn) commNotice(active bool, op string) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.comm == active {
		return nil
	}
	// id 0: no reply will name it.
	if err := proto.WriteMsg(c.c, proto.TComm, 0, proto.Comm{Active: active, Op: op}); err != nil {
		return fmt.Errorf("sending a comm notice: %w", err)
	}
	c.comm = active
	return nil
}

// fail marks the connection unusable: after a cut-off request or a reply
// that does not fit, later replies could be taken for the wrong request.
func (c *conn) fail(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	c.broken = fmt.Errorf("the connection to the reft agent is unusable after an earlier failure; open a new client: %w", err)
	return err
}

// close closes the socket first, so that a request stuck in a read returns.
func (c *conn) close() error {
	err := c.c.Close()
	c.mu.Lock()
	c.broken = errClosed
	c.mu.Unlock()
	return err
}

var errClosed = errors.New("reft client is closed")
