package hostmem

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/procfs"
)

// ErrOverBudget is wrapped by every *BudgetError, for errors.Is.
var ErrOverBudget = errors.New("memory budget exhausted")

// Cap is the configured memory budget: an absolute byte count, or a fraction
// of the node's MemTotal.
type Cap struct {
	Bytes    int64   // absolute cap; used when > 0
	Fraction float64 // fraction of MemTotal in (0, 1]; used when Bytes == 0
}

// ParseCap reads a budget as written in reft.toml: "0.5" or "50%" (of
// MemTotal), or a size such as "8GiB", "512M", "1073741824".
func ParseCap(s string) (Cap, error) {
	t := strings.TrimSpace(s)
	if strings.HasSuffix(t, "%") {
		f, err := strconv.ParseFloat(strings.TrimSuffix(t, "%"), 64)
		if err != nil || f <= 0 || f > 100 {
			return Cap{}, fmt.Errorf("hostmem: memory budget %q: a percentage must be in (0, 100]", s)
		}
		return Cap{Fraction: f / 100}, nil
	}
	if strings.Contains(t, ".") && strings.IndexFunc(t, func(r rune) bool { return r >= 'A' }) < 0 {
		f, err := strconv.ParseFloat(t, 64)
		if err != nil || f <= 0 || f > 1 {
			return Cap{}, fmt.Errorf("hostmem: memory budget %q: a fraction of MemTotal must be in (0, 1]", s)
		}
		return Cap{Fraction: f}, nil
	}
	n, err := ParseBytes(t)
	if err != nil || n <= 0 {
		return Cap{}, fmt.Errorf("hostmem: memory budget %q: want a size (\"8GiB\", \"512M\"), a fraction (\"0.5\") or a percentage (\"50%%\")", s)
	}
	return Cap{Bytes: n}, nil
}

func (c Cap) String() string {
	if c.Bytes > 0 {
		return FormatBytes(c.Bytes)
	}
	return fmt.Sprintf("%g of MemTotal", c.Fraction)
}

// BudgetConfig configures a Budget.
type BudgetConfig struct {
	Cap Cap
	// Headroom is how much MemAvailable must stay free after an allocation,
	// so the node never runs out of memory even under the cap. 0 means 5 %
	// of MemTotal, between 64 MiB and 1 GiB.
	Headroom int64
	// ProcFS is where procfs is mounted; "" means /proc. Tests point it at
	// a fake meminfo.
	ProcFS string
	// Job, when set, is the job's own memory limit (its cgroup, which the
	// snapshots are charged to): the budget never exceeds it.
	Job JobLimit
}

// Budget is the memory an agent may hold in arenas. It refuses an
// allocation that would pass the cap, or that would leave less than the
// headroom of the node's MemAvailable.
type Budget struct {
	fs       procfs.FS
	cap      Cap
	limit    int64
	from     string // which limit applied, for messages
	headroom int64
	metrics  *Metrics

	mu    sync.Mutex
	inUse int64
}

// BudgetError says why an allocation was refused. It wraps ErrOverBudget.
type BudgetError struct {
	Asked, InUse, Limit int64
	Cap                 Cap
	// From says which limit applied: memory_budget, or the job's memory
	// limit (its cgroup).
	From string
	// Available and Headroom are set when MemAvailable, not the cap,
	// refused the allocation.
	Available, Headroom int64
}

func (e *BudgetError) Error() string {
	if e.Headroom > 0 {
		return fmt.Sprintf("hostmem: refusing %s: only %s of the node's memory is available (MemAvailable) and %s stays free so the node cannot run out of memory (%s in use, budget %s); free memory on the node or protect less state",
			FormatBytes(e.Asked), FormatBytes(e.Available), FormatBytes(e.Headroom), FormatBytes(e.InUse), FormatBytes(e.Limit))
	}
	from := e.From
	if from == "" {
		from = fmt.Sprintf("memory_budget = %s in reft.toml", e.Cap)
	}
	hint := "raise memory_budget in reft.toml or protect less state"
	if strings.HasPrefix(from, "the job's") {
		hint = "ask Slurm for more memory (--mem) or protect less state: the snapshots count against the job's memory"
	}
	return fmt.Sprintf("hostmem: refusing %s: %s in use + %s asked exceeds the memory budget of %s (set by %s); %s",
		FormatBytes(e.Asked), FormatBytes(e.InUse), FormatBytes(e.Asked), FormatBytes(e.Limit), from, hint)
}

func (e *BudgetError) Unwrap() error { return ErrOverBudget }

// NewBudget reads MemTotal and fixes the limit. m may be nil.
func NewBudget(cfg BudgetConfig, m *Metrics) (*Budget, error) {
	if cfg.Cap.Bytes <= 0 && (cfg.Cap.Fraction <= 0 || cfg.Cap.Fraction > 1) {
		return nil, fmt.Errorf("hostmem: memory budget %+v: set a size or a fraction of MemTotal in (0, 1]", cfg.Cap)
	}
	mnt := cfg.ProcFS
	if mnt == "" {
		mnt = procfs.DefaultMountPoint
	}
	fs, err := procfs.NewFS(mnt)
	if err != nil {
		return nil, fmt.Errorf("hostmem: open procfs at %s to read the memory size: %w", mnt, err)
	}
	b := &Budget{fs: fs, cap: cfg.Cap, metrics: m}
	total, _, err := b.meminfo()
	if err != nil {
		return nil, err
	}
	b.limit = cfg.Cap.Bytes
	if b.limit <= 0 {
		b.limit = int64(math.Floor(cfg.Cap.Fraction * float64(total)))
	}
	b.from = fmt.Sprintf("memory_budget = %s in reft.toml", cfg.Cap)
	if j := cfg.Job; j.Bytes > 0 && j.Bytes < b.limit {
		b.limit = j.Bytes
		b.from = fmt.Sprintf("the job's memory limit, %s in %s", FormatBytes(j.Bytes), j.Where)
	}
	b.headroom = cfg.Headroom
	if b.headroom <= 0 {
		b.headroom = min(max(total/20, 64<<20), 1<<30)
	}
	if b.metrics == nil {
		b.metrics = new(Metrics)
	}
	b.metrics.BudgetLimitBytes.Store(b.limit)
	return b, nil
}

func (b *Budget) meminfo() (total, avail int64, err error) {
	mi, err := b.fs.Meminfo()
	if err != nil {
		return 0, 0, fmt.Errorf("hostmem: read meminfo: %w", err)
	}
	if mi.MemTotalBytes == nil || mi.MemAvailableBytes == nil {
		return 0, 0, errors.New("hostmem: meminfo has no MemTotal or MemAvailable (kernel older than 3.14?)")
	}
	return int64(*mi.MemTotalBytes), int64(*mi.MemAvailableBytes), nil
}

// Limit is the cap in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// LimitFrom says which limit applied: memory_budget or the job's own.
func (b *Budget) LimitFrom() string { return b.from }

// InUse is what is reserved now.
func (b *Budget) InUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inUse
}

// Reserve charges n bytes, or returns a *BudgetError and charges nothing.
func (b *Budget) Reserve(n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inUse+n > b.limit {
		b.metrics.BudgetRefusals.Add(1)
		return &BudgetError{Asked: n, InUse: b.inUse, Limit: b.limit, Cap: b.cap, From: b.from}
	}
	// MemAvailable already excludes what this store holds in tmpfs, so the
	// new allocation alone must fit in it.
	_, avail, err := b.meminfo()
	if err != nil {
		return err
	}
	if avail-n < b.headroom {
		b.metrics.BudgetRefusals.Add(1)
		return &BudgetError{Asked: n, InUse: b.inUse, Limit: b.limit, Cap: b.cap, From: b.from, Available: avail, Headroom: b.headroom}
	}
	b.inUse += n
	b.metrics.BudgetInUseBytes.Store(b.inUse)
	return nil
}

// Adopt charges n bytes that are already in memory (arenas found on disk
// after an agent restart). It never refuses: the memory is spent either way,
// and later Reserve calls see it.
func (b *Budget) Adopt(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inUse += n
	b.metrics.BudgetInUseBytes.Store(b.inUse)
}

// Release returns n bytes.
func (b *Budget) Release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inUse -= n
	if b.inUse < 0 {
		b.inUse = 0
	}
	b.metrics.BudgetInUseBytes.Store(b.inUse)
}
