package agent

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/hostmem"
	"github.com/reft-hpc/reft/internal/crc32c"
	"github.com/reft-hpc/reft/tmpfs"
)

// openTestStore opens job 42's store under root without pinning, with one
// older generation kept, spare extra arenas, and a memory budget (0: none).
func openTestStore(t *testing.T, root string, budget int64, spare int) *tmpfs.Store {
	t.Helper()
	cfg := hostmem.Config{NoPin: true, Metrics: new(hostmem.Metrics)}
	if budget > 0 {
		// One Metrics for budget and allocator, as in openStore.
		b, err := hostmem.NewBudget(hostmem.BudgetConfig{Cap: hostmem.Cap{Bytes: budget}, Headroom: 1}, cfg.Metrics)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Budget = b
	}
	alloc, err := hostmem.NewAllocator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := tmpfs.Open(tmpfs.Options{Root: root, JobID: "42", Keep: 1, Spare: spare, Alloc: alloc})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// storeServer runs a server with a snapshot store under a temp root.
// budget 0: no cap.
func storeServer(t *testing.T, root string, budget int64) string {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	logs := &logtest.Buffer{}
	logs.CheckEvents(t) // the declared events it logs (rank_fenced, rank_registered, restore_local) carry their fields
	s, err := Listen(sock, Info{Job: "42", Node: "n1", Spec: "arc", Version: "test", UID: os.Getuid()}, zerolog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	st := openTestStore(t, root, budget, 0)
	s.AttachStore(st)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		st.Close()
	})
	return sock
}

type client struct {
	t  *testing.T
	c  net.Conn
	id uint32
}

func newClient(t *testing.T, sock string) *client { return &client{t: t, c: dial(t, sock)} }

// call sends a request and returns the reply's error code ("" on success).
func (c *client) call(typ proto.Type, req, resp any) string {
	c.t.Helper()
	c.id++
	err := proto.Call(c.c, typ, c.id, req, resp)
	var perr *proto.Error
	if errors.As(err, &perr) {
		return perr.Code
	}
	if err != nil {
		c.t.Fatalf("%s: %v", typ, err)
	}
	return ""
}

// callErr sends a request and returns the agent's error reply (nil on
// success).
func (c *client) callErr(typ proto.Type, req, resp any) *proto.Error {
	c.t.Helper()
	c.id++
	err := proto.Call(c.c, typ, c.id, req, resp)
	var perr *proto.Error
	if errors.As(err, &perr) {
		return perr
	}
	if err != nil {
		c.t.Fatalf("%s: %v", typ, err)
	}
	return nil
}

func (c *client) must(typ proto.Type, req, resp any) {
	c.t.Helper()
	if code := c.call(typ, req, resp); code != "" {
		c.t.Fatalf("%s: error %s", typ, code)
	}
}

// regReq registers a rank of a 4-stage pipeline (dp=1): no sharding group,
// so these tests see the node-local store's whole-buffer layout; the
// sharded layout has its own multi-agent tests (sharded_test.go).
func regReq(rank int, bufs ...proto.BufferSpec) proto.Register {
	return proto.Register{Rank: rank, World: 4, Layout: "dp=1,pp=4", ChunkSize: 4096, Buffers: bufs}
}

var twoBufs = []proto.BufferSpec{{Name: "params", Size: 10_000, Replicated: true}, {Name: "adam", Size: 5_000}}

func mapArena(t *testing.T, path string, size int64, prot int) []byte {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), prot, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	return m
}

// saveFilled saves one generation whose buffer bytes are all fill.
func (c *client) saveFilled(step int64, fill byte) proto.CommitReply {
	c.t.Helper()
	var ar proto.ArenaReply
	c.must(proto.TSave, proto.StepReq{Step: step}, &ar)
	m := mapArena(c.t, ar.Arena, ar.ArenaSize, unix.PROT_READ|unix.PROT_WRITE)
	for _, b := range ar.Buffers {
		copy(m[b.Offset:b.Offset+b.Size], bytes.Repeat([]byte{fill}, int(b.Size)))
	}
	var cr proto.CommitReply
	c.must(proto.TCommit, proto.StepReq{Step: step}, &cr)
	return cr
}

func (c *client) steps() []int64 {
	c.t.Helper()
	var g proto.GenerationsReply
	c.must(proto.TGenerations, nil, &g)
	out := []int64{}
	for _, x := range g.Generations {
		out = append(out, x.Step)
	}
	return out
}

func TestSnapshotSaveRestore(t *testing.T) {
	root := t.TempDir()
	sock := storeServer(t, root, 0)
	c := newClient(t, sock)
	var rr proto.RegisterReply
	c.must(proto.TRegister, regReq(2, twoBufs...), &rr)
	if rr.Rank != 2 || rr.ChunkSize != 4096 || len(rr.Buffers) != 2 || rr.Buffers[1].Offset%int64(os.Getpagesize()) != 0 ||
		!rr.Buffers[0].Replicated || rr.Buffers[1].Replicated {
		t.Fatalf("register reply %+v", rr)
	}
	if got := c.steps(); len(got) != 0 {
		t.Fatalf("generations before any save: %v", got)
	}
	cr := c.saveFilled(7, 0xAB)
	if cr.Step != 7 || cr.Bytes != 15_000 {
		t.Fatalf("commit reply %+v", cr)
	}
	c.saveFilled(8, 0xCD)
	if got := c.steps(); !slices.Equal(got, []int64{8, 7}) {
		t.Fatalf("generations %v, want [8 7]", got)
	}
	for _, tc := range []struct {
		step int64
		want byte
	}{{-1, 0xCD}, {7, 0xAB}, {8, 0xCD}} {
		var ar proto.ArenaReply
		c.must(proto.TRestore, proto.StepReq{Step: tc.step}, &ar)
		m := mapArena(t, ar.Arena, ar.ArenaSize, unix.PROT_READ)
		for _, b := range ar.Buffers {
			if !bytes.Equal(m[b.Offset:b.Offset+b.Size], bytes.Repeat([]byte{tc.want}, int(b.Size))) {
				t.Fatalf("restore %d: buffer %s differs", tc.step, b.Name)
			}
		}
		c.must(proto.TRelease, proto.StepReq{Step: ar.Step}, nil)
	}
	var st proto.Status
	c.must(proto.TStatus, nil, &st)
	if len(st.Ranks) != 1 || st.Ranks[0].Rank != 2 || st.Ranks[0].Newest != 8 || st.Ranks[0].Bytes != 15_000 {
		t.Fatalf("status ranks %+v", st.Ranks)
	}
	// The manifest records the buffers' kinds for redundancy planning.
	gens, _ := filepath.Glob(filepath.Join(tmpfs.JobPath(root, os.Getuid(), "42"), "r2", "state", "g8-*", "MANIFEST"))
	if len(gens) != 1 {
		t.Fatalf("manifests of step 8: %v", gens)
	}
	raw, _ := os.ReadFile(gens[0])
	var man tmpfs.Manifest
	if err := json.Unmarshal(raw, &man); err != nil || !man.Buffers[0].Replicated || man.Layout != "dp=1,pp=4" {
		t.Fatalf("manifest %s: %+v %v", raw, man, err)
	}
}

func TestSnapshotErrors(t *testing.T) {
	root := t.TempDir()
	sock := storeServer(t, root, 0)
	// A generation of rank 1 to restore against.
	seed := newClient(t, sock)
	seed.must(proto.TRegister, regReq(1, twoBufs...), nil)
	seed.saveFilled(3, 1)

	type step struct {
		typ  proto.Type
		req  any
		code string
	}
	reg := func(r proto.Register) step { return step{proto.TRegister, r, ""} }
	ok := reg(regReq(0, twoBufs...))
	for name, steps := range map[string][]step{
		"save before register":        {{proto.TSave, proto.StepReq{Step: 1}, proto.CodeBadState}},
		"generations before register": {{proto.TGenerations, nil, proto.CodeBadState}},
		"register twice":              {ok, {proto.TRegister, regReq(0, twoBufs...), proto.CodeBadState}},
		"world 0":                     {{proto.TRegister, proto.Register{Rank: 0, World: 0, Buffers: twoBufs}, proto.CodeInvalid}},
		"rank beyond world":           {{proto.TRegister, proto.Register{Rank: 4, World: 4, Buffers: twoBufs}, proto.CodeInvalid}},
		"no buffers":                  {{proto.TRegister, regReq(0), proto.CodeInvalid}},
		"duplicate buffer": {{proto.TRegister, regReq(0, proto.BufferSpec{Name: "a", Size: 1}, proto.BufferSpec{Name: "a", Size: 2}),
			proto.CodeInvalid}},
		"negative size":  {{proto.TRegister, regReq(0, proto.BufferSpec{Name: "a", Size: -1}), proto.CodeInvalid}},
		"tiny chunks":    {{proto.TRegister, proto.Register{World: 1, ChunkSize: 100, Buffers: twoBufs}, proto.CodeInvalid}},
		"negative step":  {ok, {proto.TSave, proto.StepReq{Step: -5}, proto.CodeInvalid}},
		"commit no save": {ok, {proto.TCommit, proto.StepReq{Step: 1}, proto.CodeBadState}},
		"commit other step": {ok, {proto.TSave, proto.StepReq{Step: 1}, ""},
			{proto.TCommit, proto.StepReq{Step: 2}, proto.CodeBadState}},
		"commit with too few checksums": {ok, {proto.TSave, proto.StepReq{Step: 1}, ""},
			{proto.TCommit, proto.Commit{Step: 1, CRC32C: map[string][]uint32{"params": {1}, "adam": {2, 3}}}, proto.CodeInvalid}},
		"commit with checksums of another buffer": {ok, {proto.TSave, proto.StepReq{Step: 1}, ""},
			{proto.TCommit, proto.Commit{Step: 1, CRC32C: map[string][]uint32{"params": {1, 2, 3}, "adam": {2, 3}, "x": {}}}, proto.CodeInvalid}},
		"two saves open": {ok, {proto.TSave, proto.StepReq{Step: 1}, ""}, {proto.TSave, proto.StepReq{Step: 2}, proto.CodeBadState}},
		"abort no save":  {ok, {proto.TAbort, proto.StepReq{Step: 1}, proto.CodeBadState}},
		"abort then commit": {ok, {proto.TSave, proto.StepReq{Step: 1}, ""}, {proto.TAbort, proto.StepReq{Step: 1}, ""},
			{proto.TCommit, proto.StepReq{Step: 1}, proto.CodeBadState}},
		"restore nothing":       {ok, {proto.TRestore, proto.StepReq{Step: -1}, proto.CodeNotFound}},
		"restore unknown step":  {reg(regReq(1, twoBufs...)), {proto.TRestore, proto.StepReq{Step: 4}, proto.CodeNotFound}},
		"restore other sizes":   {reg(regReq(1, proto.BufferSpec{Name: "params", Size: 10_001}, twoBufs[1])), {proto.TRestore, proto.StepReq{Step: 3}, proto.CodeMismatch}},
		"restore other buffers": {reg(regReq(1, twoBufs[0])), {proto.TRestore, proto.StepReq{Step: 3}, proto.CodeMismatch}},
		"restore other order":   {reg(regReq(1, twoBufs[1], twoBufs[0])), {proto.TRestore, proto.StepReq{Step: 3}, proto.CodeMismatch}},
		"release unrestored":    {reg(regReq(1, twoBufs...)), {proto.TRelease, proto.StepReq{Step: 3}, proto.CodeBadState}},
	} {
		t.Run(name, func(t *testing.T) {
			c := newClient(t, sock)
			for i, s := range steps {
				if got := c.call(s.typ, s.req, nil); got != s.code {
					t.Fatalf("request %d (%s): code %q, want %q", i, s.typ, got, s.code)
				}
			}
			// The connection still serves after an error.
			c.must(proto.TStatus, nil, nil)
		})
	}
}

func TestSnapshotDisconnectAbortsOpenSave(t *testing.T) {
	sock := storeServer(t, t.TempDir(), 0)
	c := newClient(t, sock)
	c.must(proto.TRegister, regReq(0, twoBufs...), nil)
	c.saveFilled(1, 1)
	c.must(proto.TSave, proto.StepReq{Step: 2}, nil)
	c.c.Close() // the rank dies mid-copy

	// Its restarted incarnation sees only the committed generation, and
	// can save again (the open save did not leak its arena).
	d := newClient(t, sock)
	d.must(proto.TRegister, regReq(0, twoBufs...), nil)
	for i := int64(2); i < 6; i++ {
		d.saveFilled(i, byte(i))
	}
	if got := d.steps(); got[0] != 5 {
		t.Fatalf("generations %v", got)
	}
}

func TestSnapshotSecondConnectionSupersedes(t *testing.T) {
	sock := storeServer(t, t.TempDir(), 0)
	old, cur := newClient(t, sock), newClient(t, sock)
	old.must(proto.TRegister, regReq(0, twoBufs...), nil)
	old.must(proto.TSave, proto.StepReq{Step: 1}, nil)
	cur.must(proto.TRegister, regReq(0, twoBufs...), nil)
	cur.saveFilled(1, 9) // discards old's unfinished generation
	if code := old.call(proto.TCommit, proto.StepReq{Step: 1}, nil); code != proto.CodeBadState {
		t.Fatalf("commit of a superseded save: %q, want bad_state", code)
	}
	if got := cur.steps(); !slices.Equal(got, []int64{1}) {
		t.Fatalf("generations %v", got)
	}
}

// TestSnapshotOldIncarnationFenced: a rank registered again while its
// older connection is still open (a process that outlived its relaunch)
// fences the older one: whatever it asks that could change or read the
// rank's snapshots is refused with an error naming both processes, so it
// cannot commit over the newer incarnation (issue 14, finding 7).
func TestSnapshotOldIncarnationFenced(t *testing.T) {
	for _, tc := range []struct {
		name string
		typ  proto.Type
		req  any
	}{
		{"save", proto.TSave, proto.StepReq{Step: 7}},
		{"commit", proto.TCommit, proto.StepReq{Step: 7}},
		{"abort", proto.TAbort, proto.StepReq{Step: 7}},
		{"restore", proto.TRestore, proto.StepReq{Step: -1}},
		{"release", proto.TRelease, proto.StepReq{Step: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := storeServer(t, t.TempDir(), 0)
			old, cur := newClient(t, sock), newClient(t, sock)
			old.must(proto.TRegister, regReq(0, twoBufs...), nil)
			old.saveFilled(1, 1)
			var ar proto.ArenaReply
			old.must(proto.TRestore, proto.StepReq{Step: 1}, &ar) // pinned, for release
			old.must(proto.TSave, proto.StepReq{Step: 7}, nil)    // open, for commit and abort
			cur.must(proto.TRegister, regReq(0, twoBufs...), nil)
			perr := old.callErr(tc.typ, tc.req, nil)
			if perr == nil || perr.Code != proto.CodeBadState || !strings.Contains(perr.Message, "fenced") {
				t.Fatalf("%s of the older incarnation: %v, want bad_state naming the fence", tc.typ, perr)
			}
			if got := cur.steps(); !slices.Equal(got, []int64{1}) {
				t.Fatalf("generations %v, want [1]: the fenced connection changed them", got)
			}
			cur.saveFilled(2, 2) // the newer incarnation works on
			if got := old.steps(); !slices.Equal(got, []int64{2, 1}) {
				t.Fatalf("generations seen by the older connection %v", got)
			}
		})
	}
}

func TestSnapshotCorruptGeneration(t *testing.T) {
	sock := storeServer(t, t.TempDir(), 0)
	c := newClient(t, sock)
	c.must(proto.TRegister, regReq(0, twoBufs...), nil)
	c.saveFilled(1, 1)
	c.saveFilled(2, 2)
	var ar proto.ArenaReply
	c.must(proto.TRestore, proto.StepReq{Step: 2}, &ar)
	c.must(proto.TRelease, proto.StepReq{Step: 2}, nil)
	m := mapArena(t, ar.Arena, ar.ArenaSize, unix.PROT_READ|unix.PROT_WRITE)
	m[ar.Buffers[1].Offset+4097] ^= 0xFF
	perr := c.callErr(proto.TRestore, proto.StepReq{Step: 2}, nil)
	if perr == nil || perr.Code != proto.CodeCorrupt {
		t.Fatalf("restore of a corrupt generation: %v", perr)
	}
	// Chunk 1 of adam (5000 bytes in 4096-byte chunks): bytes 4096..5000.
	if want := []proto.BadChunk{{Buffer: "adam", Section: "adam", Chunk: 1, Offset: 4096, Length: 904}}; !slices.Equal(perr.BadChunks, want) {
		t.Fatalf("bad chunks %+v, want %+v", perr.BadChunks, want)
	}
	var st proto.Status
	c.must(proto.TStatus, nil, &st)
	if s := st.Store; s == nil || s.ChecksumFailures != 1 || s.BadGenerations != 1 || s.Commits != 2 || s.Restores != 2 {
		t.Fatalf("status store counters after a corrupt restore: %+v, want 1 checksum failure, 1 bad generation, 2 commits, 2 restores", s)
	}
	if got := c.steps(); !slices.Equal(got, []int64{1}) {
		t.Fatalf("generations after corruption %v, want [1]", got)
	}
	c.must(proto.TRestore, proto.StepReq{Step: -1}, &ar)
	if ar.Step != 1 {
		t.Fatalf("newest restorable is %d, want 1", ar.Step)
	}
}

func TestSnapshotOverBudget(t *testing.T) {
	sock := storeServer(t, t.TempDir(), 1<<20)
	c := newClient(t, sock)
	code := c.call(proto.TRegister, regReq(0, proto.BufferSpec{Name: "huge", Size: 4 << 20}), nil)
	if code != proto.CodeNoSpace {
		t.Fatalf("register beyond the budget: %q, want no_space", code)
	}
	// The refusal is counted where an operator sees it.
	var st proto.Status
	c.must(proto.TStatus, nil, &st)
	if s := st.Store; s == nil || s.SaveFailures != 1 || s.OverBudget != 1 || s.NoSpace != 0 {
		t.Fatalf("status store counters after a refused save: %+v, want 1 failure, over budget", s)
	}
	if st.Memory == nil || st.Memory.BudgetRefusals != 1 {
		t.Fatalf("status memory after a refused save: %+v, want 1 budget refusal", st.Memory)
	}
}

func TestSnapshotDisabled(t *testing.T) {
	_, sock := startServer(t, os.Getuid(), nil)
	c := newClient(t, sock)
	if code := c.call(proto.TRegister, regReq(0, twoBufs...), nil); code != proto.CodeDisabled {
		t.Fatalf("register without a store: %q, want disabled", code)
	}
}

// layoutServer runs a server with the given test layout over the store at
// root; stop ends it (and its store) before the test does.
func layoutServer(t *testing.T, root, layout string) (sock string, stop func()) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "agent.sock")
	s, err := Listen(sock, Info{Job: "42", Node: "n1", Spec: "arc", Version: "test", UID: os.Getuid()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetTestLayout(layout); err != nil {
		t.Fatal(err)
	}
	alloc, err := hostmem.NewAllocator(hostmem.Config{NoPin: true})
	if err != nil {
		t.Fatal(err)
	}
	st, err := tmpfs.Open(tmpfs.Options{Root: root, JobID: "42", Keep: 1, Alloc: alloc})
	if err != nil {
		t.Fatal(err)
	}
	s.AttachStore(st)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			st.Close()
		})
	}
	t.Cleanup(stop)
	return sock, stop
}

// layoutBufs have sizes that are not multiples of the 4096-byte chunks,
// and an empty buffer.
var layoutBufs = []proto.BufferSpec{{Name: "params", Size: 10_000, Replicated: true}, {Name: "adam", Size: 5_001}, {Name: "none", Size: 0}}

func patterned(bufs []proto.BufferSpec, seed byte) map[string][]byte {
	out := map[string][]byte{}
	for k, b := range bufs {
		p := make([]byte, b.Size)
		for i := range p {
			p[i] = byte(i*7+k*31) ^ seed
		}
		out[b.Name] = p
	}
	return out
}

func sizesOf(bufs []proto.BufferSpec) map[string]int64 {
	out := map[string]int64{}
	for _, b := range bufs {
		out[b.Name] = b.Size
	}
	return out
}

// saveRegions saves data through the reply's regions, as a client does,
// and commits with crcs(arena, reply) as crc32c.
func (c *client) saveRegions(step int64, data map[string][]byte, crcs func([]byte, proto.ArenaReply) map[string][]uint32) (proto.ArenaReply, string) {
	c.t.Helper()
	var ar proto.ArenaReply
	c.must(proto.TSave, proto.StepReq{Step: step}, &ar)
	m := mapArena(c.t, ar.Arena, ar.ArenaSize, unix.PROT_READ|unix.PROT_WRITE)
	for _, r := range ar.Regions {
		copy(m[r.ArenaOffset:r.ArenaOffset+r.Size], data[r.Buffer][r.Offset:])
	}
	req := proto.Commit{Step: step}
	if crcs != nil {
		req.CRC32C = crcs(m, ar)
	}
	return ar, c.call(proto.TCommit, req, nil)
}

// sectionCRCs are the right checksums: per section, per 4096-byte chunk.
func sectionCRCs(m []byte, ar proto.ArenaReply) map[string][]uint32 {
	out := map[string][]uint32{}
	for _, s := range ar.Sections {
		out[s.Name] = tmpfs.ChunkCRCs(m[s.ArenaOffset:s.ArenaOffset+s.Size], 4096, 1)
	}
	return out
}

// restoreRegions restores step and copies it out through the reply's
// regions.
func (c *client) restoreRegions(step int64, bufs []proto.BufferSpec) (proto.ArenaReply, map[string][]byte) {
	c.t.Helper()
	var ar proto.ArenaReply
	c.must(proto.TRestore, proto.StepReq{Step: step}, &ar)
	m := mapArena(c.t, ar.Arena, ar.ArenaSize, unix.PROT_READ)
	out := patterned(bufs, 0xEE) // anything but the saved bytes
	for _, r := range ar.Regions {
		copy(out[r.Buffer][r.Offset:r.Offset+r.Size], m[r.ArenaOffset:])
	}
	c.must(proto.TRelease, proto.StepReq{Step: ar.Step}, nil)
	return ar, out
}

// TestSnapshotLayouts: save and restore replies name regions and sections
// that keep the protocol's rules, with the identity layout (one region and
// one section per buffer, of its name, at the buffer's offset) and the
// scatter test layout (pieces in permuted order across two sections,
// straddling chunks), and a round trip through the regions restores every
// buffer.
func TestSnapshotLayouts(t *testing.T) {
	for _, tc := range []struct {
		layout string
		check  func(t *testing.T, ar proto.ArenaReply)
	}{
		{"", func(t *testing.T, ar proto.ArenaReply) {
			if len(ar.Sections) != len(layoutBufs) || len(ar.Regions) != 2 {
				t.Fatalf("identity: %d sections, %d regions; want one section per buffer, one region per non-empty one", len(ar.Sections), len(ar.Regions))
			}
			for i, b := range layoutBufs {
				s := ar.Sections[i]
				if s.Name != b.Name || s.Size != b.Size || ar.Buffers[i].Offset != s.ArenaOffset && b.Size > 0 {
					t.Errorf("identity: buffer %+v, section %+v", ar.Buffers[i], s)
				}
				if b.Size > 0 && !slices.Contains(ar.Regions, proto.Region{Buffer: b.Name, Size: b.Size, ArenaOffset: s.ArenaOffset}) {
					t.Errorf("identity: no whole region of %q at %d in %+v", b.Name, s.ArenaOffset, ar.Regions)
				}
			}
		}},
		{"scatter", func(t *testing.T, ar proto.ArenaReply) {
			if len(ar.Sections) != 2 || len(ar.Regions) <= len(layoutBufs) {
				t.Fatalf("scatter: %d sections, %d regions", len(ar.Sections), len(ar.Regions))
			}
			for _, p := range ar.Buffers {
				if p.Size > 0 && p.Offset != -1 {
					t.Errorf("scatter: buffer %+v has an offset; a client without regions must refuse it", p)
				}
			}
			// Some chunk is filled by more than one region, and some
			// region crosses a chunk boundary.
			shared, crossing := false, false
			for _, r := range ar.Regions {
				s := ar.Sections[slices.IndexFunc(ar.Sections, func(s proto.Section) bool {
					return s.ArenaOffset <= r.ArenaOffset && r.ArenaOffset < s.ArenaOffset+s.Size
				})]
				lo, hi := r.ArenaOffset-s.ArenaOffset, r.ArenaOffset-s.ArenaOffset+r.Size
				shared = shared || lo%4096 != 0 && lo > 0
				crossing = crossing || lo/4096 != (hi-1)/4096
			}
			if !shared || !crossing {
				t.Errorf("scatter: regions %+v: chunk shared %v, boundary crossed %v", ar.Regions, shared, crossing)
			}
			inArena := slices.SortedFunc(slices.Values(ar.Regions), func(a, b proto.Region) int { return cmp.Compare(a.ArenaOffset, b.ArenaOffset) })
			for i := 1; i < len(inArena); i++ {
				if inArena[i].Buffer == inArena[i-1].Buffer && inArena[i].Offset < inArena[i-1].Offset {
					return // the arena holds the buffers' bytes in another order
				}
			}
			t.Errorf("scatter: regions %+v lie in the arena in buffer order", ar.Regions)
		}},
	} {
		t.Run("layout="+tc.layout, func(t *testing.T) {
			sock, _ := layoutServer(t, t.TempDir(), tc.layout)
			c := newClient(t, sock)
			c.must(proto.TRegister, regReq(0, layoutBufs...), nil)
			for step, crcs := range []func([]byte, proto.ArenaReply) map[string][]uint32{sectionCRCs, nil} {
				data := patterned(layoutBufs, byte(step))
				ar, code := c.saveRegions(int64(step), data, crcs)
				if code != "" {
					t.Fatalf("commit of step %d: %s", step, code)
				}
				if err := proto.CheckLayout(sizesOf(layoutBufs), ar.ArenaSize, ar.Sections, ar.Regions, true); err != nil {
					t.Fatalf("save reply: %v", err)
				}
				tc.check(t, ar)
				rr, got := c.restoreRegions(int64(step), layoutBufs)
				if err := proto.CheckLayout(sizesOf(layoutBufs), rr.ArenaSize, rr.Sections, rr.Regions, false); err != nil {
					t.Fatalf("restore reply: %v", err)
				}
				if !slices.Equal(rr.Regions, ar.Regions) || !slices.Equal(rr.Sections, ar.Sections) || !slices.Equal(rr.Buffers, ar.Buffers) {
					t.Fatalf("restore layout %+v differs from the save's %+v", rr, ar)
				}
				for name, want := range data {
					if !bytes.Equal(got[name], want) {
						t.Fatalf("step %d: buffer %q differs after the round trip", step, name)
					}
				}
			}
		})
	}
}

// TestSnapshotSectionChecksums: a commit's crc32c is keyed by section:
// the agent records what the client sends (a wrong CRC makes the
// generation corrupt at restore) and refuses a crc32c that does not have
// one list per section with one CRC per chunk.
func TestSnapshotSectionChecksums(t *testing.T) {
	byBuffer := func(m []byte, ar proto.ArenaReply) map[string][]uint32 {
		out := map[string][]uint32{}
		for _, b := range ar.Buffers {
			out[b.Name] = make([]uint32, (b.Size+4095)/4096)
		}
		return out
	}
	edit := func(f func(map[string][]uint32)) func([]byte, proto.ArenaReply) map[string][]uint32 {
		return func(m []byte, ar proto.ArenaReply) map[string][]uint32 {
			crcs := sectionCRCs(m, ar)
			f(crcs)
			return crcs
		}
	}
	for _, tc := range []struct {
		name    string
		layout  string
		crcs    func([]byte, proto.ArenaReply) map[string][]uint32
		commit  string // error code of the commit
		restore string // error code of the restore after a commit
	}{
		{"right", "scatter", sectionCRCs, "", ""},
		{"right, identity (sections are the buffers)", "", sectionCRCs, "", ""},
		{"identity keyed by buffer", "", byBuffer, "", proto.CodeCorrupt}, // the names fit; the zero CRCs do not
		{"wrong value", "scatter", edit(func(c map[string][]uint32) { c["scatter-1"][0]++ }), "", proto.CodeCorrupt},
		{"keyed by buffer", "scatter", byBuffer, proto.CodeInvalid, ""},
		{"section missing", "scatter", edit(func(c map[string][]uint32) { delete(c, "scatter-0") }), proto.CodeInvalid, ""},
		{"extra entry", "scatter", edit(func(c map[string][]uint32) { c["params"] = nil }), proto.CodeInvalid, ""},
		{"a chunk short", "scatter", edit(func(c map[string][]uint32) { c["scatter-0"] = c["scatter-0"][1:] }), proto.CodeInvalid, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock, _ := layoutServer(t, t.TempDir(), tc.layout)
			c := newClient(t, sock)
			c.must(proto.TRegister, regReq(0, layoutBufs...), nil)
			if _, code := c.saveRegions(1, patterned(layoutBufs, 1), tc.crcs); code != tc.commit {
				t.Fatalf("commit: %q, want %q", code, tc.commit)
			}
			if tc.commit != "" {
				c.must(proto.TAbort, proto.StepReq{Step: 1}, nil) // a refused commit leaves the save open
				return
			}
			if code := c.call(proto.TRestore, proto.StepReq{Step: 1}, nil); code != tc.restore {
				t.Fatalf("restore: %q, want %q", code, tc.restore)
			}
		})
	}
}

// TestSnapshotRestoreUsesTheSavedLayout: a generation is restored through
// the regions it was saved with, whatever the agent's layout is now, and
// a manifest from before regions (no sources, no regions) restores as
// whole buffers.
func TestSnapshotRestoreUsesTheSavedLayout(t *testing.T) {
	for _, tc := range []struct {
		name          string
		saved, now    string
		stripManifest bool
	}{
		{"scatter, then identity", "scatter", "", false},
		{"identity, then scatter", "", "scatter", false},
		{"manifest from before regions", "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			sock, stop := layoutServer(t, root, tc.saved)
			c := newClient(t, sock)
			c.must(proto.TRegister, regReq(3, layoutBufs...), nil)
			data := patterned(layoutBufs, 5)
			saved, code := c.saveRegions(5, data, sectionCRCs)
			if code != "" {
				t.Fatalf("commit: %s", code)
			}
			c.c.Close()
			stop()
			if tc.stripManifest {
				stripRegions(t, root, 3, 5)
			}
			sock, _ = layoutServer(t, root, tc.now)
			d := newClient(t, sock)
			d.must(proto.TRegister, regReq(3, layoutBufs...), nil)
			ar, got := d.restoreRegions(5, layoutBufs)
			if !slices.Equal(ar.Regions, saved.Regions) || !slices.Equal(ar.Sections, saved.Sections) {
				t.Fatalf("restore regions %+v sections %+v, saved with %+v %+v", ar.Regions, ar.Sections, saved.Regions, saved.Sections)
			}
			for name, want := range data {
				if !bytes.Equal(got[name], want) {
					t.Fatalf("buffer %q differs after the restore", name)
				}
			}
		})
	}
}

// stripRegions rewrites a generation's manifest as an agent from before
// regions wrote it, with a commit marker to match.
func stripRegions(t *testing.T, root string, rank int, step int64) {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(tmpfs.JobPath(root, os.Getuid(), "42"), fmt.Sprintf("r%d", rank), "state", fmt.Sprintf("g%d-*", step)))
	if len(dirs) != 1 {
		t.Fatalf("generations of step %d: %v", step, dirs)
	}
	raw, err := os.ReadFile(filepath.Join(dirs[0], "MANIFEST"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if m["sources"] == nil || m["regions"] == nil {
		t.Fatalf("the manifest has no sources or regions to strip: %s", raw)
	}
	delete(m, "sources")
	delete(m, "regions")
	raw, _ = json.Marshal(m)
	var mk map[string]any
	mraw, err := os.ReadFile(filepath.Join(dirs[0], "COMMITTED"))
	if err != nil || json.Unmarshal(mraw, &mk) != nil {
		t.Fatalf("commit marker: %v", err)
	}
	mk["manifest_bytes"], mk["manifest_crc32c"] = len(raw), crc32c.Checksum(raw)
	mraw, _ = json.Marshal(mk)
	for name, data := range map[string][]byte{"MANIFEST": raw, "COMMITTED": mraw} {
		if err := os.WriteFile(filepath.Join(dirs[0], name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBadChunks: a corrupt chunk is named by the buffer bytes it held, one
// entry per region it overlaps; bytes no region maps are named by section.
func TestBadChunks(t *testing.T) {
	identity := &tmpfs.Manifest{ChunkSize: 4096, Buffers: []tmpfs.Buffer{{Name: "w", Offset: 0, Size: 10000}, {Name: "v", Offset: 12288, Size: 100}}}
	// Two sections; section s0 holds v[0:50] then w[6000:10000] (crossing
	// chunk 0 and 1), s1 holds w[0:6000]; agent-only section aor@w.
	regions := &tmpfs.Manifest{ChunkSize: 4096,
		Sources: []tmpfs.Source{{Name: "w", Size: 10000}, {Name: "v", Size: 50}},
		Buffers: []tmpfs.Buffer{{Name: "s0", Offset: 0, Size: 4050}, {Name: "s1", Offset: 8192, Size: 6000}, {Name: "aor@w", Offset: 16384, Size: 100}},
		Regions: []tmpfs.Region{
			{Buffer: "v", Offset: 0, Size: 50, ArenaOffset: 0},
			{Buffer: "w", Offset: 6000, Size: 4000, ArenaOffset: 50},
			{Buffer: "w", Offset: 0, Size: 6000, ArenaOffset: 8192},
		}}
	tests := []struct {
		name string
		m    *tmpfs.Manifest
		bad  []tmpfs.BadChunk
		want []proto.BadChunk
	}{
		{"identity", identity, []tmpfs.BadChunk{{Buffer: "w", Index: 2, Offset: 8192, Length: 1808}, {Buffer: "v", Index: 0, Offset: 0, Length: 100}},
			[]proto.BadChunk{{Buffer: "w", Section: "w", Chunk: 2, Offset: 8192, Length: 1808}, {Buffer: "v", Section: "v", Chunk: 0, Offset: 0, Length: 100}}},
		{"chunk over two buffers", regions, []tmpfs.BadChunk{{Buffer: "s0", Index: 0, Offset: 0, Length: 4050}},
			[]proto.BadChunk{{Buffer: "v", Section: "s0", Chunk: 0, Offset: 0, Length: 50}, {Buffer: "w", Section: "s0", Chunk: 0, Offset: 6000, Length: 4000}}},
		{"second chunk of a section", regions, []tmpfs.BadChunk{{Buffer: "s1", Index: 1, Offset: 4096, Length: 1904}},
			[]proto.BadChunk{{Buffer: "w", Section: "s1", Chunk: 1, Offset: 4096, Length: 1904}}},
		{"agent-only section", regions, []tmpfs.BadChunk{{Buffer: "aor@w", Index: 0, Offset: 0, Length: 100}},
			[]proto.BadChunk{{Section: "aor@w", Chunk: 0, Offset: 0, Length: 100}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := badChunks(tc.m, tc.bad); !slices.Equal(got, tc.want) {
				t.Fatalf("badChunks = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestSnapshotRestoreVerifiedByClient: a restore with verify "client" is
// served without the agent reading the arena: the reply carries the
// manifest's checksums, and a corrupt arena is still served. The client's
// release then reports the chunks it read wrong; the agent verifies the
// generation itself: corrupt in the arena, it is marked bad and the reply
// names the chunk; intact, it is kept and the reply says the client's copy
// went wrong. Checksums that do not fit in a reply make the agent verify
// before replying, as without verify.
func TestSnapshotRestoreVerifiedByClient(t *testing.T) {
	for _, tc := range []struct {
		name     string
		corrupt  bool // flip a byte of params' chunk 1 in step 2's arena
		report   bool // the release names that chunk
		limit    int  // restoreReplyLimit; 0: the default
		restore  string
		crcs     bool // the reply carries checksums
		release  string
		match    string // in the release's error
		steps    []int64
		restored int64 // newest restorable afterwards
	}{
		{name: "intact, nothing reported", crcs: true, steps: []int64{2, 1}, restored: 2},
		{name: "corrupt, reported", corrupt: true, report: true, crcs: true, release: proto.CodeCorrupt,
			match: `buffer "params" chunk 1`, steps: []int64{1}, restored: 1},
		{name: "intact, reported", report: true, crcs: true, release: proto.CodeCorrupt,
			match: "verifies in the arena", steps: []int64{2, 1}, restored: 2},
		{name: "checksums too large for a reply", corrupt: true, limit: 64, restore: proto.CodeCorrupt, steps: []int64{1}, restored: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.limit > 0 {
				defer func(old int) { restoreReplyLimit = old }(restoreReplyLimit)
				restoreReplyLimit = tc.limit
			}
			sock := storeServer(t, t.TempDir(), 0)
			c := newClient(t, sock)
			c.must(proto.TRegister, regReq(0, twoBufs...), nil)
			c.saveFilled(1, 1)
			c.saveFilled(2, 2)
			var ar proto.ArenaReply
			c.must(proto.TRestore, proto.StepReq{Step: 2}, &ar) // verified by the agent: intact
			if ar.CRC32C != nil {
				t.Fatalf("a restore without verify carries checksums: %v", ar.CRC32C)
			}
			c.must(proto.TRelease, proto.StepReq{Step: 2}, nil)
			if tc.corrupt {
				m := mapArena(t, ar.Arena, ar.ArenaSize, unix.PROT_READ|unix.PROT_WRITE)
				m[ar.Buffers[0].Offset+4097] ^= 0xFF
			}
			ar = proto.ArenaReply{}
			if code := c.call(proto.TRestore, proto.Restore{Step: 2, Verify: proto.VerifyClient}, &ar); code != tc.restore {
				t.Fatalf("restore: %q, want %q", code, tc.restore)
			}
			if tc.restore == "" {
				if got := ar.CRC32C != nil; got != tc.crcs {
					t.Fatalf("the reply carries checksums: %v, want %v", got, tc.crcs)
				}
				if tc.crcs {
					m := mapArena(t, ar.Arena, ar.ArenaSize, unix.PROT_READ)
					for _, b := range ar.Buffers {
						want := tmpfs.ChunkCRCs(bytes.Repeat([]byte{2}, int(b.Size)), 4096, 1)
						if ar.ChunkSize != 4096 || !slices.Equal(ar.CRC32C[b.Name], want) {
							t.Fatalf("section %q: chunk size %d, checksums %v; want 4096, %v", b.Name, ar.ChunkSize, ar.CRC32C[b.Name], want)
						}
						if got := crc32c.Checksum(m[b.Offset+4096 : b.Offset+8192]); b.Name == "params" && (got == want[1]) == tc.corrupt {
							t.Fatalf("params chunk 1 in the arena: CRC %#x, manifest %#x, corrupted %v", got, want[1], tc.corrupt)
						}
					}
				}
				rel := proto.Release{Step: 2}
				if tc.report {
					rel.BadChunks = []proto.MisreadChunk{{Section: "params", Index: 1, Got: 0xdead}}
				}
				c.id++
				err := proto.Call(c.c, proto.TRelease, c.id, rel, nil)
				var perr *proto.Error
				switch {
				case tc.release == "" && err != nil:
					t.Fatalf("release: %v", err)
				case tc.release != "" && (!errors.As(err, &perr) || perr.Code != tc.release || !strings.Contains(perr.Message, tc.match)):
					t.Fatalf("release: %v, want %s containing %q", err, tc.release, tc.match)
				}
				// The agent's own verdict names the chunk it found bad in the
				// arena; an intact arena names none.
				if perr != nil {
					if want := tc.corrupt; (len(perr.BadChunks) == 1 && perr.BadChunks[0].Buffer == "params" && perr.BadChunks[0].Chunk == 1) != want {
						t.Fatalf("release's bad_chunks %+v; want params chunk 1: %v", perr.BadChunks, want)
					}
				}
				if code := c.call(proto.TRelease, proto.StepReq{Step: 2}, nil); code != proto.CodeBadState {
					t.Fatalf("a second release: %q, want bad_state (the first released the pin)", code)
				}
			}
			if got := c.steps(); !slices.Equal(got, tc.steps) {
				t.Fatalf("generations %v, want %v", got, tc.steps)
			}
			c.must(proto.TRestore, proto.StepReq{Step: -1}, &ar)
			if ar.Step != tc.restored {
				t.Fatalf("newest restorable is %d, want %d", ar.Step, tc.restored)
			}
		})
	}
}
