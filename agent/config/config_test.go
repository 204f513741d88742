package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestShippedFileIsTheDefault(t *testing.T) {
	c, err := Load("../../etc/reft.toml", false)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Fatalf("etc/reft.toml decodes to %+v, Default() is %+v", c, Default())
	}
	// Uncommenting every "# key = value" line must also give the defaults,
	// so the documented defaults are the real ones.
	data, err := os.ReadFile("../../etc/reft.toml")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "# ") && strings.Contains(l, " = ") {
			l = strings.TrimPrefix(l, "# ")
		}
		lines = append(lines, l)
	}
	c, err = Parse("uncommented", []byte(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Fatalf("uncommented etc/reft.toml gives %+v, Default() is %+v", c, Default())
	}
}

func TestParseValid(t *testing.T) {
	tests := []struct {
		name, text string
		check      func(Config) bool
	}{
		{"empty", "", func(c Config) bool { return reflect.DeepEqual(c, Default()) }},
		{"bytes int", "[store]\nmemory_budget = 1073741824", func(c Config) bool { return c.Store.MemoryBudget.Bytes == 1<<30 }},
		{"bytes unit", "[store]\nmemory_budget = \"64GiB\"", func(c Config) bool { return c.Store.MemoryBudget.Bytes == 64<<30 }},
		{"fraction", "[store]\nmemory_budget = 0.25", func(c Config) bool { return c.Store.MemoryBudget.Fraction == 0.25 }},
		{"percent", "[store]\nmemory_budget = \"25%\"", func(c Config) bool { return c.Store.MemoryBudget.Fraction == 0.25 }},
		{"hugetlbfs", "[store]\nhugetlbfs = \"/dev/hugepages\"", func(c Config) bool { return c.Store.HugeTLBFS == "/dev/hugepages" }},
		{"hugetlbfs default off", "[store]\nkeep = 0", func(c Config) bool { return c.Store.HugeTLBFS == "" }},
		{"keep", "[store]\nkeep = 2", func(c Config) bool { return c.Store.Keep == 2 }},
		{"metrics textfile dir", "[metrics]\ntextfile_dir = \"/var/lib/prometheus/node-exporter/reft\"", func(c Config) bool {
			return c.Metrics.TextfileDir == "/var/lib/prometheus/node-exporter/reft"
		}},
		{"metrics off by default", "[store]\nkeep = 0", func(c Config) bool { return c.Metrics.TextfileDir == "" }},
		{"durations", "[heartbeat]\ninterval = \"100ms\"\ntimeout = \"1s\"", func(c Config) bool {
			return c.Heartbeat.Interval.D() == 100*time.Millisecond && c.Heartbeat.Timeout.D() == time.Second
		}},
		{"ports", "[agent]\nport_range = [5000, 5010]", func(c Config) bool { return c.Agent.PortRange == [2]int{5000, 5010} }},
		{"peer secret", "[agent]\npeer_auth = \"secret\"\npeer_secret = \"/home/u/.reft/%j.key\"\npeer_bind = \"10.0.0.1\"", func(c Config) bool {
			return c.Agent.PeerAuth == "secret" && c.Agent.PeerSecret == "/home/u/.reft/%j.key" && c.Agent.PeerBind == "10.0.0.1"
		}},
		{"gpu health off", "[agent]\ngpu_health = false", func(c Config) bool { return !c.Agent.GPUHealth }},
		{"gpu health default", "[agent]\nrun_dir = \"/x\"", func(c Config) bool { return c.Agent.GPUHealth }},
		{"dotted", "agent.run_dir = \"/x\"", func(c Config) bool { return c.Agent.RunDir == "/x" }},
		{"background rate", "[protect]\nbackground_rate = \"500MiB/s\"\nbackground_burst = \"8MiB\"", func(c Config) bool {
			return c.Protect.BackgroundRate == 500<<20 && c.Protect.BackgroundBurst == 8<<20
		}},
		{"background rate int", "[protect]\nbackground_rate = 1000\nbackground_burst = 4096", func(c Config) bool {
			return c.Protect.BackgroundRate == 1000 && c.Protect.BackgroundBurst == 4096
		}},
		{"background unlimited", "[protect]\nbackground_rate = \"unlimited\"", func(c Config) bool { return c.Protect.BackgroundRate == 0 }},
		{"schedule default", "[protect]\nbackground_rate = 1000", func(c Config) bool { return c.Protect.BackgroundSchedule == SchedulePaused }},
		{"schedule idle", "[protect]\nbackground_schedule = \"idle\"", func(c Config) bool { return c.Protect.BackgroundSchedule == ScheduleIdle }},
		{"schedule unscheduled", "[protect]\nbackground_schedule = \"unscheduled\"", func(c Config) bool { return c.Protect.BackgroundSchedule == ScheduleUnscheduled }},
		{"link bandwidth", "[protect]\nlink_bandwidth = \"24MiB/s\"", func(c Config) bool { return c.Protect.LinkBandwidth == 24<<20 }},
		{"link bandwidth int", "[protect]\nlink_bandwidth = 25000000", func(c Config) bool { return c.Protect.LinkBandwidth == 25e6 }},
		{"link bandwidth measured", "", func(c Config) bool { return c.Protect.LinkBandwidth == 0 }},
		{"failure rate", "[persist]\nfailures_per_node_day = 0.5", func(c Config) bool { return c.Persist.FailuresPerNodeDay == 0.5 }},
		{"failure rate int", "[persist]\nfailures_per_node_day = 2", func(c Config) bool { return c.Persist.FailuresPerNodeDay == 2 }},
		{"log", "[log]\nlevel = \"debug\"\ndir = \"/l\"", func(c Config) bool { return c.Log.Level == "debug" && c.Log.Dir == "/l" }},
		{"run", "[run]\nmax_restarts = 0\nmax_stalled = 1\nbackoff = \"0s\"\nbackoff_max = \"0s\"\nprobe_timeout = \"5s\"", func(c Config) bool {
			return c.Run == Run{MaxRestarts: 0, MaxStalled: 1, ProbeTimeout: Duration(5 * time.Second)}
		}},
		{"domains inline", "[topology]\ndomains = { rack1 = \"n[1-2]\", rack2 = \"n[3-4],x9\" }", func(c Config) bool {
			d, err := c.Topology.DomainsOf([]string{"n1", "n2", "n3", "n4", "x9", "n5"})
			return err == nil && reflect.DeepEqual(d, map[string]string{"n1": "rack1", "n2": "rack1", "n3": "rack2", "n4": "rack2", "x9": "rack2"})
		}},
		{"domains table", "[topology.domains]\nrackA = \"n1\"\n", func(c Config) bool {
			d, err := c.Topology.DomainsOf([]string{"n1", "n2"})
			return err == nil && reflect.DeepEqual(d, map[string]string{"n1": "rackA"})
		}},
		{"domain pattern", "[topology]\ndomain_pattern = \"^(r[0-9]+)n[0-9]+$\"\ndomains = { spare = \"r9n01\" }", func(c Config) bool {
			d, err := c.Topology.DomainsOf([]string{"r12n03", "r12n04", "r2n1", "login1", "r9n01"})
			return err == nil && reflect.DeepEqual(d, map[string]string{"r12n03": "r12", "r12n04": "r12", "r2n1": "r2", "r9n01": "spare"})
		}},
		{"domain pattern whole match", "[topology]\ndomain_pattern = \"^[a-z]+\"", func(c Config) bool {
			d, err := c.Topology.DomainsOf([]string{"gpu01", "cpu7"})
			return err == nil && reflect.DeepEqual(d, map[string]string{"gpu01": "gpu", "cpu7": "cpu"})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("t.toml", []byte(tt.text))
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Fatalf("got %+v", c)
			}
		})
	}
}

func TestParseInvalid(t *testing.T) {
	tests := []struct{ name, text, want string }{
		{"unknown top key", "a = 1\nbogus = 2", `t.toml:1: unknown key "a"`},
		{"unknown section", "[stor]\ntmpfs_root = \"/x\"", `t.toml:1: unknown key "stor"`},
		{"unknown key in section", "[store]\n\ntmpfs_rot = \"/x\"", `t.toml:3: unknown key "store.tmpfs_rot"`},
		{"wrong case key", "[store]\nTmpfs_Root = \"/x\"", `t.toml:2: unknown key "store.Tmpfs_Root" (keys are lower case`},
		{"wrong case section", "[Store]\ntmpfs_root = \"/x\"", `t.toml:1: unknown key "Store"`},
		{"inline table in budget", "[store]\nmemory_budget = {a = 1}", "memory_budget"},
		{"syntax", "[store\n", "t.toml:2: expected"},
		{"bad duration", "[heartbeat]\ninterval = \"soon\"", "not a duration"},
		{"interval >= timeout", "[heartbeat]\ninterval = \"3s\"", "want 0 < interval (3s) < timeout (2s)"},
		{"bad level", "[log]\nlevel = \"loud\"", "valid levels: trace, debug, info, warn, error"},
		{"relative dir", "[store]\ntmpfs_root = \"shm\"", "store.tmpfs_root = \"shm\": must be an absolute path"},
		{"bad ports", "[agent]\nport_range = [9, 1]", "agent.port_range = [9, 1]"},
		{"bad peer auth", "[agent]\npeer_auth = \"kerberos\"", "valid methods: munge, secret"},
		{"gpu health string", "[agent]\ngpu_health = \"yes\"", "gpu_health"},
		{"gpu health miscased", "[agent]\nGPU_Health = false", `unknown key "agent.GPU_Health"`},
		{"secret with a relative file", "[agent]\npeer_auth = \"secret\"\npeer_secret = \"secrets/%j\"", "needs agent.peer_secret"},
		{"zero failure rate", "[persist]\nfailures_per_node_day = 0.0", "persist.failures_per_node_day = 0: want failures per node per day, > 0"},
		{"negative failure rate", "[persist]\nfailures_per_node_day = -1.0", "persist.failures_per_node_day = -1"},
		{"infinite failure rate", "[persist]\nfailures_per_node_day = inf", "persist.failures_per_node_day = +Inf"},
		{"failure rate string", "[persist]\nfailures_per_node_day = \"often\"", "failures_per_node_day"},
		{"failure rate miscased", "[persist]\nFailures_Per_Node_Day = 1.0", `unknown key "persist.Failures_Per_Node_Day"`},
		{"relative metrics dir", "[metrics]\ntextfile_dir = \"prom\"", `metrics.textfile_dir = "prom": want an absolute, clean path`},
		{"unclean metrics dir", "[metrics]\ntextfile_dir = \"/var/lib/../prom/\"", `metrics.textfile_dir = "/var/lib/../prom/": want an absolute, clean path`},
		{"metrics dir not a string", "[metrics]\ntextfile_dir = 1", "textfile_dir"},
		{"metrics key miscased", "[metrics]\nTextfile_Dir = \"/x\"", `unknown key "metrics.Textfile_Dir"`},
		{"relative hugetlbfs", "[store]\nhugetlbfs = \"hugepages\"", "store.hugetlbfs = \"hugepages\": must be an absolute path"},
		{"negative keep", "[store]\nkeep = -1", "store.keep = -1: want the number of older completed generations to keep, >= 0"},
		{"keep string", "[store]\nkeep = \"all\"", "keep"},
		{"zero budget", "[store]\nmemory_budget = 0", "memory_budget = 0: want bytes"},
		{"fraction above one", "[store]\nmemory_budget = 1.5", "fraction of MemTotal"},
		{"bad size", "[store]\nmemory_budget = \"lots\"", "memory_budget"},
		{"budget bool", "[store]\nmemory_budget = true", "memory_budget"},
		{"negative restarts", "[run]\nmax_restarts = -1", "run.max_restarts = -1: want >= 0"},
		{"zero stalled", "[run]\nmax_stalled = 0", "run.max_stalled = 0: want >= 1"},
		{"backoff above max", "[run]\nbackoff = \"2m\"", "run.backoff_max = 1m0s is below run.backoff = 2m0s"},
		{"zero probe timeout", "[run]\nprobe_timeout = \"0s\"", "run.probe_timeout = 0s: want > 0"},
		{"rate without per second", "[protect]\nbackground_rate = \"2GiB\"", "not a rate"},
		{"negative rate", "[protect]\nbackground_rate = -5", "not a rate"},
		{"negative link bandwidth", "[protect]\nlink_bandwidth = -5", "not a rate"},
		{"rate word", "[protect]\nbackground_rate = \"fast\"", "not a rate"},
		{"bad schedule", "[protect]\nbackground_schedule = \"gemini\"", `protect.background_schedule = "gemini": want "paused"`},
		{"zero burst", "[protect]\nbackground_burst = 0", "not a size"},
		{"burst word", "[protect]\nbackground_burst = \"big\"", "not a size"},
		{"protect key miscased", "[protect]\nBackground_Rate = \"1GiB/s\"", `unknown key "protect.Background_Rate"`},
		{"run key miscased", "[run]\nMax_Restarts = 1", `unknown key "run.Max_Restarts"`},
		{"domain in two racks", "[topology]\ndomains = { a = \"n[1-3]\", b = \"n3\" }", "puts node n3 in both a and b"},
		{"domain bad hostlist", "[topology]\ndomains = { a = \"n[1-\" }", "topology.domains.a"},
		{"domain empty label", "[topology]\ndomains = { \"\" = \"n1\" }", "must be a plain name"},
		{"domain not a string", "[topology]\ndomains = { a = 1 }", "domains"},
		{"domain pattern syntax", "[topology]\ndomain_pattern = \"(\"", "topology.domain_pattern"},
		{"domain pattern two groups", "[topology]\ndomain_pattern = \"(r)(n)\"", "2 capture groups"},
		{"topology key unknown", "[topology]\ndomain = \"x\"", `unknown key "topology.domain"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.toml", []byte(tt.text))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestLoadMissing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "none.toml")
	if c, err := Load(p, true); err != nil || !reflect.DeepEqual(c, Default()) {
		t.Fatalf("Load(missing, true) = %+v, %v", c, err)
	}
	if _, err := Load(p, false); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("Load(missing, false) = %v, want an error naming %s", err, p)
	}
}

func TestMemoryBudget(t *testing.T) {
	if got := (MemoryBudget{Fraction: 0.5}).Resolve(1000); got != 500 {
		t.Fatalf("Resolve fraction = %d", got)
	}
	if got := (MemoryBudget{Bytes: 7}).Resolve(1000); got != 7 {
		t.Fatalf("Resolve bytes = %d", got)
	}
	mt, err := MemTotal()
	if err != nil || mt == 0 {
		t.Fatalf("MemTotal = %d, %v", mt, err)
	}
}

func TestDetectValidate(t *testing.T) {
	ok := Default().Detect
	for _, tc := range []struct {
		name string
		edit func(*Detect)
		want string // "": valid
	}{
		{"defaults", func(*Detect) {}, ""},
		{"off ignores timers", func(d *Detect) { d.Enabled, d.Interval = false, 0 }, ""},
		{"hang off", func(d *Detect) { d.Hang = 0 }, ""},
		{"interval not below timeout", func(d *Detect) { d.Interval = d.Timeout }, "interval"},
		{"no confirm", func(d *Detect) { d.Confirm = 0 }, "detect.confirm"},
		{"negative hang", func(d *Detect) { d.Hang = -1 }, "detect.hang"},
		{"hang within timeout", func(d *Detect) { d.Hang = d.Timeout }, "above detect.timeout"},
	} {
		d := ok
		tc.edit(&d)
		err := d.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestUserPath: a user's commands read $REFT_CONFIG when set; only the
// default path may be missing.
func TestUserPath(t *testing.T) {
	dir := t.TempDir()
	named := filepath.Join(dir, "cluster.toml")
	for _, tc := range []struct {
		env, want string
		missingOK bool
	}{
		{"", DefaultPath, true},
		{named, named, false},
	} {
		t.Setenv(EnvPath, tc.env)
		got := UserPath()
		if got != tc.want || MissingOK(got) != tc.missingOK {
			t.Errorf("REFT_CONFIG=%q: UserPath %q MissingOK %v; want %q %v", tc.env, got, MissingOK(got), tc.want, tc.missingOK)
		}
		if _, err := Load(got, MissingOK(got)); tc.env != "" && (err == nil || !strings.Contains(err.Error(), named)) {
			t.Errorf("REFT_CONFIG naming a missing file: Load gave %v, want an error naming it", err)
		}
	}
}
