package hostmem

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCgroupMemoryLimit: the smallest limit of the agent's cgroup and its
// ancestors, v2 or v1, and where it was set.
func TestCgroupMemoryLimit(t *testing.T) {
	tests := []struct {
		name   string
		self   string            // /proc/self/cgroup
		files  map[string]string // below the cgroup root
		bytes  int64
		where  string // suffix of Where
		hasErr bool
	}{
		{"v2: the job's limit", "0::/system.slice/slurmstepd.scope/job_7/step_extern\n",
			map[string]string{
				"system.slice/slurmstepd.scope/job_7/memory.max":             "2147483648\n",
				"system.slice/slurmstepd.scope/job_7/step_extern/memory.max": "max\n",
			}, 2 << 30, "job_7/memory.max", false},
		{"v2: the smaller of two", "0::/a/b\n",
			map[string]string{"a/memory.max": "1048576\n", "a/b/memory.max": "4194304\n"}, 1 << 20, "a/memory.max", false},
		{"v2: no limit anywhere", "0::/a\n", map[string]string{"a/memory.max": "max\n"}, 0, "", false},
		{"v1 memory controller", "4:memory:/slurm/uid_1000/job_7/step_extern\n0::/\n",
			map[string]string{
				"memory/slurm/uid_1000/job_7/memory.limit_in_bytes":             "536870912\n",
				"memory/slurm/uid_1000/job_7/step_extern/memory.limit_in_bytes": "9223372036854771712\n",
			}, 512 << 20, "job_7/memory.limit_in_bytes", false},
		{"garbage in the limit", "0::/a\n", map[string]string{"a/memory.max": "lots\n"}, 0, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			self := filepath.Join(dir, "cgroup")
			os.WriteFile(self, []byte(tc.self), 0o644)
			root := filepath.Join(dir, "sys")
			for p, v := range tc.files {
				os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
				os.WriteFile(filepath.Join(root, p), []byte(v), 0o644)
			}
			got, err := CgroupMemoryLimit(self, root)
			if (err != nil) != tc.hasErr {
				t.Fatalf("CgroupMemoryLimit = %+v, %v; want error %v", got, err, tc.hasErr)
			}
			if got.Bytes != tc.bytes || !strings.HasSuffix(got.Where, tc.where) {
				t.Fatalf("CgroupMemoryLimit = %+v; want %d from ...%s", got, tc.bytes, tc.where)
			}
		})
	}
}

// TestBudgetJobLimit: the job's memory limit caps the budget when it is
// the smaller one, and a refusal says which limit applied.
func TestBudgetJobLimit(t *testing.T) {
	proc := fakeProc(t, 16<<20, 16<<20) // 16 GiB, all available
	tests := []struct {
		name  string
		job   JobLimit
		limit int64
		from  string
	}{
		{"job limit smaller", JobLimit{Bytes: 1 << 30, Where: "/sys/fs/cgroup/job_7/memory.max"}, 1 << 30, "the job's memory limit, 1 GiB in /sys/fs/cgroup/job_7/memory.max"},
		{"memory_budget smaller", JobLimit{Bytes: 8 << 30, Where: "/sys/fs/cgroup/job_7/memory.max"}, 2 << 30, "memory_budget = 2 GiB"},
		{"no job limit", JobLimit{}, 2 << 30, "memory_budget = 2 GiB"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewBudget(BudgetConfig{Cap: Cap{Bytes: 2 << 30}, ProcFS: proc, Headroom: 1, Job: tc.job}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if b.Limit() != tc.limit || !strings.Contains(b.LimitFrom(), tc.from) {
				t.Fatalf("limit %d from %q; want %d from %q", b.Limit(), b.LimitFrom(), tc.limit, tc.from)
			}
			err = b.Reserve(tc.limit + 1)
			var be *BudgetError
			if !errors.As(err, &be) || !strings.Contains(err.Error(), tc.from) {
				t.Fatalf("Reserve past the limit = %v; want a BudgetError naming %q", err, tc.from)
			}
		})
	}
}
