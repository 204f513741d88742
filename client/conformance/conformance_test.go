// The shared conformance vectors (vectors.json, format in README.md) run
// here against the Go codec and the Go client with a real in-process agent,
// and, through the conformance-agent command, against the Python client's
// own runner: both clients must pass the same vectors against the same
// agent.
package conformance_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
)

type vectors struct {
	Frames []struct {
		Name        string     `json:"name"`
		Type        proto.Type `json:"type"`
		ID          uint32     `json:"id"`
		PayloadJSON string     `json:"payload_json"`
		Hex         string     `json:"hex"`
	} `json:"frames"`
	BadFrames []struct {
		Name  string `json:"name"`
		Hex   string `json:"hex"`
		Error string `json:"error"`
	} `json:"bad_frames"`
	Scenarios []scenario `json:"scenarios"`
}

type scenario struct {
	Name      string `json:"name"`
	Rank      int    `json:"rank"`
	World     int    `json:"world"`
	ChunkSize int64  `json:"chunk_size"`
	Agent     string `json:"agent"` // the agent's arena layout: "" or "scatter"
	Ops       []op   `json:"ops"`
}

// agents are the values of a scenario's "agent" (README.md).
var agents = []string{"", "scatter"}

type bufSpec struct {
	Name       string `json:"name"`
	Size       int    `json:"size"`
	Replicated bool   `json:"replicated"`
}

type op struct {
	Op string `json:"op"`
	bufSpec
	Seed    int             `json:"seed"`
	Step    int64           `json:"step"`
	Expect  json.RawMessage `json:"expect"`
	Buffer  string          `json:"buffer"`
	Offset  int64           `json:"offset"`
	Buffers []bufSpec       `json:"buffers"`
	Error   string          `json:"error"`
}

func load(t *testing.T) vectors {
	t.Helper()
	b, err := os.ReadFile("vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("vectors.json: %v", err)
	}
	if len(v.Frames) == 0 || len(v.BadFrames) == 0 || len(v.Scenarios) == 0 {
		t.Fatal("vectors.json: a section is empty")
	}
	return v
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("hex %q: %v", s, err)
	}
	return b
}

func TestFrames(t *testing.T) {
	for _, v := range load(t).Frames {
		t.Run(v.Name, func(t *testing.T) {
			want := unhex(t, v.Hex)
			got, err := proto.Append(nil, proto.Frame{Type: v.Type, ID: v.ID, Payload: []byte(v.PayloadJSON)})
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("encoded %x, %v; want %s", got, err, v.Hex)
			}
			f, err := proto.Decode(bytes.NewReader(want))
			if err != nil || f.Type != v.Type || f.ID != v.ID {
				t.Fatalf("decoded %+v, %v; want type %d id %d", f, err, v.Type, v.ID)
			}
			if !sameJSON(t, f.Payload, []byte(v.PayloadJSON)) {
				t.Fatalf("decoded payload %s, want %s", f.Payload, v.PayloadJSON)
			}
		})
	}
}

// sameJSON compares two payloads as JSON values; empty means {}.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	for _, p := range []struct {
		raw []byte
		v   *any
	}{{a, &x}, {b, &y}} {
		if len(p.raw) == 0 {
			p.raw = []byte("{}")
		}
		if err := json.Unmarshal(p.raw, p.v); err != nil {
			t.Fatalf("payload %q: %v", p.raw, err)
		}
	}
	xa, _ := json.Marshal(x) // Marshal sorts object keys
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

func TestBadFrames(t *testing.T) {
	classes := map[string]error{
		"length":    proto.ErrLength,
		"too_large": proto.ErrTooLarge,
		"version":   proto.ErrVersion,
		"flags":     proto.ErrFlags,
		"payload":   proto.ErrPayload,
		"truncated": io.ErrUnexpectedEOF,
	}
	for _, v := range load(t).BadFrames {
		t.Run(v.Name, func(t *testing.T) {
			want, ok := classes[v.Error]
			if !ok {
				t.Fatalf("unknown error class %q in vectors.json", v.Error)
			}
			f, err := proto.Decode(bytes.NewReader(unhex(t, v.Hex)))
			if !errors.Is(err, want) {
				t.Fatalf("Decode = %+v, %v; want %v", f, err, want)
			}
		})
	}
}

// TestScenarioRules checks the vectors themselves: a scenario must not
// change a buffer while a save may still be copying it, which the protocol
// forbids callers (a client that copies in the background would then save
// the new bytes, and pass or fail by timing).
func TestScenarioRules(t *testing.T) {
	for i, sc := range load(t).Scenarios {
		if !slices.Contains(agents, sc.Agent) {
			t.Errorf("vectors.json scenario %d %q: agent %q is none of %q; teach the harnesses and conformance-agent the new one", i, sc.Name, sc.Agent, agents)
		}
		saving := false
		for j, o := range sc.Ops {
			switch o.Op {
			case "save":
				saving = saving || o.Error == ""
			case "wait", "reconnect":
				saving = false
			case "fill":
				if saving {
					t.Errorf("vectors.json scenario %d %q op %d: fill while a save may be copying; add a wait before it", i, sc.Name, j)
				}
			}
		}
	}
}

func TestScenarios(t *testing.T) {
	for i, sc := range load(t).Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			a, err := agenttest.Start(agenttest.Options{Layout: sc.Agent})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := a.Close(); err != nil {
					t.Errorf("stopping the agent: %v", err)
				}
			}()
			r := &runner{t: t, sc: sc, socket: a.Socket}
			defer r.close()
			r.connect(nil)
			for j, o := range sc.Ops {
				r.where = fmt.Sprintf("scenario %d op %d (%s)", i, j, o.Op)
				r.do(o)
			}
		})
	}
}

// runner plays one scenario with the Go client.
type runner struct {
	t       *testing.T
	sc      scenario
	socket  string
	where   string
	c       *client.Client
	bufs    []bufSpec
	data    [][]byte
	pending []*client.Handle // saves not yet waited for
}

func (r *runner) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	r.t.Cleanup(cancel)
	return ctx
}

func (r *runner) fatalf(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf("%s: %s", r.where, fmt.Sprintf(format, args...))
}

// connect opens a session as the scenario's rank and registers bufs.
func (r *runner) connect(bufs []bufSpec) {
	opt := client.Options{Socket: r.socket, Rank: r.sc.Rank, World: max(r.sc.World, 1), ChunkSize: r.sc.ChunkSize}
	if opt.World > 1 {
		// The only rank present: the job-wide choice is this rank's own.
		opt.Agree = func(_ context.Context, mine []int64) ([]int64, error) { return mine, nil }
	}
	c, err := client.Open(r.ctx(), opt)
	if err != nil {
		r.fatalf("open: %v", err)
	}
	r.c, r.bufs, r.data, r.pending = c, nil, nil, nil
	for _, b := range bufs {
		r.register(b, "")
	}
}

func (r *runner) close() {
	if r.c != nil {
		if err := r.c.Close(); err != nil {
			r.t.Errorf("close: %v", err)
		}
		r.c = nil
	}
}

func (r *runner) register(b bufSpec, wantErr string) {
	r.t.Helper()
	kind := client.Sharded
	if b.Replicated {
		kind = client.Replicated
	}
	d := make([]byte, b.Size)
	err := r.c.Register(b.Name, d, kind)
	r.check(err, wantErr)
	if err == nil {
		r.bufs, r.data = append(r.bufs, b), append(r.data, d)
	}
}

// check compares an op's outcome with its expected error: "" none,
// "client" one from the client itself, else the agent's error code.
func (r *runner) check(err error, want string) {
	r.t.Helper()
	var ae *client.Error
	switch {
	case want == "" && err != nil:
		r.fatalf("unexpected error: %v", err)
	case want == "":
	case err == nil:
		r.fatalf("succeeded, want error %q", want)
	case want == "client" && errors.As(err, &ae):
		r.fatalf("the agent refused (%v); the client should have refused first", err)
	case want == "client":
	case !errors.As(err, &ae):
		r.fatalf("error %v is not from the agent, want code %q", err, want)
	case ae.Code != want:
		r.fatalf("agent error %v, want code %q", err, want)
	}
}

// fill is the vectors' pattern: byte i of buffer k after fill(seed) is
// ((i*2654435761 + (seed+k)*40503) mod 2**32) >> 13 & 0xff.
func fill(p []byte, seed int) {
	c := uint32(seed) * 40503
	for i := range p {
		p[i] = byte((uint32(i)*2654435761 + c) >> 13)
	}
}

func (r *runner) do(o op) {
	r.t.Helper()
	switch o.Op {
	case "register":
		r.register(o.bufSpec, o.Error)
	case "fill":
		for k, d := range r.data {
			fill(d, o.Seed+k)
		}
	case "check":
		for k, d := range r.data {
			want := make([]byte, len(d))
			fill(want, o.Seed+k)
			if !bytes.Equal(d, want) {
				i := 0
				for d[i] == want[i] {
					i++
				}
				r.fatalf("buffer %q differs from fill(%d) at byte %d", r.bufs[k].Name, o.Seed+k, i)
			}
		}
	case "save":
		h := r.c.Save(o.Step)
		if o.Error != "" {
			r.check(h.Wait(r.ctx()), o.Error)
			return
		}
		r.pending = append(r.pending, h)
	case "wait":
		if len(r.pending) == 0 {
			r.fatalf("no save to wait for")
		}
		for _, h := range r.pending {
			if err := h.Wait(r.ctx()); err != nil && o.Error == "" {
				r.fatalf("save of step %d: %v", h.Step(), err)
			} else if h == r.pending[len(r.pending)-1] {
				r.check(err, o.Error)
			}
		}
		r.pending = nil
	case "generations":
		got, err := r.c.Generations(r.ctx())
		r.check(err, o.Error)
		if err == nil {
			var want []int64
			r.expect(o, &want)
			if !slices.Equal(got, want) && len(got)+len(want) > 0 {
				r.fatalf("generations %v, want %v", got, want)
			}
		}
	case "restore":
		step, ok, err := r.c.Restore(r.ctx())
		r.check(err, o.Error)
		if err == nil {
			var want *int64
			r.expect(o, &want)
			if ok != (want != nil) || ok && step != *want {
				r.fatalf("restored %d (ok %v), want %s", step, ok, o.Expect)
			}
		}
	case "restore_step":
		err := r.c.RestoreStep(r.ctx(), o.Step)
		r.check(err, o.Error)
		if err == nil && len(o.Expect) > 0 {
			var want int64
			r.expect(o, &want)
			if want != o.Step {
				r.fatalf("restore_step %d expects %d", o.Step, want)
			}
		}
	case "reconnect":
		bufs := o.Buffers
		if bufs == nil {
			bufs = r.bufs
		}
		r.close()
		r.connect(bufs)
	case "corrupt":
		r.corrupt(o)
	default:
		r.fatalf("unknown op %q: teach the Go harness the new op (README.md defines it)", o.Op)
	}
}

func (r *runner) expect(o op, v any) {
	r.t.Helper()
	if err := json.Unmarshal(o.Expect, v); err != nil {
		r.fatalf("expect %s: %v", o.Expect, err)
	}
}

// manifest is what the corrupt op reads of a generation's MANIFEST.
type manifest struct {
	Arena   string           `json:"arena"` // file name next to the generation's directory
	Buffers []manifestBuffer `json:"buffers"`
	Sources []struct{}       `json:"sources"`
	Regions []proto.Region   `json:"regions"` // nil (with Sources): each buffer whole
}

type manifestBuffer struct {
	Name   string `json:"name"`
	Offset int64  `json:"offset"`
	Size   int64  `json:"size"`
}

// corrupt flips one byte of a committed generation's buffer in its arena
// file, found as the README says: through the status reply's store_dir.
func (r *runner) corrupt(o op) {
	r.t.Helper()
	conn, err := net.Dial("unix", r.socket)
	if err != nil {
		r.fatalf("status connection: %v", err)
	}
	defer conn.Close()
	var st proto.Status
	if err := proto.Call(conn, proto.TStatus, 1, nil, &st); err != nil {
		r.fatalf("status: %v", err)
	}
	dir := filepath.Join(st.StoreDir, fmt.Sprintf("r%d", r.sc.Rank), "state")
	ms, _ := filepath.Glob(filepath.Join(dir, fmt.Sprintf("g%d-*", o.Step), "MANIFEST"))
	if len(ms) != 1 {
		r.fatalf("manifests of step %d under %s: %v, want one", o.Step, dir, ms)
	}
	b, err := os.ReadFile(ms[0])
	if err != nil {
		r.fatalf("%v", err)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		r.fatalf("%s: %v", ms[0], err)
	}
	regions := m.Regions
	if regions == nil && m.Sources == nil { // from before regions
		for _, b := range m.Buffers {
			regions = append(regions, proto.Region{Buffer: b.Name, Size: b.Size, ArenaOffset: b.Offset})
		}
	}
	i := slices.IndexFunc(regions, func(x proto.Region) bool {
		return x.Buffer == o.Buffer && x.Offset <= o.Offset && o.Offset < x.Offset+x.Size
	})
	if i < 0 {
		r.fatalf("buffer %q offset %d is in no region of the manifest %s", o.Buffer, o.Offset, ms[0])
	}
	f, err := os.OpenFile(filepath.Join(dir, m.Arena), os.O_RDWR, 0)
	if err != nil {
		r.fatalf("%v", err)
	}
	defer f.Close()
	at := regions[i].ArenaOffset + o.Offset - regions[i].Offset
	one := make([]byte, 1)
	if _, err := f.ReadAt(one, at); err != nil {
		r.fatalf("%v", err)
	}
	one[0] ^= 0xff
	if _, err := f.WriteAt(one, at); err != nil {
		r.fatalf("%v", err)
	}
}

// TestPythonClient runs the Python client's own conformance runner against
// the conformance-agent command, built here from this tree.
func TestPythonClient(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "client", "python", "reft", "conformance.py")); err != nil {
		t.Fatalf("the Python client's conformance runner is missing: %v", err)
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed to check the Python client against the vectors: %v", err)
	}
	v := load(t)
	cases := len(v.Frames) + len(v.BadFrames) + len(v.Scenarios)
	vec, err := filepath.Abs("vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "conformance-agent")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./tests/conformance-agent")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./tests/conformance-agent: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, python, "-m", "reft.conformance", "--vectors", vec, "--agent-cmd", shellQuote(bin))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(root, "client", "python"))
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	passed := strings.Count(string(out), "PASS ")
	if err != nil {
		t.Fatalf("python3 -m reft.conformance: %v (%d cases passed)\n%s", err, passed, out)
	}
	if passed < cases {
		t.Fatalf("python3 -m reft.conformance passed %d cases of the %d in vectors.json:\n%s", passed, cases, out)
	}
	t.Logf("Python client: %d conformance cases passed", passed)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
