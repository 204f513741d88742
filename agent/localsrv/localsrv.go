// Package localsrv is the agent's local socket: the Unix socket a job's
// ranks and `reft` commands reach their node's agent on (docs/PROTOCOL.md).
// It creates the socket mode 0600 with no window of a wider mode, admits
// only processes of the job's uid (SO_PEERCRED), and runs one frame loop
// per connection: malformed frames get their error reply here, and
// well-formed ones go, in order, to the connection's [Session]. What a
// message means is the [Handler]'s business (package agent).
package localsrv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/runpath"
)

// Handler opens a session for each admitted connection.
//
// Contract: Open runs on the connection's own goroutine, after the peer
// passed the uid check and before any of its frames is read; the server
// may run any number of Opens at once. It must not call the Server's
// Close (that waits for the connection).
type Handler interface {
	Open(c net.Conn, cred *unix.Ucred, log zerolog.Logger) Session
}

// Session is one connection's state.
//
// Contract: Handle and Close run on the connection's goroutine, never at
// once. Handle gets each well-formed frame in arrival order, one at a time
// (the next is not read before it returns); it writes its replies to the
// connection itself and may block (a restore does, for minutes). Its ctx
// is the connection's: cancelled when the server closes, and after Close;
// long work takes it so that stopping the agent stops it. An error from
// Handle means a reply could not be written: the connection closes. Close
// runs exactly once, after the last Handle, however the connection ended
// (the peer went away, a fatal frame, the server's Close).
type Session interface {
	Handle(ctx context.Context, f proto.Frame) error
	Close()
}

// Config says whom the socket serves.
type Config struct {
	UID int    // the job's uid: every other peer is refused (forbidden)
	Job string // the job, named in the refusal
	Log zerolog.Logger
}

// Server is the listening socket and its connections. Its methods are
// safe for concurrent use.
type Server struct {
	cfg  Config
	ln   *net.UnixListener
	path string
	// ctx is the server's life, the parent of every connection's;
	// Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	mu    sync.Mutex
	conns map[net.Conn]struct{}

	clients   atomic.Int64
	accepted  atomic.Uint64
	badFrames atomic.Uint64
	closed    atomic.Bool
}

// Listen creates the socket at path with mode 0600. A stale socket at path
// (nobody answers) is replaced; a live one is an error.
func Listen(path string, cfg Config) (*Server, error) {
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("socket %s: another agent is already listening there", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	old := unix.Umask(0o177) // the socket is born 0600: no window with a wider mode
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w (is agent.run_dir in reft.toml on a local filesystem the user can write?)", path, err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod 0600 %s: %w", path, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{cfg: cfg, ln: ln, path: path, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}, nil
}

// Path returns the socket path.
func (s *Server) Path() string { return s.path }

// Clients is the connections open now; Accepted those accepted since
// Listen; BadFrames the malformed frames received (NoteBadFrame included).
func (s *Server) Clients() int64    { return s.clients.Load() }
func (s *Server) Accepted() uint64  { return s.accepted.Load() }
func (s *Server) BadFrames() uint64 { return s.badFrames.Load() }
func (s *Server) NoteBadFrame()     { s.badFrames.Add(1) }

// Serve accepts connections, each served on its own goroutine by a session
// h opens, until ctx is done or Close is called; then it returns nil once
// every connection's goroutine has ended.
func (s *Server) Serve(ctx context.Context, h Handler) error {
	go func() {
		<-ctx.Done()
		s.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if s.closed.Load() || ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.cfg.Log.Error().Err(err).Msg("accept failed; stopping the socket server")
			return fmt.Errorf("accept on %s: %w", s.path, err)
		}
		s.accepted.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(c, h)
		}()
	}
}

// Close stops accepting, cancels the connections' work, closes every
// connection and removes the socket. Later calls do nothing.
func (s *Server) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.cancel()
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	return err
}

// serveConn admits c if its peer runs as the job's uid, then reads frames
// until it goes away.
func (s *Server) serveConn(c *net.UnixConn, h Handler) {
	defer c.Close()
	cred, err := runpath.PeerCred(c)
	if err != nil {
		s.cfg.Log.Error().Err(err).Msg("SO_PEERCRED failed; closing the connection")
		return
	}
	log := s.cfg.Log.With().Int32("peer_pid", cred.Pid).Uint32("peer_uid", cred.Uid).Logger()
	if int(cred.Uid) != s.cfg.UID {
		log.Warn().Int("job_uid", s.cfg.UID).Msg("refused a connection from another uid")
		_ = proto.WriteMsg(c, proto.TError, 0, proto.Error{Code: proto.CodeForbidden,
			Message: fmt.Sprintf("uid %d may not use the agent of job %s (owned by uid %d)", cred.Uid, s.cfg.Job, s.cfg.UID)})
		return
	}
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	s.clients.Add(1)
	defer func() {
		s.clients.Add(-1)
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	log.Debug().Msg("client connected")
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	sess := h.Open(c, cred, log)
	defer sess.Close()
	s.frames(ctx, c, sess, log)
}

// frames is the connection's frame loop: a malformed frame is answered
// with an error (and ends the connection when its boundary is lost), a
// well-formed one goes to sess.
func (s *Server) frames(ctx context.Context, c net.Conn, sess Session, log zerolog.Logger) {
	for {
		f, err := proto.Decode(c)
		if err != nil {
			if errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) {
				return
			}
			if f.ID == 0 && errors.Is(err, io.EOF) {
				log.Debug().Msg("client disconnected")
				return
			}
			s.badFrames.Add(1)
			code := proto.CodeMalformed
			if errors.Is(err, proto.ErrVersion) {
				code = proto.CodeVersion
			}
			log.Warn().Err(err).Uint32("id", f.ID).Msg("malformed frame")
			_ = proto.WriteMsg(c, proto.TError, f.ID, proto.Error{Code: code, Message: err.Error()})
			if proto.Fatal(err) {
				return
			}
			continue
		}
		if err := sess.Handle(ctx, f); err != nil {
			log.Debug().Err(err).Msg("writing a reply failed; closing")
			return
		}
	}
}
