package hostmem

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// JobLimit is a memory limit over the agent's own processes: the
// smallest memory.max (cgroup v2) or memory.limit_in_bytes (v1) of the
// agent's cgroup and its ancestors. Slurm puts the job's memory request
// there (task/cgroup, ConstrainRAMSpace), and the agent runs inside the
// job (the extern step or a step of it); a tmpfs page is charged to the
// cgroup of the process that first touches it, and the agent touches
// every arena page (fallocate). So the job's snapshots count against the
// job's own memory, and the budget must not promise more.
type JobLimit struct {
	Bytes int64  // 0: no limit found
	Where string // the file that set it, for messages
}

// unlimitedV1 is what cgroup v1 reports for "no limit" (page-rounded
// LONG_MAX); anything this large is no limit either.
const unlimitedV1 = 1 << 62

// CgroupMemoryLimit reads the limit of the cgroup that procSelfCgroup
// (/proc/self/cgroup) names under the cgroup mount root (/sys/fs/cgroup).
func CgroupMemoryLimit(procSelfCgroup, root string) (JobLimit, error) {
	f, err := os.Open(procSelfCgroup)
	if err != nil {
		return JobLimit{}, fmt.Errorf("hostmem: read the agent's cgroup: %w", err)
	}
	defer f.Close()
	var v2, v1 string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case slicesContains(strings.Split(parts[1], ","), "memory"):
			v1 = parts[2]
		}
	}
	if err := sc.Err(); err != nil {
		return JobLimit{}, fmt.Errorf("hostmem: read %s: %w", procSelfCgroup, err)
	}
	// A v1 memory controller wins: on a hybrid host v2's hierarchy has no
	// memory controller.
	if v1 != "" {
		return smallest(filepath.Join(root, "memory"), v1, "memory.limit_in_bytes")
	}
	if v2 != "" {
		return smallest(root, v2, "memory.max")
	}
	return JobLimit{}, nil
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// smallest walks from base/rel up to base and returns the smallest limit
// set in file on the way.
func smallest(base, rel, file string) (JobLimit, error) {
	var out JobLimit
	dir := filepath.Join(base, filepath.Clean("/"+rel))
	for {
		p := filepath.Join(dir, file)
		b, err := os.ReadFile(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// the root cgroup has no limit file; a cgroup namespace may
			// hide the levels above
		case err != nil:
			return JobLimit{}, fmt.Errorf("hostmem: read %s: %w", p, err)
		default:
			s := strings.TrimSpace(string(b))
			if s != "max" {
				n, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					return JobLimit{}, fmt.Errorf("hostmem: %s holds %q, not a byte count", p, s)
				}
				if n > 0 && n < unlimitedV1 && (out.Bytes == 0 || n < out.Bytes) {
					out = JobLimit{Bytes: n, Where: p}
				}
			}
		}
		if dir == base || len(dir) <= len(base) {
			return out, nil
		}
		dir = filepath.Dir(dir)
	}
}
