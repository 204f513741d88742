package agent

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/msglog"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/hostmem"
)

// msgLogDir is the message log's directory in the job's store directory.
const msgLogDir = "msglog"

// msgLogShare is the part of the memory budget the message logs of a
// node's ranks may hold together: each rank's cap is this share of the
// budget split evenly among the ranks registered on the node
// (docs/ARCHITECTURE.md, "Message log").
const msgLogShare = 2

// msgLogs serves the ranks' message log requests (docs/PROTOCOL.md,
// "Message log") over agent/msglog. A rank is who its connection
// registered as, as for snapshots: it reads and truncates only its own
// log. A request runs on its connection's goroutine with that
// connection's rankConn; the store is made at the first request, and is
// safe for concurrent use.
type msgLogs struct {
	*attached
	regs   *registry
	warned *onceWarnings

	once sync.Once
	st   atomic.Pointer[msglog.Store] // set once, read by status replies
	err  error
}

// capBytes is a rank's cap: the budget's share split among the ranks
// registered on this node so far. The budget is the store's (memory_budget,
// or the job's memory limit when that is lower), else Info.MemoryBudget.
func (m *msgLogs) capBytes() (int64, string) {
	n := int64(m.regs.count())
	budget, from := int64(m.info.MemoryBudget), "memory_budget"
	if m.store != nil {
		if b := m.store.Allocator().Budget(); b != nil {
			budget, from = b.Limit(), b.LimitFrom()
		}
	}
	return budget / msgLogShare / n,
		fmt.Sprintf("1/%d of the node's memory budget of %d bytes, set by %s, split among its %d registered rank(s)", msgLogShare, budget, from, n)
}

// open makes the store, at the agent's start (Server.Serve) or at the
// first request: its directory, and the messages an earlier agent of the
// job left there, adopted (msglog.Store.Adopt). Files that could not be
// adopted are removed, and said once (msglog_lost) with how many and why.
func (m *msgLogs) open(log zerolog.Logger) (*msglog.Store, error) {
	m.once.Do(func() {
		dir, err := m.store.SubDir(msgLogDir)
		if err != nil {
			m.err = fmt.Errorf("message log directory: %w", err)
			return
		}
		alloc, owner := m.store.Allocator(), m.store.Owner()
		st := msglog.New(msglog.Config{Dir: dir, Cap: m.capBytes, Job: m.info.Job, UID: owner.UID,
			Alloc: func(path string, size int64) (msglog.Arena, error) {
				a, err := alloc.Create(path, size, owner)
				if err != nil {
					return nil, err // not a typed nil in the interface
				}
				return a, nil
			},
			Adopt: func(path string) (msglog.Arena, error) {
				a, err := alloc.AdoptOwned(path, owner.UID)
				if err != nil {
					return nil, err
				}
				return a, nil
			},
			Discard: alloc.Discard})
		ad, err := st.Adopt()
		if err != nil {
			m.err = err
			return
		}
		reportAdopted(ad, log)
		m.st.Store(st)
	})
	return m.st.Load(), m.err
}

// reportAdopted logs what the store took over from an earlier agent:
// msglog_adopted (info) when it found anything, msglog_lost (warn) when
// it removed files it could not use.
func reportAdopted(ad msglog.Adopted, log zerolog.Logger) {
	if ad.Messages > 0 || ad.Unused > 0 {
		log.Info().Str("event", "msglog_adopted").Int("messages", ad.Messages).Int64("bytes", ad.Bytes).Int("ranks", ad.Ranks).
			Int("unused_arenas", ad.Unused).Msg("adopted the message logs an earlier agent of this job left on this node")
	}
	if n := ad.LostCount(); n > 0 || len(ad.Errors) > 0 {
		d := zerolog.Dict()
		for why, c := range ad.Lost {
			d.Int(why, c)
		}
		log.Warn().Str("event", "msglog_lost").Int("lost", n).Dict("reasons", d).Strs("examples", ad.Details).
			Errs("remove_errors", ad.Errors).
			Msg("removed message log files an earlier agent of this job left on this node that could not be adopted: " +
				"a message among them is lost, and a stage that needs it recovers from its snapshot, not by replay")
	}
}

// close frees the logs' memory; after the connections are closed.
func (m *msgLogs) close() error {
	if st := m.st.Load(); st != nil {
		return st.Close()
	}
	return nil
}

// status is the status reply's message log section (nil: no store).
func (m *msgLogs) status() *proto.MsgLogStatus {
	if m.store == nil {
		return nil
	}
	st := &proto.MsgLogStatus{}
	st.RankCap, _ = m.capBytes()
	if l := m.st.Load(); l != nil {
		n := l.Counts()
		st.Bytes, st.AppendedBytes, st.Corrupt = n.Held, n.Appended, n.Corrupt
	}
	return st
}

// logErr maps a store error to the protocol's code.
func logErr(err error) string {
	switch {
	case errors.Is(err, msglog.ErrOverCap), errors.Is(err, hostmem.ErrOverBudget), errors.Is(err, unix.ENOSPC):
		return proto.CodeNoSpace
	case errors.Is(err, msglog.ErrConflict):
		return proto.CodeMismatch
	case errors.Is(err, msglog.ErrCorrupt):
		return proto.CodeCorrupt
	case errors.Is(err, msglog.ErrNotFound):
		return proto.CodeNotFound
	}
	return proto.CodeInternal
}

// refusal says why rc may not use the message log (code "" when it may):
// the job has no store, the connection registered no rank, or a newer
// registration of its rank fenced it.
func (m *msgLogs) refusal(rc *rankConn, t proto.Type) (code, msg string) {
	switch {
	case m.store == nil:
		return proto.CodeDisabled, fmt.Sprintf("job %s has no snapshot store on %s (SPEC %q): the message log is disabled with snapshots",
			m.info.Job, m.info.Node, m.info.Spec)
	case !rc.registered:
		return proto.CodeBadState, fmt.Sprintf("%s before register: a log belongs to the rank its connection registered as; register the rank's buffers first", t)
	}
	if by := m.regs.fencedBy(rc); by != nil {
		return proto.CodeBadState, fmt.Sprintf("%s refused: rank %d was registered again on this node by pid %d after this connection (pid %d) registered it; "+
			"this older process is fenced from the rank's log (end it: the rank runs in pid %d now)", t, rc.key.Rank, by.pid, rc.pid, by.pid)
	}
	return "", ""
}

// handle serves one message log request of rc's rank. An append left
// open (no commit) is dropped by the connection's next log request other
// than its commit, or when the connection closes.
func (m *msgLogs) handle(c net.Conn, rc *rankConn, f proto.Frame, log zerolog.Logger) error {
	if code, msg := m.refusal(rc, f.Type); code != "" {
		return replyErr(c, f.ID, code, "%s", msg)
	}
	st, err := m.open(log)
	if err != nil {
		log.Error().Err(err).Msg("message log unavailable")
		return replyErr(c, f.ID, proto.CodeInternal, "%s: %v", f.Type, err)
	}
	if f.Type != proto.TLogCommit && rc.logPending != nil {
		rc.logPending.Abort()
		rc.logPending = nil
	}
	r := logReq{m: m, st: st, c: c, rc: rc, f: f, log: log}
	switch f.Type {
	case proto.TLogAppend:
		return decoded(c, f, proto.LogAppend{}, r.append)
	case proto.TLogCommit:
		return decoded(c, f, proto.LogCommit{}, r.commit)
	case proto.TLogRead:
		return decoded(c, f, proto.LogKey{}, r.read)
	case proto.TLogTruncate:
		return decoded(c, f, proto.LogTruncate{UpTo: -1}, r.truncate)
	case proto.TLogSteps:
		return decoded(c, f, proto.LogStream{}, r.steps)
	}
	return replyErr(c, f.ID, proto.CodeUnknownType, "unknown message type %s", f.Type)
}

// logReq is one message log request being served.
type logReq struct {
	m   *msgLogs
	st  *msglog.Store
	c   net.Conn
	rc  *rankConn
	f   proto.Frame
	log zerolog.Logger
}

func (r logReq) reply(v any) error { return proto.WriteMsg(r.c, r.f.Type|proto.ReplyBit, r.f.ID, v) }

// fail replies with err's code, and logs what an operator must see: a
// corrupt message always, a refused append once per rank.
func (r logReq) fail(err error) error {
	code, rank := logErr(err), r.rc.key.Rank
	switch code {
	case proto.CodeCorrupt:
		r.log.Error().Err(err).Str("event", "msglog_corrupt").Int("rank", rank).Msg("message log")
	case proto.CodeNoSpace:
		r.m.warned.warn(r.log, fmt.Sprintf("msglog-space:%d", rank)).Err(err).Str("event", "msglog_full").Int("rank", rank).
			Msg("a message log append was refused (said once per rank; later ones at debug)")
	case proto.CodeInternal:
		r.log.Error().Err(err).Int("rank", rank).Msg("message log")
	}
	return replyErr(r.c, r.f.ID, code, "%s: %v", r.f.Type, err)
}

func (r logReq) append(req proto.LogAppend) error {
	if err := proto.CheckLogAppend(req); err != nil {
		return replyErr(r.c, r.f.ID, proto.CodeInvalid, "log_append: %v", err)
	}
	p, err := r.st.Begin(r.rc.key.Rank, req.LogKey, req.Size)
	if err != nil {
		return r.fail(err)
	}
	r.rc.logPending = p
	a := p.Arena()
	return r.reply(proto.LogAppendReply{Arena: a.FilePath(), ArenaSize: a.Size()})
}

func (r logReq) commit(req proto.LogCommit) error {
	p := r.rc.logPending
	if p == nil || p.Key() != req.LogKey {
		return replyErr(r.c, r.f.ID, proto.CodeBadState, "log_commit of %s: no append of it is open on this connection (send log_append first)", req.LogKey)
	}
	r.rc.logPending = nil
	held, err := p.Commit(req.CRC32C)
	if err != nil {
		return r.fail(err)
	}
	return r.reply(proto.LogCommitReply{LogKey: req.LogKey, Held: held})
}

func (r logReq) read(req proto.LogKey) error {
	if err := proto.CheckLogKey(req); err != nil {
		return replyErr(r.c, r.f.ID, proto.CodeInvalid, "log_read: %v", err)
	}
	s, err := r.st.Read(r.rc.key.Rank, req)
	if err != nil {
		return r.fail(err)
	}
	return r.reply(proto.LogReadReply{Arena: s.Arena, ArenaSize: s.ArenaSize, Size: s.Size, CRC32C: s.CRC32C})
}

func (r logReq) truncate(req proto.LogTruncate) error {
	rank := r.rc.key.Rank
	n, b := r.st.Truncate(rank, req.UpTo)
	held := r.st.RankHeld(rank)
	r.log.Debug().Str("event", "msglog_truncated").Int("rank", rank).Int64("up_to", req.UpTo).Int("messages", n).
		Int64("bytes", b).Int64("held", held).Msg("message log truncated")
	return r.reply(proto.LogTruncateReply{Messages: n, Bytes: b, Held: held})
}

func (r logReq) steps(req proto.LogStream) error {
	if err := proto.CheckLogStream(req.Stream); err != nil {
		return replyErr(r.c, r.f.ID, proto.CodeInvalid, "log_steps: %v", err)
	}
	return r.reply(proto.LogStepsReply{Steps: r.st.Steps(r.rc.key.Rank, req.Stream)})
}
