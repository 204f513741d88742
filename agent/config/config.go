// Package config loads /etc/reft/reft.toml, the site configuration shared by
// the SPANK plugin, the agent and the launcher.
//
// Decoding is strict: a key that reft does not know is an error that names
// the file, the key and its line. The TOML decoder matches field names case
// insensitively, so every key is also checked for its exact spelling.
// Every key has a default (see [Default] and etc/reft.toml); an absent file is
// an error only where the caller says so (see [Load]).
package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/BurntSushi/toml"

	"github.com/reft-hpc/reft/pmix/hostlist"
)

// DefaultPath is where the plugin and the agent look when nothing else is given.
const DefaultPath = "/etc/reft/reft.toml"

// EnvPath names the environment variable with which a user points reft's
// own commands (reft run, status, log, explain) at a configuration other
// than DefaultPath, as `tests/cluster/cluster env` does for the test
// cluster's. The plugin, the agent and root's `reft gc` never read it:
// their configuration comes from plugstack.conf or root's command line.
const EnvPath = "REFT_CONFIG"

// UserPath is the configuration a user's command reads when --config is
// not given: $REFT_CONFIG when set, else DefaultPath. Only DefaultPath
// may be missing (MissingOK): a file someone named must exist.
func UserPath() string {
	if p := os.Getenv(EnvPath); p != "" {
		return p
	}
	return DefaultPath
}

// MissingOK tells Load whether path may be missing: only DefaultPath
// (reft's commands work without an installed configuration).
func MissingOK(path string) bool { return path == DefaultPath }

// Config is the whole file. Sections and keys are documented in etc/reft.toml.
type Config struct {
	Store     Store     `toml:"store"`
	Persist   Persist   `toml:"persist"`
	Agent     Agent     `toml:"agent"`
	Heartbeat Heartbeat `toml:"heartbeat"`
	Protect   Protect   `toml:"protect"`
	Detect    Detect    `toml:"detect"`
	Log       Log       `toml:"log"`
	Metrics   Metrics   `toml:"metrics"`
	Run       Run       `toml:"run"`
	Topology  Topology  `toml:"topology"`
}

// Store is the node-local snapshot store.
type Store struct {
	// TmpfsRoot is the directory (on tmpfs) under which each job gets <jobid>/.
	TmpfsRoot string `toml:"tmpfs_root"`
	// MemoryBudget caps the snapshot memory of one job on one node.
	MemoryBudget MemoryBudget `toml:"memory_budget"`
	// HugeTLBFS is a hugetlbfs mount for the arena files ("": none, arenas
	// stay in TmpfsRoot with transparent huge pages advised).
	HugeTLBFS string `toml:"hugetlbfs"`
	// Keep is how many older completed generations per rank the store
	// keeps, on top of the ones the agent always keeps.
	Keep int `toml:"keep"`
	// MaxAge is how long a job's store may sit unchanged on a node before
	// any garbage collection (the job epilog, an agent's start, `reft gc`)
	// removes it whatever Slurm says: the net under every job end the
	// epilog missed. 0 disables it.
	MaxAge Duration `toml:"max_age"`
}

// Persist is the persistent (shared filesystem) checkpoint.
type Persist struct {
	// Dir is the persistent checkpoint directory; empty disables persistent
	// checkpoints unless the job's SPEC names persist_dir.
	Dir string `toml:"dir"`
	// FailuresPerNodeDay is f of the JIT model (failures per node per day)
	// from which persist=auto derives the interval.
	FailuresPerNodeDay float64 `toml:"failures_per_node_day"`
}

// Agent is the per-node, per-job daemon.
type Agent struct {
	// Binary is the absolute path of reft-agent.
	Binary string `toml:"binary"`
	// RunDir is a node-local directory for agent sockets and plugin state.
	RunDir string `toml:"run_dir"`
	// PortRange is the inclusive TCP port range the agents listen on.
	PortRange [2]int `toml:"port_range"`
	// PeerBind is the address the agents listen on for each other; "":
	// every interface.
	PeerBind string `toml:"peer_bind"`
	// PeerAuth is how agents authenticate each other: "munge" or "secret".
	PeerAuth string `toml:"peer_auth"`
	// PeerSecret is the per-job secret file for PeerAuth "secret", on a
	// filesystem every node of the job sees, in a directory private to
	// the user; the job's first agent creates it. %j stands for the job
	// id, %u for the uid, a leading ~/ for $HOME.
	PeerSecret string `toml:"peer_secret"`
	// StartTimeout is how long a step waits for its node's agent to answer.
	StartTimeout Duration `toml:"start_timeout"`
	// SlurmConf is slurm.conf's path for the agent's scontrol calls (the
	// job's nodes and their addresses); "": scontrol's default.
	SlurmConf string `toml:"slurm_conf"`
	// GPUHealth watches the node's NVIDIA GPUs through NVML
	// (agent/gpuhealth); off by itself where there is no NVIDIA driver.
	GPUHealth bool `toml:"gpu_health"`
}

// Heartbeat is the failure detector between agents.
type Heartbeat struct {
	Interval Duration `toml:"interval"`
	Timeout  Duration `toml:"timeout"`
}

// Protect is the redundancy the agents keep for each other.
type Protect struct {
	// BackgroundRate caps the bytes per second one agent sends plus
	// receives for background replication (GEMINI placement copies of the ranks'
	// unreplicated buffers); 0: unlimited. Restores are never limited.
	BackgroundRate Rate `toml:"background_rate"`
	// BackgroundBurst is the token bucket's depth: how many bytes may pass
	// at once after an idle spell.
	BackgroundBurst Size `toml:"background_burst"`
	// BackgroundSchedule is when background replication may use the
	// network: one of the Schedule* values.
	BackgroundSchedule string `toml:"background_schedule"`
	// LinkBandwidth is the node's network bandwidth the idle schedule
	// plans with (bytes per second); 0: measure it from the replication
	// connections. A site that knows its links (a NIC's rate, a shaper)
	// sets it: measurements read a shaper's bucket or a link shared with
	// the trainer wrongly.
	LinkBandwidth Rate `toml:"link_bandwidth"`
}

// The values of protect.background_schedule.
const (
	// SchedulePaused pauses replication while any local rank reports a
	// communication phase (comm_phase) and sends at once otherwise.
	SchedulePaused = "paused"
	// ScheduleIdle learns the job's communication timeline from those
	// reports and sends only chunks that fit the predicted idle spans
	// (agent/netsched, GEMINI section 5).
	ScheduleIdle = "idle"
	// ScheduleUnscheduled ignores the phases: only the rate limits.
	ScheduleUnscheduled = "unscheduled"
)

// Detect is the agents' failure detector (agent/detect): heartbeats to
// the watched peers, suspicion, confirmation by other agents, and rank
// hangs from the clients' progress.
type Detect struct {
	// Enabled turns the detector on.
	Enabled bool `toml:"enabled"`
	// Interval is the beat period to each watched peer.
	Interval Duration `toml:"interval"`
	// Timeout is the silence after which a watched peer is suspected (a
	// broken connection is suspected at once).
	Timeout Duration `toml:"timeout"`
	// Confirm is the slack other agents' answers about a suspect get past
	// the watch window (the round trip of their probe).
	Confirm Duration `toml:"confirm"`
	// Window is how long a suspect is watched (its agent and slurmd tried
	// four times, each attempt outlasting one lost SYN) before silence
	// condemns it: a flap or a stall shorter than this is no failure. A
	// refused connection (the process is gone) needs no window.
	Window Duration `toml:"window"`
	// Hang is the least a rank may go without progress (a save or a
	// progress message) before it counts as hung; 0: off. HangFactor
	// times the rank's median step time raises it (detect.HangTimeout).
	Hang       Duration `toml:"hang"`
	HangFactor float64  `toml:"hang_factor"`
}

// Log is the agent's logging.
type Log struct {
	// Dir receives <jobid>/<node>.jsonl.
	Dir string `toml:"dir"`
	// Level is one of trace, debug, info, warn, error.
	Level string `toml:"level"`
}

// Metrics is the agent's Prometheus export (agent/metrics, docs/METRICS.md).
type Metrics struct {
	// TextfileDir receives reft_<job>_<node>.prom for node_exporter's
	// textfile collector; empty: off. A root-made sticky world-writable
	// directory (mode 1777): the agent runs as the job's user.
	TextfileDir string `toml:"textfile_dir"`
}

// Run is `reft run`'s relaunch policy (flags of the same names override it).
type Run struct {
	// MaxRestarts caps the relaunches of one `reft run`.
	MaxRestarts int `toml:"max_restarts"`
	// MaxStalled is how many relaunches in a row may end with no newer
	// generation committed before `reft run` gives up.
	MaxStalled int `toml:"max_stalled"`
	// Backoff is the wait before the first relaunch; it doubles with each
	// stalled relaunch up to BackoffMax. reft run skips it before the
	// first relaunch after a spare took a lost node's slot.
	Backoff    Duration `toml:"backoff"`
	BackoffMax Duration `toml:"backoff_max"`
	// ProbeTimeout bounds the step that asks every node's agent for its
	// state after a failure.
	ProbeTimeout Duration `toml:"probe_timeout"`
}

// Topology is the site's failure domains: nodes that can fail together (a
// rack, a switch, a PDU). Sharding-group rings are spread across them.
type Topology struct {
	// Domains maps a domain label to a Slurm host list (`n[1-16]`).
	Domains map[string]string `toml:"domains"`
	// DomainPattern is a regular expression matched against node names:
	// its first capture group (the whole match without one) is the domain
	// of a node that Domains does not list.
	DomainPattern string `toml:"domain_pattern"`
}

// Validate checks the labels, host lists and pattern.
func (t Topology) Validate() error {
	_, err := t.resolver()
	return err
}

// DomainsOf returns the failure domain of each of nodes that has one
// (nodes without are domains of their own).
func (t Topology) DomainsOf(nodes []string) (map[string]string, error) {
	of, err := t.resolver()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, n := range nodes {
		if d := of(n); d != "" {
			out[n] = d
		}
	}
	return out, nil
}

// resolver compiles the table and the pattern into a node -> domain
// function.
func (t Topology) resolver() (func(string) string, error) {
	byNode := map[string]string{}
	for _, label := range sortedLabels(t.Domains) {
		if label == "" || strings.ContainsAny(label, "=[], \t") {
			return nil, fmt.Errorf("topology.domains: label %q must be a plain name, as in rack1", label)
		}
		hosts, err := hostlist.Expand(t.Domains[label])
		if err != nil {
			return nil, fmt.Errorf("topology.domains.%s = %q: %w; write a Slurm host list, as in \"n[1-16]\"", label, t.Domains[label], err)
		}
		if len(hosts) == 0 {
			return nil, fmt.Errorf("topology.domains.%s is empty; give its nodes as a Slurm host list, as in \"n[1-16]\"", label)
		}
		for _, h := range hosts {
			if prev, dup := byNode[h]; dup {
				return nil, fmt.Errorf("topology.domains puts node %s in both %s and %s; a node belongs to one domain", h, prev, label)
			}
			byNode[h] = label
		}
	}
	var re *regexp.Regexp
	if t.DomainPattern != "" {
		var err error
		if re, err = regexp.Compile(t.DomainPattern); err != nil {
			return nil, fmt.Errorf("topology.domain_pattern = %q: %w", t.DomainPattern, err)
		}
		if re.NumSubexp() > 1 {
			return nil, fmt.Errorf("topology.domain_pattern = %q has %d capture groups; use one, around the domain (as in \"^(r[0-9]+)n[0-9]+$\"), or none", t.DomainPattern, re.NumSubexp())
		}
	}
	return func(node string) string {
		if d, ok := byNode[node]; ok {
			return d
		}
		if re == nil {
			return ""
		}
		m := re.FindStringSubmatch(node)
		if m == nil {
			return ""
		}
		return m[len(m)-1]
	}, nil
}

func sortedLabels(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Default returns the configuration used for every key the file leaves out.
func Default() Config {
	return Config{
		Store: Store{
			TmpfsRoot:    "/dev/shm/reft",
			MemoryBudget: MemoryBudget{Fraction: 0.5},
			MaxAge:       Duration(72 * time.Hour),
		},
		// JIT section 6.5: f = 2e-3 per GPU-day (OPT-175B), 8 GPUs a node.
		Persist: Persist{FailuresPerNodeDay: 0.016},
		Agent: Agent{
			Binary:       "/usr/local/bin/reft-agent",
			RunDir:       "/run/reft",
			PortRange:    [2]int{47000, 47999},
			PeerAuth:     "munge",
			PeerSecret:   "~/.reft/secrets/%j",
			StartTimeout: Duration(10 * time.Second),
			GPUHealth:    true,
		},
		Heartbeat: Heartbeat{
			Interval: Duration(500 * time.Millisecond),
			Timeout:  Duration(2 * time.Second),
		},
		Protect: Protect{BackgroundRate: 2 << 30, BackgroundBurst: 64 << 20, BackgroundSchedule: SchedulePaused},
		Detect: Detect{Enabled: true, Interval: Duration(250 * time.Millisecond), Timeout: Duration(time.Second),
			Confirm: Duration(500 * time.Millisecond), Window: Duration(3 * time.Second), Hang: Duration(10 * time.Minute), HangFactor: 10},
		Log: Log{Dir: "/var/log/reft", Level: "info"},
		Run: Run{MaxRestarts: 10, MaxStalled: 3, Backoff: Duration(time.Second),
			BackoffMax: Duration(time.Minute), ProbeTimeout: Duration(30 * time.Second)},
	}
}

// Load reads path on top of [Default]. A missing file gives the defaults when
// missingOK is true and an error otherwise.
func Load(path string, missingOK bool) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if missingOK && errors.Is(err, fs.ErrNotExist) {
			return Default(), nil
		}
		return Config{}, fmt.Errorf("reft config %s: %w (install it with `make install` or point config= in plugstack.conf at it)", path, err)
	}
	return Parse(path, data)
}

// Parse decodes data (named path in errors) on top of [Default] and validates it.
func Parse(path string, data []byte) (Config, error) {
	c := Default()
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&c)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			// The parser quotes the offending input raw: a newline in it
			// would split the error, which reaches the job's stderr.
			return Config{}, fmt.Errorf("reft config %s:%d: %s", path, pe.Position.Line, oneLine(pe.Message))
		}
		return Config{}, fmt.Errorf("reft config %s: %w", path, err)
	}
	allowed := allowedKeys(reflect.TypeOf(c), "")
	var bad []string
	for _, k := range md.Keys() {
		if !allowed[k.String()] && !allowed[strings.Join(k[:len(k)-1], ".")+".*"] {
			bad = append(bad, k.String())
		}
	}
	for _, k := range md.Undecoded() {
		if allowed[k.String()] || allowed[strings.Join(k[:len(k)-1], ".")+".*"] {
			continue // a table we know, decoded field by field
		}
		bad = append(bad, k.String())
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		k := bad[0]
		return Config{}, fmt.Errorf("reft config %s:%d: unknown key %q (keys are lower case; valid keys: %s)",
			path, keyLine(data, k), k, strings.Join(validLeafKeys(allowed), ", "))
	}
	if len(c.Topology.Domains) == 0 {
		c.Topology.Domains = nil // `domains = {}` is the default
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("reft config %s: %w", path, err)
	}
	return c, nil
}

// Validate checks value ranges and the relations between keys, section
// by section; the first fault found is returned, naming its key.
func (c Config) Validate() error {
	for _, check := range []func() error{
		c.validatePaths, c.Store.validate, c.Persist.validate, c.Agent.validate, c.Heartbeat.validate,
		c.Protect.validate, c.Detect.Validate, c.Log.validate, c.Topology.Validate, c.Run.Validate,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validatePaths: the paths the agent and the plugin use are absolute
// (those that may be empty, when empty).
func (c Config) validatePaths() error {
	abs := func(key, v string, emptyOK bool) error {
		if v == "" && emptyOK {
			return nil
		}
		if !strings.HasPrefix(v, "/") {
			return fmt.Errorf("%s = %q: must be an absolute path", key, v)
		}
		return nil
	}
	for _, e := range []error{
		abs("store.tmpfs_root", c.Store.TmpfsRoot, false),
		abs("store.hugetlbfs", c.Store.HugeTLBFS, true),
		abs("persist.dir", c.Persist.Dir, true),
		abs("agent.binary", c.Agent.Binary, false),
		abs("agent.run_dir", c.Agent.RunDir, false),
		abs("agent.slurm_conf", c.Agent.SlurmConf, true),
		abs("log.dir", c.Log.Dir, false),
	} {
		if e != nil {
			return e
		}
	}
	if d := c.Metrics.TextfileDir; d != "" && (!strings.HasPrefix(d, "/") || path.Clean(d) != d) {
		return fmt.Errorf("metrics.textfile_dir = %q: want an absolute, clean path (node_exporter's --collector.textfile.directory, "+
			"e.g. \"/var/lib/prometheus/node-exporter/reft\"), or \"\" to turn the metrics off", d)
	}
	return nil
}

func (s Store) validate() error {
	if s.MaxAge < 0 {
		return fmt.Errorf("store.max_age = %s: want a duration >= 0 (0 disables the age limit)", time.Duration(s.MaxAge))
	}
	if s.Keep < 0 {
		return fmt.Errorf("store.keep = %d: want the number of older completed generations to keep, >= 0", s.Keep)
	}
	return nil
}

func (p Persist) validate() error {
	if f := p.FailuresPerNodeDay; !(f > 0) || math.IsInf(f, 0) {
		return fmt.Errorf("persist.failures_per_node_day = %g: want failures per node per day, > 0 (e.g. 0.016: 2e-3 per GPU-day, 8 GPUs)", f)
	}
	return nil
}

func (a Agent) validate() error {
	if lo, hi := a.PortRange[0], a.PortRange[1]; lo < 1 || hi > 65535 || lo > hi {
		return fmt.Errorf("agent.port_range = [%d, %d]: want [low, high] with 1 <= low <= high <= 65535", lo, hi)
	}
	switch a.PeerAuth {
	case "munge":
	case "secret":
		if !strings.HasPrefix(a.PeerSecret, "/") && !strings.HasPrefix(a.PeerSecret, "~/") {
			return fmt.Errorf("agent.peer_auth = \"secret\" needs agent.peer_secret, an absolute path or one under ~/ on a filesystem every node sees "+
				"(%%j: the job id, %%u: the uid; e.g. \"~/.reft/secrets/%%j\"); got %q", a.PeerSecret)
		}
	default:
		return fmt.Errorf("agent.peer_auth = %q: valid methods: munge, secret", a.PeerAuth)
	}
	if a.StartTimeout <= 0 {
		return fmt.Errorf("agent.start_timeout must be positive")
	}
	return nil
}

func (h Heartbeat) validate() error {
	if h.Interval <= 0 || h.Timeout <= h.Interval {
		return fmt.Errorf("heartbeat: want 0 < interval (%s) < timeout (%s)", h.Interval, h.Timeout)
	}
	return nil
}

func (p Protect) validate() error {
	if p.BackgroundRate < 0 {
		return fmt.Errorf("protect.background_rate = %d: want bytes per second (\"2GiB/s\"), or \"unlimited\"", int64(p.BackgroundRate))
	}
	if p.LinkBandwidth < 0 {
		return fmt.Errorf("protect.link_bandwidth = %d: want bytes per second (\"12GiB/s\", or an integer), or 0 to measure it", int64(p.LinkBandwidth))
	}
	if p.BackgroundBurst <= 0 {
		return fmt.Errorf("protect.background_burst = %d: want a positive size (\"64MiB\")", int64(p.BackgroundBurst))
	}
	switch p.BackgroundSchedule {
	case SchedulePaused, ScheduleIdle, ScheduleUnscheduled:
	default:
		return fmt.Errorf("protect.background_schedule = %q: want %q (pause during the ranks' communication phases, the default), %q (fit chunks into the predicted idle spans) or %q (ignore the phases)",
			p.BackgroundSchedule, SchedulePaused, ScheduleIdle, ScheduleUnscheduled)
	}
	return nil
}

func (l Log) validate() error {
	switch l.Level {
	case "trace", "debug", "info", "warn", "error":
		return nil
	}
	return fmt.Errorf("log.level = %q: valid levels: trace, debug, info, warn, error", l.Level)
}

// Validate checks the relaunch policy; `reft run` calls it again after
// applying its flags. Messages name the reft.toml key; the flag has the
// same name with dashes.
func (r Run) Validate() error {
	switch {
	case r.MaxRestarts < 0:
		return fmt.Errorf("run.max_restarts = %d: want >= 0 (0: never relaunch)", r.MaxRestarts)
	case r.MaxStalled < 1:
		return fmt.Errorf("run.max_stalled = %d: want >= 1 relaunches without a newer committed generation", r.MaxStalled)
	case r.Backoff < 0:
		return fmt.Errorf("run.backoff = %s: want >= 0", r.Backoff)
	case r.BackoffMax < r.Backoff:
		return fmt.Errorf("run.backoff_max = %s is below run.backoff = %s", r.BackoffMax, r.Backoff)
	case r.ProbeTimeout <= 0:
		return fmt.Errorf("run.probe_timeout = %s: want > 0", r.ProbeTimeout)
	}
	return nil
}

// allowedKeys lists every table and key path the Config type accepts.
func allowedKeys(t reflect.Type, prefix string) map[string]bool {
	out := map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" {
			continue
		}
		full := name
		if prefix != "" {
			full = prefix + "." + name
		}
		out[full] = true
		if f.Type.Kind() == reflect.Map {
			out[full+".*"] = true // any key of its own
		}
		if f.Type.Kind() == reflect.Struct && f.Type.NumField() > 0 && !isLeaf(f.Type) {
			for k := range allowedKeys(f.Type, full) {
				out[k] = true
			}
		}
	}
	return out
}

func isLeaf(t reflect.Type) bool {
	return t == reflect.TypeOf(MemoryBudget{})
}

// Size is a number of bytes: in TOML an integer, or a string with a unit
// ("64MiB", "1G").
type Size int64

// UnmarshalTOML implements toml.Unmarshaler.
func (z *Size) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case int64:
		if x > 0 {
			*z = Size(x)
			return nil
		}
	case string:
		if n, err := ParseSize(x); err == nil {
			*z = Size(n)
			return nil
		}
	}
	return fmt.Errorf("%v is not a size: want bytes, > 0 (67108864, \"64MiB\", \"1G\")", v)
}

// Rate is bytes per second; 0 means unlimited. In TOML a size per second
// ("2GiB/s", "500MiB/s"), "unlimited", or an integer (bytes per second).
type Rate int64

// UnmarshalTOML implements toml.Unmarshaler.
func (r *Rate) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case int64:
		if x >= 0 {
			*r = Rate(x)
			return nil
		}
	case string:
		s := strings.TrimSpace(x)
		if s == "unlimited" {
			*r = 0
			return nil
		}
		num, ok := strings.CutSuffix(s, "/s")
		if n, err := ParseSize(num); ok && err == nil {
			*r = Rate(n)
			return nil
		}
	}
	return fmt.Errorf("%v is not a rate: want a size per second (\"2GiB/s\", \"500MiB/s\"), \"unlimited\" or bytes per second", v)
}

func validLeafKeys(allowed map[string]bool) []string {
	var out []string
	for k := range allowed {
		if strings.Contains(k, ".") {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// keyLine finds the line of a dotted key ("agent.run_dir") in TOML text by
// following [table] headers. It returns 0 when it cannot tell.
func keyLine(data []byte, key string) int {
	table, leaf := "", key
	if i := strings.LastIndex(key, "."); i >= 0 {
		table, leaf = key[:i], key[i+1:]
	}
	cur := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "[") {
			h := strings.Trim(line, "[] \t")
			if i := strings.Index(h, "#"); i >= 0 {
				h = strings.TrimSpace(strings.Trim(h[:i], "[] \t"))
			}
			cur = h
			if cur == key {
				return n
			}
			continue
		}
		k, _, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		k = strings.Trim(strings.TrimSpace(k), `"'`)
		if cur == table && k == leaf {
			return n
		}
		if cur == "" && k == key { // dotted key at top level
			return n
		}
	}
	return 0
}

// Validate checks the detector's timers.
func (d Detect) Validate() error {
	if !d.Enabled {
		return nil
	}
	switch {
	case d.Interval <= 0 || d.Timeout <= d.Interval:
		return fmt.Errorf("detect: want 0 < interval (%s) < timeout (%s)", d.Interval, d.Timeout)
	case d.Confirm <= 0:
		return fmt.Errorf("detect.confirm = %s: want a positive duration (how long other agents may take to confirm a suspicion)", d.Confirm)
	case d.Window <= 0:
		return fmt.Errorf("detect.window = %s: want a positive duration (how long a silent suspect is watched before it counts as down)", d.Window)
	case d.Hang < 0:
		return fmt.Errorf("detect.hang = %s: want 0 (off) or a positive duration", d.Hang)
	case d.HangFactor < 0 || d.HangFactor > 1000:
		return fmt.Errorf("detect.hang_factor = %g: want 0 (the floor detect.hang alone) up to 1000; a rank is hung after hang_factor times its median step time, never before detect.hang", d.HangFactor)
	case d.HangFactor > 0 && d.HangFactor <= 2:
		return fmt.Errorf("detect.hang_factor = %g: want more than 2, so a step twice the median is no hang (10 is the default)", d.HangFactor)
	case d.Hang > 0 && d.Hang <= d.Timeout:
		return fmt.Errorf("detect.hang = %s: want it above detect.timeout (%s); a rank's progress comes once per training step", d.Hang, d.Timeout)
	}
	return nil
}

// Duration is a time.Duration written as a string ("500ms", "2s").
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration (examples: 500ms, 2s, 1m)", string(b))
	}
	*d = Duration(v)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MemoryBudget is either an absolute size in bytes or a fraction of the
// node's MemTotal. In TOML: an integer (bytes), a float in (0, 1] (fraction),
// or a string: "64GiB", "512MiB", "100G", "50%".
type MemoryBudget struct {
	Bytes    uint64  // > 0 for an absolute budget
	Fraction float64 // in (0, 1] for a relative budget
}

// UnmarshalTOML implements toml.Unmarshaler.
func (m *MemoryBudget) UnmarshalTOML(v any) error {
	bad := func(v any) error {
		return fmt.Errorf("memory_budget = %v: want bytes (68719476736, \"64GiB\", \"512MiB\") or a fraction of MemTotal (0.5, \"50%%\")", v)
	}
	switch x := v.(type) {
	case int64:
		if x <= 0 {
			return bad(v)
		}
		*m = MemoryBudget{Bytes: uint64(x)}
	case float64:
		if !(x > 0 && x <= 1) {
			return bad(v)
		}
		*m = MemoryBudget{Fraction: x}
	case string:
		mb, err := ParseMemoryBudget(x)
		if err != nil {
			return bad(strconv.Quote(x))
		}
		*m = mb
	default:
		return bad(v)
	}
	return nil
}

// ParseMemoryBudget parses the string forms of a memory budget.
func ParseMemoryBudget(s string) (MemoryBudget, error) {
	s = strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || !(f > 0 && f <= 100) {
			return MemoryBudget{}, fmt.Errorf("bad percentage %q", s)
		}
		return MemoryBudget{Fraction: f / 100}, nil
	}
	n, err := ParseSize(s)
	if err != nil {
		return MemoryBudget{}, err
	}
	return MemoryBudget{Bytes: n}, nil
}

// ParseSize reads a byte count with an optional binary unit ("512MiB",
// "100G", "4096").
func ParseSize(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suf  string
		mult uint64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
	}
	mult := uint64(1)
	num := s
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suf); ok {
			num, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil || n == 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}

// Resolve returns the budget in bytes for a node with memTotal bytes.
func (m MemoryBudget) Resolve(memTotal uint64) uint64 {
	if m.Bytes > 0 {
		return m.Bytes
	}
	return uint64(float64(memTotal) * m.Fraction)
}

// String renders the budget as it would be written in reft.toml.
func (m MemoryBudget) String() string {
	if m.Bytes > 0 {
		return strconv.FormatUint(m.Bytes, 10)
	}
	return strconv.FormatFloat(m.Fraction, 'g', -1, 64)
}

// MemTotal reads MemTotal from /proc/meminfo, in bytes.
func MemTotal() (uint64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("reading /proc/meminfo for the memory budget: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseUint(f[0], 10, 64)
				if err == nil {
					return kb * 1024, nil
				}
			}
		}
	}
	return 0, errors.New("no MemTotal line in /proc/meminfo")
}

// oneLine escapes the line breaks and other control characters of s
// (tabs kept), so that a message quoting input stays on one line.
func oneLine(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r != '\t' && unicode.IsControl(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
