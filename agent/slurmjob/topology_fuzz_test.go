package slurmjob

import (
	"strings"
	"testing"
)

// FuzzScontrolOutput: `scontrol show job|node -o` lines carry user text
// (job names, comments, features) before and after the fields the agent
// reads; whatever they hold, the parsers never panic and what they return
// is one whitespace-free field: a node list, addresses, ports in range.
func FuzzScontrolOutput(f *testing.F) {
	f.Add([]byte("JobId=42 JobName=x UserId=u(1) ExcNodeList=(null) NodeList=n[1-4] BatchHost=n1\n"), []byte("NodeName=n1 Arch=x NodeAddr=10.0.0.1 Port=6818 State=IDLE\nNodeName=n2 NodeAddr=h2 Port=99999\n"))
	f.Add([]byte("JobId=42 JobName= NodeList=evil ExcNodeList=x NodeList=(null)\nJobId=43 NodeList=n9\n"), []byte("NodeName= NodeAddr= Port=0\n NodeName=n3 NodeAddr=a"))
	f.Add([]byte("JobId=42 NodeList=\n"), []byte("NodeName=n1 Port=-1 Port=6818\r\n"))
	f.Fuzz(func(t *testing.T, job, node []byte) {
		oneField := func(what, s string) {
			if s == "" || strings.ContainsAny(s, " \t\n\r") {
				t.Fatalf("%s %q", what, s)
			}
		}
		if l, err := jobNodeList(job, "42"); err == nil {
			oneField("node list", l)
		} else if strings.Contains(err.Error(), "\n") && !strings.Contains(string(job), "\n") {
			t.Fatalf("multi-line error %q", err)
		}
		for n, a := range nodeAddrs(node) {
			oneField("node", n)
			oneField("address", a)
		}
		for n, p := range nodePorts(node) {
			oneField("node", n)
			if p <= 0 || p >= 65536 {
				t.Fatalf("node %s: port %d", n, p)
			}
		}
	})
}
