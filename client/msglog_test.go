package client_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
)

// logClient opens a client for rank of world on a, with one registered
// buffer (a log belongs to the rank the client registered as).
func logClient(t *testing.T, a *agenttest.Agent, rank, world int) *client.Client {
	t.Helper()
	c := open(t, a, client.Options{Rank: rank, World: world})
	if err := c.Register("w", make([]byte, 4096), client.Sharded); err != nil {
		t.Fatal(err)
	}
	return c
}

// agentErr is err's agent error code ("" when it is not an *Error).
func agentErr(err error) string {
	var e *client.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func TestLogRoundTrip(t *testing.T) {
	a := startAgentWith(t, agenttest.Options{MemoryBudget: 1 << 30})
	c := logClient(t, a, 0, 1)
	ctx := ctxT(t)
	// Sizes: under a page, a page and a bit, and a few MiB (messages are
	// typically 1-64 MiB).
	msgs := []struct {
		stream string
		step   int64
		seq    int
		data   []byte
	}{
		{"act>1", 1, 0, patterned(100, 1)},
		{"act>1", 1, 1, patterned(4097, 2)},
		{"grad>0", 1, 0, patterned(3<<20+5, 3)},
		{"act>1", 2, 0, patterned(100, 4)},
		{"act>1", 3, 0, patterned(1<<20, 5)},
	}
	var total int64
	for _, m := range msgs {
		if err := c.LogAppend(m.stream, m.step, m.seq, m.data); err != nil {
			t.Fatal(err)
		}
		total += int64(len(m.data))
	}
	for _, m := range msgs {
		dst := make([]byte, len(m.data))
		if err := c.LogRead(ctx, m.stream, m.step, m.seq, dst); err != nil {
			t.Fatal(err)
		}
		mustEqual(t, m.stream, dst, m.data)
	}
	st := a.Status().MsgLog
	if st == nil || st.Bytes != total || st.AppendedBytes != total || st.RankCap != 1<<29 {
		t.Fatalf("status msglog = %+v, want %d bytes held and appended, a rank cap of %d", st, total, 1<<29)
	}
	steps := func(stream string, want ...int64) {
		t.Helper()
		got, err := c.LogSteps(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if want == nil {
			want = []int64{}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("LogSteps(%q) = %v, want %v", stream, got, want)
		}
	}
	steps("act>1", 1, 2, 3)
	steps("grad>0", 1)
	steps("nothing")
	if err := c.LogTruncate(2); err != nil {
		t.Fatal(err)
	}
	steps("act>1", 3)
	steps("grad>0")
	err := c.LogRead(ctx, "act>1", 1, 0, make([]byte, 100))
	if agentErr(err) != client.CodeNotFound || !strings.Contains(err.Error(), `stream "act>1" step 1 seq 0`) {
		t.Fatalf("reading a truncated message: %v, want not_found naming it", err)
	}
	if st := a.Status().MsgLog; st.Bytes != 1<<20 || st.AppendedBytes != total {
		t.Fatalf("after the truncation: status msglog = %+v, want %d held, %d appended", st, 1<<20, total)
	}
	// A buffer of another length is refused, not half filled.
	if err := c.LogRead(ctx, "act>1", 3, 0, make([]byte, 10)); err == nil || !strings.Contains(err.Error(), "exact length") {
		t.Fatalf("a short dst: %v", err)
	}
}

func TestLogReappend(t *testing.T) {
	a := startAgentWith(t, agenttest.Options{MemoryBudget: 1 << 30})
	c := logClient(t, a, 0, 1)
	data := patterned(1<<20, 7)
	if err := c.LogAppend("act>2", 5, 0, data); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data []byte
		code string
	}{
		{"the same bytes", data, ""},
		{"one byte changed", func() []byte { d := slices.Clone(data); d[77] ^= 1; return d }(), client.CodeMismatch},
		{"another length", data[:4096], client.CodeMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.LogAppend("act>2", 5, 0, tc.data)
			if agentErr(err) != tc.code || (tc.code == "") != (err == nil) {
				t.Fatalf("re-append: %v, want code %q", err, tc.code)
			}
			if err != nil && !strings.Contains(err.Error(), `stream "act>2" step 5 seq 0`) {
				t.Fatalf("the error does not name the message: %v", err)
			}
			dst := make([]byte, len(data))
			if err := c.LogRead(ctxT(t), "act>2", 5, 0, dst); err != nil {
				t.Fatal(err)
			}
			mustEqual(t, "the stored message", dst, data)
		})
	}
	if st := a.Status().MsgLog; st.AppendedBytes != 1<<20 {
		t.Fatalf("appended %d bytes, want the first append's %d only", st.AppendedBytes, 1<<20)
	}
}

// TestLogCap: with a 16 MiB budget one rank's cap is 8 MiB; the append
// that would pass it fails naming the cap and the fix, the log keeps
// everything, and a truncation makes room.
func TestLogCap(t *testing.T) {
	a := startAgentWith(t, agenttest.Options{MemoryBudget: 16 << 20})
	c := logClient(t, a, 0, 1)
	ctx := ctxT(t)
	for step := int64(1); step <= 4; step++ {
		if err := c.LogAppend("act>1", step, 0, patterned(2<<20, int(step))); err != nil {
			t.Fatal(err)
		}
	}
	err := c.LogAppend("act>1", 5, 0, patterned(2<<20, 5))
	if agentErr(err) != client.CodeNoSpace {
		t.Fatalf("an append over the cap: %v, want no_space", err)
	}
	for _, want := range []string{"cap of 8388608 bytes", "1/2 of the node's memory budget of 16777216 bytes, set by memory_budget, split among its 1 registered rank(s)",
		"snapshot more often", "memory_budget", "nothing was dropped"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the over-cap error does not say %q: %v", want, err)
		}
	}
	for step := int64(1); step <= 4; step++ {
		dst := make([]byte, 2<<20)
		if err := c.LogRead(ctx, "act>1", step, 0, dst); err != nil {
			t.Fatal(err)
		}
		mustEqual(t, "a message kept", dst, patterned(2<<20, int(step)))
	}
	if err := c.LogTruncate(1); err != nil {
		t.Fatal(err)
	}
	if err := c.LogAppend("act>1", 5, 0, patterned(2<<20, 5)); err != nil {
		t.Fatalf("an append after the truncation made room: %v", err)
	}
	if got, err := c.LogSteps(ctx, "act>1"); err != nil || !slices.Equal(got, []int64{2, 3, 4, 5}) {
		t.Fatalf("steps %v (%v), want [2 3 4 5]", got, err)
	}
}

// TestLogRanksApart: a log is read and truncated only by the rank that
// wrote it, through the connection that registered as that rank.
func TestLogRanksApart(t *testing.T) {
	a := startAgentWith(t, agenttest.Options{MemoryBudget: 1 << 30})
	r0, r1 := logClient(t, a, 0, 2), logClient(t, a, 1, 2)
	ctx := ctxT(t)
	d0 := patterned(5000, 10)
	if err := r0.LogAppend("act>1", 1, 0, d0); err != nil {
		t.Fatal(err)
	}
	if err := r1.LogAppend("grad>0", 1, 0, patterned(5000, 11)); err != nil {
		t.Fatal(err)
	}
	if err := r1.LogRead(ctx, "act>1", 1, 0, make([]byte, 5000)); agentErr(err) != client.CodeNotFound || !strings.Contains(err.Error(), "rank 1 holds no") {
		t.Fatalf("rank 1 reading rank 0's stream: %v, want not_found", err)
	}
	if err := r1.LogTruncate(100); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 5000)
	if err := r0.LogRead(ctx, "act>1", 1, 0, dst); err != nil {
		t.Fatalf("rank 1's truncation reached rank 0's log: %v", err)
	}
	mustEqual(t, "rank 0's message", dst, d0)

	// A restarted rank 0 (a new connection registering rank 0) owns the
	// log now; the old process is fenced from it.
	again := logClient(t, a, 0, 2)
	if err := again.LogRead(ctx, "act>1", 1, 0, dst); err != nil {
		t.Fatalf("the rank's new process reading its log: %v", err)
	}
	err := r0.LogRead(ctx, "act>1", 1, 0, dst)
	if agentErr(err) != client.CodeBadState || !strings.Contains(err.Error(), "fenced") {
		t.Fatalf("the fenced process reading: %v, want bad_state saying it is fenced", err)
	}

	// A client with nothing registered has no rank to log as.
	bare := open(t, a, client.Options{Rank: 0, World: 2})
	if err := bare.LogAppend("act>1", 1, 0, d0); err == nil || !strings.Contains(err.Error(), "registered") {
		t.Fatalf("a client that registered nothing: %v", err)
	}
}

// TestLogCorrupt: bytes changed in the agent's memory after the append
// fail the read, naming the message.
func TestLogCorrupt(t *testing.T) {
	a := startAgentWith(t, agenttest.Options{MemoryBudget: 1 << 30})
	c := logClient(t, a, 0, 1)
	data := patterned(1<<20, 9)
	if err := c.LogAppend("act>1", 4, 2, data); err != nil {
		t.Fatal(err)
	}
	arenas, err := filepath.Glob(filepath.Join(a.Store.Dir(), "msglog", "arena-*"))
	// Not the message's record (arena-N.rec), which lies beside it.
	arenas = slices.DeleteFunc(arenas, func(p string) bool { return strings.HasSuffix(p, ".rec") })
	if err != nil || len(arenas) != 1 {
		t.Fatalf("the message's arena: %v (%v)", arenas, err)
	}
	f, err := os.OpenFile(arenas[0], os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{^data[12345]}, 12345); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for range 2 {
		err := c.LogRead(ctxT(t), "act>1", 4, 2, make([]byte, len(data)))
		if agentErr(err) != client.CodeCorrupt || !strings.Contains(err.Error(), `stream "act>1" step 4 seq 2`) {
			t.Fatalf("reading a corrupt message: %v, want corrupt naming it", err)
		}
	}
	if st := a.Status().MsgLog; st.Corrupt != 1 {
		t.Fatalf("status counts %d corrupt messages, want 1", st.Corrupt)
	}
	// Appending it again replaces it.
	if err := c.LogAppend("act>1", 4, 2, data); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(data))
	if err := c.LogRead(ctxT(t), "act>1", 4, 2, dst); err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "the message appended again", dst, data)
}

func TestLogRefusals(t *testing.T) {
	a := startAgentWith(t, agenttest.Options{MemoryBudget: 1 << 30})
	c := logClient(t, a, 0, 1)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		call func() error
		want string
	}{
		{"empty message", func() error { return c.LogAppend("act>1", 1, 0, nil) }, "size = 0 must be positive"},
		{"stream with a space", func() error { return c.LogAppend("act 1", 1, 0, []byte{1}) }, "without spaces"},
		{"negative step", func() error { return c.LogRead(ctx, "act>1", -1, 0, []byte{1}) }, "step = -1"},
		{"negative seq", func() error { return c.LogAppend("act>1", 1, -1, []byte{1}) }, "seq = -1"},
		{"long stream", func() error { _, err := c.LogSteps(ctx, strings.Repeat("x", 65)); return err }, "longer than 64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v, want an error saying %q", err, tc.want)
			}
		})
	}
	off, err := client.Open(ctx, client.Options{Optional: true, Socket: ""})
	if err != nil {
		t.Fatal(err)
	}
	if err := off.LogAppend("act>1", 1, 0, []byte{1}); !errors.Is(err, client.ErrLogDisabled) {
		t.Fatalf("a disabled client's append: %v, want ErrLogDisabled", err)
	}
}

// TestLogBesideSaves: a logging goroutine appends, reads and truncates
// while the training goroutine saves and another reads the agent's
// status: the calls take turns on the one connection (run under -race in
// make unit).
func TestLogBesideSaves(t *testing.T) {
	a := startAgentWith(t, agenttest.Options{MemoryBudget: 1 << 30})
	c := open(t, a, client.Options{})
	state := patterned(1<<20, 1)
	if err := c.Register("w", state, client.Sharded); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	done := make(chan error, 2)
	go func() {
		for step := int64(1); step <= 20; step++ {
			data := patterned(300<<10, int(step))
			if err := c.LogAppend("act>1", step, 0, data); err != nil {
				done <- err
				return
			}
			dst := make([]byte, len(data))
			if err := c.LogRead(ctx, "act>1", step, 0, dst); err != nil {
				done <- err
				return
			}
			if !slices.Equal(dst, data) {
				done <- errors.New("a message read back differs")
				return
			}
			if step%4 == 0 {
				if err := c.LogTruncate(step - 2); err != nil {
					done <- err
					return
				}
			}
		}
		done <- nil
	}()
	go func() {
		for range 20 {
			_ = a.Status()
		}
		done <- nil
	}()
	for step := int64(1); step <= 10; step++ {
		if err := c.Save(step).Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.LogSteps(ctx, "act>1")
	if err != nil || !slices.Equal(got, []int64{19, 20}) {
		t.Fatalf("steps %v (%v), want [19 20]", got, err)
	}
}

// logMappings counts this process's mappings of files under dir, and of
// those the ones whose file was deleted.
func logMappings(t *testing.T, dir string) (all, deleted int) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, dir+"/") {
			all++
			if strings.HasSuffix(line, "(deleted)") {
				deleted++
			}
		}
	}
	return all, deleted
}

// TestLogMappingsFollowArenas: the client keeps its mappings of message
// arenas for their reuse, and a truncation unmaps those the agent freed,
// so that no mapping keeps a freed arena's memory alive past it.
func TestLogMappingsFollowArenas(t *testing.T) {
	a := startAgentWith(t, agenttest.Options{MemoryBudget: 16 << 20}) // a rank cap of 8 MiB
	c := logClient(t, a, 0, 1)
	dir := filepath.Join(a.Store.Dir(), "msglog")
	// The agent runs in this process: /proc/self/maps holds its mapping
	// of every arena it holds besides the client's.
	for step := int64(1); step <= 4; step++ {
		if err := c.LogAppend("act>1", step, 0, patterned(2<<20, int(step))); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := logMappings(t, dir); n != 4+4 {
		t.Fatalf("%d arena mappings after 4 appends, want 4 of the agent's and 4 of the client's", n)
	}
	// Truncated: the agent keeps the 4 arenas for reuse, the client its
	// mappings; a message of the same size reuses one.
	if err := c.LogTruncate(4); err != nil {
		t.Fatal(err)
	}
	if err := c.LogAppend("act>1", 5, 0, patterned(2<<20, 5)); err != nil {
		t.Fatal(err)
	}
	if n, del := logMappings(t, dir); n != 4+4 || del != 0 {
		t.Fatalf("%d arena mappings (%d deleted) after a reuse, want 4+4 (0)", n, del)
	}
	// 1 MiB fits none of the 2 MiB arenas kept, and the cap needs their
	// memory: the agent frees the three spares, while the client still
	// maps them.
	if err := c.LogAppend("act>1", 6, 0, patterned(1<<20, 6)); err != nil {
		t.Fatal(err)
	}
	if n, del := logMappings(t, dir); n != 2+5 || del != 3 {
		t.Fatalf("%d arena mappings (%d deleted), want 2 of the agent's and 5 of the client's (3 deleted)", n, del)
	}
	if err := c.LogTruncate(0); err != nil {
		t.Fatal(err)
	}
	if n, del := logMappings(t, dir); n != 2+2 || del != 0 {
		t.Fatalf("after a truncation: %d arena mappings (%d deleted), want 2+2 (0)", n, del)
	}
	for step, size := range map[int64]int{5: 2 << 20, 6: 1 << 20} {
		dst := make([]byte, size)
		if err := c.LogRead(ctxT(t), "act>1", step, 0, dst); err != nil {
			t.Fatal(err)
		}
		mustEqual(t, "a message", dst, patterned(size, int(step)))
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n, _ := logMappings(t, dir); n != 2 {
		t.Fatalf("%d arena mappings after Close, want the agent's 2", n)
	}
}

// TestLogStoreBudget: under a node's memory budget (a hostmem budget, as
// the agent charges its arenas to) the rank's cap derives from that budget,
// and the log's arenas are charged to it like snapshot arenas.
func TestLogStoreBudget(t *testing.T) {
	a := startAgentWith(t, agenttest.Options{MemoryBudget: 1 << 30, StoreBudget: 16 << 20})
	c := logClient(t, a, 0, 1)
	if err := c.LogAppend("act>1", 0, 0, []byte{1}); err != nil { // registers, and maps the first arena
		t.Fatal(err)
	}
	before := a.Status().Memory.InUse
	for step := int64(1); step <= 3; step++ {
		if err := c.LogAppend("act>1", step, 0, patterned(2<<20, int(step))); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.Status().Memory.InUse - before; got != 3*2<<20 {
		t.Fatalf("the budget's use grew by %d bytes over three 2 MiB messages, want %d", got, 3*2<<20)
	}
	if st := a.Status().MsgLog; st.RankCap != 8<<20 {
		t.Fatalf("rank cap %d, want half the 16 MiB budget", st.RankCap)
	}
	err := c.LogAppend("act>1", 4, 0, patterned(2<<20, 4))
	if agentErr(err) != client.CodeNoSpace || !strings.Contains(err.Error(), "cap of 8388608 bytes") ||
		!strings.Contains(err.Error(), "memory budget of 16777216 bytes, set by memory_budget = 16 MiB in reft.toml, split") {
		t.Fatalf("an append over the cap: %v", err)
	}
}

// TestLogSurvivesAgentRestart: the messages two ranks logged outlive
// their node's agent, as on a survivor of a node loss whose agent reft run
// restarts: the new agent on the same store adopts them, and each rank's
// new process (same rank numbering, a new connection) reads its own back
// bit-exact, with LogSteps as before; a message truncated before the
// restart stays gone, the held bytes count again, and the ranks' logs
// go on.
func TestLogSurvivesAgentRestart(t *testing.T) {
	opt := agenttest.Options{MemoryBudget: 1 << 30}
	a := startAgentWith(t, opt)
	type msg struct {
		rank   int
		stream string
		step   int64
		seq    int
		data   []byte
	}
	msgs := []msg{
		{0, "act>1", 1, 0, patterned(100, 1)},
		{0, "act>1", 2, 0, patterned(3<<20+5, 2)},
		{0, "act>1", 2, 1, patterned(4097, 3)},
		{0, "grad<1", 3, 0, patterned(1<<20, 4)},
		{1, "grad>0", 2, 0, patterned(5000, 5)},
		{1, "grad>0", 3, 0, patterned(6000, 6)},
	}
	before := []*client.Client{logClient(t, a, 0, 2), logClient(t, a, 1, 2)}
	for _, m := range msgs {
		if err := before[m.rank].LogAppend(m.stream, m.step, m.seq, m.data); err != nil {
			t.Fatal(err)
		}
	}
	// Rank 0 truncates its step 1, as after a snapshot of step 1.
	if err := before[0].LogTruncate(1); err != nil {
		t.Fatal(err)
	}
	msgs = msgs[1:]
	var held int64
	for _, m := range msgs {
		held += int64(len(m.data))
	}
	for _, c := range before {
		c.Close()
	}

	if err := a.Restart(opt); err != nil {
		t.Fatal(err)
	}
	if st := a.Status().MsgLog; st == nil || st.Bytes != held || st.AppendedBytes != 0 {
		t.Fatalf("the new agent's status msglog = %+v, want %d bytes held (adopted), none appended", st, held)
	}
	after := []*client.Client{logClient(t, a, 0, 2), logClient(t, a, 1, 2)}
	ctx := ctxT(t)
	for _, m := range msgs {
		dst := make([]byte, len(m.data))
		if err := after[m.rank].LogRead(ctx, m.stream, m.step, m.seq, dst); err != nil {
			t.Fatalf("rank %d's %s step %d seq %d after the restart: %v", m.rank, m.stream, m.step, m.seq, err)
		}
		mustEqual(t, m.stream, dst, m.data)
	}
	for _, tc := range []struct {
		rank   int
		stream string
		want   []int64
	}{
		{0, "act>1", []int64{2}},
		{0, "grad<1", []int64{3}},
		{1, "grad>0", []int64{2, 3}},
		{1, "act>1", []int64{}}, // rank 0's stream: a log is its rank's only
	} {
		got, err := after[tc.rank].LogSteps(ctx, tc.stream)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("rank %d LogSteps(%q) after the restart = %v, %v; want %v", tc.rank, tc.stream, got, err, tc.want)
		}
	}
	if err := after[0].LogRead(ctx, "act>1", 1, 0, make([]byte, 100)); agentErr(err) != client.CodeNotFound {
		t.Fatalf("the message truncated before the restart: %v, want not_found", err)
	}
	// The logs go on: a new append, a truncation of adopted messages.
	next := patterned(2048, 9)
	if err := after[0].LogAppend("act>1", 4, 0, next); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(next))
	if err := after[0].LogRead(ctx, "act>1", 4, 0, dst); err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "the append after the restart", dst, next)
	if err := after[1].LogTruncate(2); err != nil {
		t.Fatal(err)
	}
	if got, err := after[1].LogSteps(ctx, "grad>0"); err != nil || !slices.Equal(got, []int64{3}) {
		t.Fatalf("rank 1 after truncating adopted messages: %v, %v", got, err)
	}
	if st := a.Status().MsgLog; st.Bytes != held+2048-5000 || st.AppendedBytes != 2048 {
		t.Fatalf("status msglog = %+v, want %d held, 2048 appended", st, held+2048-5000)
	}
}

// TestLogRestartReportsLoss: a message whose record is damaged (here
// before the agent stops: the agent reads records only at its start) is
// removed by the new agent and said once (msglog_lost, with the count by
// reason and the file named); the other is adopted (msglog_adopted) and
// read back; the lost one is not_found, not a wrong answer.
func TestLogRestartReportsLoss(t *testing.T) {
	logs := &logtest.Buffer{}
	opt := agenttest.Options{MemoryBudget: 1 << 30, Log: zerolog.New(logs)}
	a := startAgentWith(t, opt)
	c := logClient(t, a, 0, 1)
	keep, lose := patterned(8000, 1), patterned(9000, 2)
	if err := c.LogAppend("act>1", 1, 0, keep); err != nil {
		t.Fatal(err)
	}
	if err := c.LogAppend("act>1", 2, 0, lose); err != nil {
		t.Fatal(err)
	}
	c.Close()
	// arena-1 holds the second message; flip a byte of its record's key.
	rec := filepath.Join(a.Store.Dir(), "msglog", "arena-1.rec")
	b, err := os.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	b[21] ^= 0x10
	if err := os.WriteFile(rec, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Restart(opt); err != nil {
		t.Fatal(err)
	}
	lost, adopted := logs.Events("msglog_lost"), logs.Events("msglog_adopted")
	if len(lost) != 1 || len(adopted) != 1 {
		t.Fatalf("%d msglog_lost and %d msglog_adopted lines, want one each:\n%s", len(lost), len(adopted), logs)
	}
	reasons, _ := lost[0]["reasons"].(map[string]any)
	examples, _ := lost[0]["examples"].([]any)
	if lost[0]["lost"] != float64(1) || reasons["bad_record"] != float64(1) || len(examples) != 1 ||
		!strings.Contains(fmt.Sprint(examples[0]), "arena-1.rec") {
		t.Fatalf("msglog_lost = %v, want 1 lost, reason bad_record, naming arena-1.rec", lost[0])
	}
	if adopted[0]["messages"] != float64(1) || adopted[0]["bytes"] != float64(len(keep)) {
		t.Fatalf("msglog_adopted = %v, want 1 message of %d bytes", adopted[0], len(keep))
	}
	c = logClient(t, a, 0, 1)
	dst := make([]byte, len(keep))
	if err := c.LogRead(ctxT(t), "act>1", 1, 0, dst); err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "the adopted message", dst, keep)
	if err := c.LogRead(ctxT(t), "act>1", 2, 0, make([]byte, len(lose))); agentErr(err) != client.CodeNotFound {
		t.Fatalf("the lost message: %v, want not_found", err)
	}
}
