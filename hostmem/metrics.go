package hostmem

import "sync/atomic"

// Metrics are the allocator's counters and gauges, for the agent to export.
// Fields ending in Bytes are gauges; the others count events.
type Metrics struct {
	ArenaBytes       atomic.Int64 // mapped by this process's allocator
	PinnedBytes      atomic.Int64 // of those, locked with mlock
	UnpinnedArenas   atomic.Int64 // arenas left unpinned (RLIMIT_MEMLOCK too low, or mlock failed)
	HugePageArenas   atomic.Int64 // arenas advised MADV_HUGEPAGE or backed by hugetlbfs
	GPURegistered    atomic.Int64 // mappings registered with the GPU runtime
	BudgetLimitBytes atomic.Int64
	BudgetInUseBytes atomic.Int64
	BudgetRefusals   atomic.Int64 // allocations refused by the budget
}
