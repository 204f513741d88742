package tmpfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/hostmem"
)

// Options configures a Store.
type Options struct {
	Root  string         // e.g. /dev/shm/reft
	JobID string         // SLURM_JOB_ID
	Owner *hostmem.Owner // the job's user; nil: this process's
	// Keep is how many completed generations to keep besides the newest.
	Keep int
	// Spare is how many arenas per rank and shard to keep free besides the
	// one the next save takes: a reader that pins a generation past its
	// retention (the persistent writer) holds its arena, and saves must not
	// allocate meanwhile.
	Spare     int
	ChunkSize int64 // checksum granularity; 0: DefaultChunkSize
	Workers   int   // copy and checksum goroutines; 0: GOMAXPROCS
	Alloc     *hostmem.Allocator
	Log       zerolog.Logger

	hook func(point string) // crash tests stop the process at named points
}

// Store is one job's snapshot store on this node. Its methods are safe for
// concurrent use; one agent process holds it at a time.
type Store struct {
	opt     Options
	owner   hostmem.Owner
	dir     string
	lock    *os.File
	alloc   *hostmem.Allocator
	log     zerolog.Logger
	metrics Metrics

	mu   sync.Mutex
	keys map[Key]*keyState
}

type keyState struct {
	key     Key
	dir     string
	gens    []*gen // committed (possibly bad), by seq
	ongoing *Ongoing
	arenas  map[string]*slot
	nextSeq uint64
	nextArn int
}

type gen struct {
	m    *Manifest
	dir  string
	bad  bool
	slot *slot
}

// slot is one arena file. It is free when no generation owns it and no
// reader is copying out of it.
type slot struct {
	name    string
	want    int64 // bytes asked for, which decides reuse
	arena   *hostmem.Arena
	owner   any // *gen or *Ongoing
	readers int
}

func (s *slot) free() bool { return s.owner == nil && s.readers == 0 }

// Open opens (creating if needed) the store of one job under opt.Root,
// takes its lock, and re-indexes whatever an earlier agent left on disk:
// completed generations are served, incomplete or damaged ones removed.
func Open(opt Options) (*Store, error) {
	if !filepath.IsAbs(opt.Root) {
		return nil, fmt.Errorf("tmpfs: store root %q must be an absolute path", opt.Root)
	}
	if !nameRE.MatchString(opt.JobID) {
		return nil, fmt.Errorf("tmpfs: job id %q is not a Slurm job id", opt.JobID)
	}
	if opt.Keep < 0 || opt.Spare < 0 {
		return nil, fmt.Errorf("tmpfs: keep = %d and spare = %d must not be negative", opt.Keep, opt.Spare)
	}
	if opt.ChunkSize == 0 {
		opt.ChunkSize = DefaultChunkSize
	}
	if opt.ChunkSize < 4096 {
		return nil, fmt.Errorf("tmpfs: chunk size %d is below 4 KiB", opt.ChunkSize)
	}
	if opt.Workers <= 0 {
		opt.Workers = runtime.GOMAXPROCS(0)
	}
	s := &Store{opt: opt, owner: hostmem.Self(), alloc: opt.Alloc, log: opt.Log, keys: map[Key]*keyState{}}
	if opt.Owner != nil {
		s.owner = *opt.Owner
	}
	if s.alloc == nil {
		var err error
		if s.alloc, err = hostmem.NewAllocator(hostmem.Config{Log: opt.Log}); err != nil {
			return nil, err
		}
	}
	if err := s.makeDirs(); err != nil {
		return nil, err
	}
	if err := s.takeLock(); err != nil {
		return nil, err
	}
	if err := s.index(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Dir is the job's directory, <root>/<uid>/<jobid>.
func (s *Store) Dir() string { return s.dir }

// ChunkSize is the store's default checksum chunk.
func (s *Store) ChunkSize() int64 { return s.opt.ChunkSize }

// Metrics returns the store's counters.
func (s *Store) Metrics() *Metrics { return &s.metrics }

// Allocator is the allocator arenas come from.
func (s *Store) Allocator() *hostmem.Allocator { return s.alloc }

func (s *Store) hook(p string) {
	if s.opt.hook != nil {
		s.opt.hook(p)
	}
}

func (s *Store) makeDirs() error {
	if _, err := os.Lstat(s.opt.Root); os.IsNotExist(err) {
		// Agents run as their job's user, so each must be able to add its
		// own <uid> directory: world-writable and sticky, like /tmp.
		if err := os.MkdirAll(s.opt.Root, 0o755); err != nil {
			return fmt.Errorf("tmpfs: create store root: %w", err)
		}
		if err := os.Chmod(s.opt.Root, 0o1777|os.ModeSticky); err != nil {
			return fmt.Errorf("tmpfs: make store root %s world-writable and sticky: %w", s.opt.Root, err)
		}
	}
	s.dir = JobPath(s.opt.Root, s.owner.UID, s.opt.JobID)
	uidDir := filepath.Dir(s.dir)
	for _, d := range []string{uidDir, s.dir} {
		if err := s.mkdir(d); err != nil {
			return err
		}
	}
	return nil
}

// mkdir makes d 0700 for the owner, or checks that an existing d is a real
// directory of the owner that nobody else can read.
func (s *Store) mkdir(d string) error {
	err := os.Mkdir(d, 0o700)
	if err == nil {
		if err := os.Chmod(d, 0o700); err != nil {
			return fmt.Errorf("tmpfs: chmod: %w", err)
		}
		if s.owner.UID >= 0 && s.owner.UID != os.Geteuid() {
			if err := os.Lchown(d, s.owner.UID, s.owner.GID); err != nil {
				return fmt.Errorf("tmpfs: give %s to uid %d (run the agent as root or as the job's user): %w", d, s.owner.UID, err)
			}
		}
		return nil
	}
	if !os.IsExist(err) {
		return fmt.Errorf("tmpfs: create directory: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(d, &st); err != nil {
		return fmt.Errorf("tmpfs: inspect %s: %w", d, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || (s.owner.UID >= 0 && int(st.Uid) != s.owner.UID) || st.Mode&0o077 != 0 {
		return fmt.Errorf("tmpfs: refusing %s: it must be a directory of uid %d with mode 0700, but is uid %d mode %o; "+
			"someone else may have made it to read this job's snapshots: remove it", d, s.owner.UID, st.Uid, st.Mode&0o7777)
	}
	return nil
}

func (s *Store) takeLock() error {
	f, err := os.OpenFile(filepath.Join(s.dir, LockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("tmpfs: open lock: %w", err)
	}
	if err := own(f, s.owner); err != nil {
		f.Close()
		return fmt.Errorf("tmpfs: lock file: %w", err)
	}
	// flock dies with its holder, so a SIGKILLed agent never blocks the
	// next one.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("tmpfs: %s: %w; is an agent of job %s still running on this node?", s.dir, ErrLocked, s.opt.JobID)
		}
		return fmt.Errorf("tmpfs: lock %s: %w", s.dir, err)
	}
	s.lock = f
	return nil
}

// Close unmaps every arena and drops the lock. The snapshots stay on disk
// for the next agent.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, ks := range s.keys {
		if ks.ongoing != nil {
			ks.ongoing.done = true
		}
		for _, sl := range ks.arenas {
			if sl.arena != nil {
				errs = append(errs, sl.arena.Close())
				sl.arena = nil
			}
		}
	}
	s.keys = map[Key]*keyState{}
	if s.lock != nil {
		errs = append(errs, s.lock.Close())
		s.lock = nil
	}
	return errors.Join(errs...)
}

// index rebuilds the in-memory view from disk alone.
func (s *Store) index() error {
	ranks, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("tmpfs: read %s: %w", s.dir, err)
	}
	for _, re := range ranks {
		rank, err := strconv.Atoi(strings.TrimPrefix(re.Name(), "r"))
		if !re.IsDir() || !strings.HasPrefix(re.Name(), "r") || err != nil || rank < 0 {
			continue
		}
		shards, err := os.ReadDir(filepath.Join(s.dir, re.Name()))
		if err != nil {
			return fmt.Errorf("tmpfs: re-index: %w", err)
		}
		for _, se := range shards {
			k := Key{Rank: rank, Shard: se.Name()}
			if !se.IsDir() || k.check() != nil {
				continue
			}
			if err := s.indexKey(k); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Store) indexKey(k Key) error {
	ks := &keyState{key: k, dir: filepath.Join(s.dir, k.rel()), arenas: map[string]*slot{}}
	ents, err := os.ReadDir(ks.dir)
	if err != nil {
		return fmt.Errorf("tmpfs: re-index %s: %w", k, err)
	}
	for _, e := range ents {
		name := e.Name()
		if n, ok := parseArenaName(name); ok {
			ks.arenas[name] = &slot{name: name}
			ks.nextArn = max(ks.nextArn, n+1)
		}
	}
	for _, e := range ents {
		name, path := e.Name(), filepath.Join(ks.dir, e.Name())
		step, seq, ok := parseGenName(name)
		switch {
		case strings.HasPrefix(name, ".tmp-"):
			os.Remove(path)
			continue
		case !ok || !e.IsDir():
			continue
		}
		ks.nextSeq = max(ks.nextSeq, seq+1)
		g, err := s.readGen(ks, path, step, seq)
		if err != nil {
			s.metrics.Discarded.Add(1)
			s.log.Info().Str("event", "generation_discarded").Int("rank", k.Rank).Str("shard", k.Shard).
				Int64("step", step).Str("reason", err.Error()).Msg("tmpfs: re-index: generation not completed, removing it")
			if err := os.RemoveAll(path); err != nil {
				return fmt.Errorf("tmpfs: remove incomplete generation: %w", err)
			}
			continue
		}
		ks.gens = append(ks.gens, g)
	}
	slices.SortFunc(ks.gens, func(a, b *gen) int { return cmpSeq(a.m.Seq, b.m.Seq) })
	s.keys[k] = ks
	s.prune(ks)
	// Map what survived; arenas no generation owns are freed, since an
	// ongoing write they held died with the previous agent.
	for name, sl := range ks.arenas {
		if sl.owner == nil {
			if err := removeArenaFile(filepath.Join(ks.dir, name)); err != nil {
				return err
			}
			delete(ks.arenas, name)
			continue
		}
		a, err := s.alloc.Adopt(filepath.Join(ks.dir, name))
		if err != nil {
			return fmt.Errorf("tmpfs: re-index %s: %w", k, err)
		}
		sl.arena, sl.want = a, a.Size()
		s.metrics.StoredBytes.Add(a.Size())
	}
	if len(ks.gens) > 0 {
		g := ks.gens[len(ks.gens)-1]
		s.log.Info().Str("event", "store_reindexed").Int("rank", k.Rank).Str("shard", k.Shard).
			Int64("step", g.m.Step).Int("generations", len(ks.gens)).Msg("tmpfs: re-indexed")
	}
	return nil
}

func cmpSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (s *Store) readGen(ks *keyState, dir string, step int64, seq uint64) (*gen, error) {
	m, err := readGeneration(dir, step, seq)
	if err != nil {
		return nil, err
	}
	sl := ks.arenas[m.Arena]
	if sl == nil {
		return nil, fmt.Errorf("arena %q is missing", m.Arena)
	}
	if sl.owner != nil {
		return nil, fmt.Errorf("arena %q is already owned by another generation", m.Arena)
	}
	st, err := os.Stat(filepath.Join(ks.dir, m.Arena))
	if err != nil {
		return nil, fmt.Errorf("arena: %w", err)
	}
	if err := m.check(step, seq, st.Size()); err != nil {
		return nil, fmt.Errorf("bad manifest: %w", err)
	}
	if m.Rank != ks.key.Rank || m.Shard != ks.key.Shard || m.JobID != s.opt.JobID {
		return nil, fmt.Errorf("manifest is for job %s %s, found under job %s %s", m.JobID, Key{m.Rank, m.Shard}, s.opt.JobID, ks.key)
	}
	g := &gen{m: m, dir: dir, slot: sl}
	_, err = os.Stat(filepath.Join(dir, badFile))
	g.bad = err == nil
	sl.owner = g
	return g, nil
}

// prune applies retention: the newest good generation, Keep older good
// ones from the same timeline, and any bad ones newer than all of those
// (evidence, until the next commit). Everything else is released.
func (s *Store) prune(ks *keyState) {
	newest := -1
	for i := len(ks.gens) - 1; i >= 0 && newest < 0; i-- {
		if !ks.gens[i].bad {
			newest = i
		}
	}
	if newest < 0 {
		return
	}
	top, older := ks.gens[newest].m.Step, s.opt.Keep
	keep := make([]bool, len(ks.gens))
	for i := len(ks.gens) - 1; i >= 0; i-- {
		g := ks.gens[i]
		switch {
		case i >= newest:
			keep[i] = true
		case g.bad || g.m.Step >= top: // superseded timeline
		case older > 0:
			keep[i] = true
			older--
		}
	}
	kept := ks.gens[:0:0]
	for i, g := range ks.gens {
		if keep[i] {
			kept = append(kept, g)
		} else {
			s.release(ks, g)
		}
	}
	ks.gens = kept
}

// release drops a generation: its marker goes first, so from that moment
// on no agent counts it as completed; then its directory. The arena is
// kept for the next generation once no reader uses it.
func (s *Store) release(ks *keyState, g *gen) {
	if err := os.Remove(filepath.Join(g.dir, markerFile)); err != nil && !os.IsNotExist(err) {
		s.log.Warn().Err(err).Str("dir", g.dir).Msg("tmpfs: release generation: cannot remove its commit marker")
		return
	}
	s.hook("release:unmarked")
	if err := os.RemoveAll(g.dir); err != nil {
		s.log.Warn().Err(err).Str("dir", g.dir).Msg("tmpfs: release generation: remove directory")
	}
	if g.slot.owner == g {
		g.slot.owner = nil
	}
	s.metrics.Released.Add(1)
}

func removeArenaFile(path string) error {
	if t, err := os.Readlink(path); err == nil {
		if err := os.Remove(t); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("tmpfs: remove arena: %w", err)
		}
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("tmpfs: remove arena: %w", err)
	}
	return nil
}

// key returns the state of k, making its directories on first use.
func (s *Store) key(k Key) (*keyState, error) {
	if ks := s.keys[k]; ks != nil {
		return ks, nil
	}
	if err := k.check(); err != nil {
		return nil, err
	}
	ks := &keyState{key: k, dir: filepath.Join(s.dir, k.rel()), arenas: map[string]*slot{}}
	for _, d := range []string{filepath.Dir(ks.dir), ks.dir} {
		if err := s.mkdir(d); err != nil {
			return nil, err
		}
	}
	s.keys[k] = ks
	return ks, nil
}

// Keys lists every rank and shard with a generation or an ongoing write.
func (s *Store) Keys() []Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Key, 0, len(s.keys))
	for k, ks := range s.keys {
		if len(ks.gens) > 0 || ks.ongoing != nil {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b Key) int {
		if a.Rank != b.Rank {
			return a.Rank - b.Rank
		}
		return strings.Compare(a.Shard, b.Shard)
	})
	return out
}

// classify maps an allocation error onto the store's sentinels.
func classify(err error) error {
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	case errors.Is(err, hostmem.ErrOverBudget):
		return err
	}
	return err
}

// Drop releases every generation of k and frees its arenas, for keys whose
// generations are transient (a restore assembled for one rank). Arenas a
// reader still copies out of are freed by a later Drop. It refuses while a
// save of k is open.
func (s *Store) Drop(k Key) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.keys[k]
	if ks == nil {
		return nil
	}
	if ks.ongoing != nil {
		return fmt.Errorf("tmpfs: drop %s: a save of step %d is open", k, ks.ongoing.m.Step)
	}
	for _, g := range ks.gens {
		s.release(ks, g)
	}
	ks.gens = nil
	for name, sl := range ks.arenas {
		if !sl.free() {
			continue
		}
		s.metrics.StoredBytes.Add(-sl.arena.Size())
		if err := sl.arena.Remove(); err != nil {
			s.log.Warn().Err(err).Msg("tmpfs: drop: free an arena")
		}
		delete(ks.arenas, name)
	}
	return nil
}

// Owner is the user the store's files belong to (the job's).
func (s *Store) Owner() hostmem.Owner { return s.owner }

// SubDir makes <job dir>/name, a directory of the owner with mode 0700,
// or checks the one an earlier agent made (a real directory of the owner
// nobody else may read), and returns it; what is in it stays (the message
// log adopts its files, agent/msglog). name must not start with "r": the
// re-index reads those as ranks.
func (s *Store) SubDir(name string) (string, error) {
	if name == "" || strings.ContainsRune(name, '/') || strings.HasPrefix(name, "r") || name == LockName || name == "." || name == ".." {
		return "", fmt.Errorf("tmpfs: %q cannot name a directory of the store", name)
	}
	d := filepath.Join(s.dir, name)
	if err := s.mkdir(d); err != nil {
		return "", err
	}
	return d, nil
}
