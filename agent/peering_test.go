package agent

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reft-hpc/reft/agent/peer"
)

// fakeScontrol: job 7 runs on n8 and n9, both at 127.0.0.1.
const fakeScontrol = `#!/bin/sh
case "$*" in
"show job -o 7") echo 'JobId=7 JobName=t JobState=RUNNING ReqNodeList=(null) ExcNodeList=(null) NodeList=n[8-9] NumNodes=2' ;;
"show hostnames n[8-9]") printf 'n8\nn9\n' ;;
"show node -o n[8-9]") printf 'NodeName=n8 NodeAddr=127.0.0.1 NodeHostName=localhost\nNodeName=n9 NodeAddr=127.0.0.1 NodeHostName=localhost\n' ;;
*) echo "scontrol: unexpected $*" >&2; exit 1 ;;
esac
`

// peeringFixture is an agent sandbox with secret peer authentication (no
// munged needed) and bin as the agent's whole PATH.
func peeringFixture(t *testing.T, withScontrol bool) (agentFixture, string) {
	f := newAgentFixture(t, "")
	secret := filepath.Join(f.dir, "secret", "7")
	if err := peer.WriteSecret(secret); err != nil {
		t.Fatal(err)
	}
	os.Chown(filepath.Dir(secret), nobody, nobody)
	os.Chown(secret, nobody, nobody)
	conf := "[store]\ntmpfs_root = " + strconv.Quote(filepath.Join(f.dir, "shm")) +
		"\n[agent]\nrun_dir = " + strconv.Quote(f.runDir) +
		"\nport_range = [42000, 42999]\npeer_bind = \"127.0.0.1\"\npeer_auth = \"secret\"\npeer_secret = " +
		strconv.Quote(filepath.Join(f.dir, "secret", "%j")) +
		"\n[log]\ndir = " + strconv.Quote(filepath.Join(f.dir, "log")) + "\nlevel = \"debug\"\n"
	if err := os.WriteFile(f.cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(f.dir, "bin")
	os.Mkdir(bin, 0o755)
	if withScontrol {
		if err := os.WriteFile(filepath.Join(bin, "scontrol"), []byte(fakeScontrol), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return f, bin
}

func startWithPath(t *testing.T, f agentFixture, path string) *exec.Cmd {
	cmd := exec.Command(f.bin, "--config", f.cfg, "--job", "7", "--node", "n9", "--spec", "arc",
		"--uid", strconv.Itoa(nobody), "--started-by", "test")
	cmd.Env = []string{"PATH=" + path}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// logEvents waits until the agent's log holds ev, and returns every line
// with an event.
func logEvents(t *testing.T, f agentFixture, ev string) map[string][]map[string]any {
	t.Helper()
	path := filepath.Join(f.dir, "log", "7", "n9.jsonl")
	deadline := time.Now().Add(20 * time.Second)
	for {
		out := map[string][]map[string]any{}
		if fh, err := os.Open(path); err == nil {
			sc := bufio.NewScanner(fh)
			for sc.Scan() {
				var m map[string]any
				if json.Unmarshal(sc.Bytes(), &m) == nil {
					if e, ok := m["event"].(string); ok {
						out[e] = append(out[e], m)
					}
				}
			}
			fh.Close()
		}
		if len(out[ev]) > 0 {
			return out
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(path)
			t.Fatalf("no %s event in the agent's log:\n%s", ev, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAgentPeering: with scontrol on PATH the agent listens on one of its
// candidate ports and looks for the job's other node.
func TestAgentPeering(t *testing.T) {
	f, bin := peeringFixture(t, true)
	cmd := startWithPath(t, f, bin)
	ev := logEvents(t, f, "peer_unreachable")
	l := ev["peer_listening"]
	if len(l) != 1 {
		t.Fatalf("peer_listening logged %d times, want once: %v", len(l), ev)
	}
	if p, _ := l[0]["port"].(float64); p < 42000 || p > 42999 {
		t.Errorf("peer_listening port %v outside agent.port_range", l[0]["port"])
	}
	if u := ev["peer_unreachable"][0]; u["peer_node"] != "n8" || !strings.Contains(u["error"].(string), "refused") {
		t.Errorf("peer_unreachable %v: want n8, refused", u)
	}
	if len(ev["agent_started"]) != 1 || len(ev["peering_off"]) != 0 {
		t.Errorf("events %v: want the agent started, peering on", ev)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("agent exit after SIGTERM: %v", err)
	}
}

// TestAgentPeeringOffWithoutScontrol: the agent starts and serves, and says
// once why peering is off.
func TestAgentPeeringOffWithoutScontrol(t *testing.T) {
	f, bin := peeringFixture(t, false)
	startWithPath(t, f, bin)
	ev := logEvents(t, f, "peering_off")
	time.Sleep(200 * time.Millisecond) // a second report would follow at once
	ev = logEvents(t, f, "peering_off")
	if off := ev["peering_off"]; len(off) != 1 || !strings.Contains(off[0]["error"].(string), "scontrol is not on PATH") {
		t.Fatalf("peering_off events %v: want one naming the missing scontrol", off)
	}
	if len(ev["agent_started"]) != 1 {
		t.Fatalf("events %v: want the agent started", ev)
	}
}
