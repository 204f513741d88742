package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
)

// startAgent runs a real agent over a fresh store for the test.
func startAgent(t testing.TB) *agenttest.Agent {
	t.Helper()
	return startAgentWith(t, agenttest.Options{})
}

func startAgentWith(t testing.TB, opt agenttest.Options) *agenttest.Agent {
	t.Helper()
	a, err := agenttest.Start(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("stopping the agent: %v", err)
		}
	})
	return a
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// open connects a client to a's socket with opt's other fields.
func open(t testing.TB, a *agenttest.Agent, opt client.Options) *client.Client {
	t.Helper()
	opt.Socket = a.Socket
	c, err := client.Open(ctxT(t), opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// pattern fills p with bytes that depend on seed and the position.
func pattern(p []byte, seed int) {
	for i := range p {
		p[i] = byte((uint32(i)*2654435761 + uint32(seed)*40503) >> 13)
	}
}

func patterned(n, seed int) []byte {
	p := make([]byte, n)
	pattern(p, seed)
	return p
}

func mustEqual(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s differs from byte %d (len %d, want %d)", what, i, len(got), len(want))
	}
}

// manifest is the part of a tmpfs MANIFEST the tests read.
type manifest struct {
	Arena   string `json:"arena"`
	Buffers []struct {
		Name   string `json:"name"`
		Offset int64  `json:"offset"`
	} `json:"buffers"`
}

func readManifest(t testing.TB, path string) manifest {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}
