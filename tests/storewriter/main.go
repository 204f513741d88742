// Command storewriter exercises the node-local snapshot store from inside
// Slurm job steps, for the end-to-end tests (tests/e2e/store_test.go).
//
//	storewriter write   --root DIR --job ID --step N --size BYTES   commit step N, print "committed", then wait to be killed
//	storewriter restore --root DIR --job ID --step N --size BYTES   restore the newest generation and verify it is step N
//	storewriter check   --root DIR --job ID                         print "present" or "absent"
//
// The bytes of step N are a fixed function of N and the buffer name, so
// the restoring process needs nothing from the writer but the store.
package main

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"os"

	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/tmpfs"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

var key = tmpfs.Key{Rank: 0, Shard: tmpfs.DefaultShard}

func specs(size int64) []tmpfs.BufferSpec {
	return []tmpfs.BufferSpec{{Name: "params", Size: size / 2}, {Name: "adam.m", Size: size / 4}, {Name: "adam.v", Size: size - size/2 - size/4}}
}

func fill(p []byte, step int64, name string) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", name, step)
	x := h.Sum64() | 1
	var w [8]byte
	for i := 0; i < len(p); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(w[:], x)
		copy(p[i:], w[:])
	}
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: storewriter write|restore|check --root DIR --job ID [--step N --size BYTES]")
		return 2
	}
	fs := flag.NewFlagSet("storewriter "+args[0], flag.ContinueOnError)
	root := fs.String("root", "/dev/shm/reft", "store root")
	job := fs.String("job", os.Getenv("SLURM_JOB_ID"), "job id whose store to use")
	step := fs.Int64("step", 1, "step to write or expect")
	size := fs.Int64("size", 64<<20, "state size in bytes")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	host, _ := os.Hostname()
	if args[0] == "check" {
		if _, err := os.Stat(tmpfs.JobPath(*root, os.Geteuid(), *job)); err == nil {
			fmt.Fprintf(stdout, "present on %s\n", host)
		} else {
			fmt.Fprintf(stdout, "absent on %s\n", host)
		}
		return 0
	}
	s, err := tmpfs.Open(tmpfs.Options{Root: *root, JobID: *job, Log: zerolog.New(stderr)})
	if err != nil {
		fmt.Fprintln(stderr, "storewriter:", err)
		return 1
	}
	switch args[0] {
	case "write":
		o, err := s.Begin(key, tmpfs.Spec{Step: *step, Layout: "dp=1", Buffers: specs(*size)})
		if err != nil {
			fmt.Fprintln(stderr, "storewriter:", err)
			return 1
		}
		state := map[string][]byte{}
		for _, b := range specs(*size) {
			state[b.Name] = make([]byte, b.Size)
			fill(state[b.Name], *step, b.Name)
		}
		if err := o.CopyIn(state); err != nil {
			fmt.Fprintln(stderr, "storewriter:", err)
			return 1
		}
		g, err := o.Commit()
		if err != nil {
			fmt.Fprintln(stderr, "storewriter:", err)
			return 1
		}
		fmt.Fprintf(stdout, "committed step %d job %s on %s in %s\n", g.Step, *job, host, s.Dir())
		// Hold the store like an agent until the job is killed.
		select {}
	case "restore":
		dst := map[string][]byte{}
		for _, b := range specs(*size) {
			dst[b.Name] = make([]byte, b.Size)
		}
		g, err := s.Restore(key, dst)
		if err != nil {
			fmt.Fprintln(stderr, "storewriter:", err)
			return 1
		}
		for _, b := range specs(*size) {
			want := make([]byte, b.Size)
			fill(want, *step, b.Name)
			if g.Step != *step || !bytes.Equal(dst[b.Name], want) {
				fmt.Fprintf(stderr, "storewriter: restored step %d, buffer %s does not hold step %d's bytes\n", g.Step, b.Name, *step)
				return 1
			}
		}
		fmt.Fprintf(stdout, "restored step %d job %s on %s: %d buffers verified\n", g.Step, *job, host, len(dst))
		return 0
	}
	fmt.Fprintf(stderr, "storewriter: unknown command %q\n", args[0])
	return 2
}
