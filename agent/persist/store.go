package persist

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/internal/crc32c"
	"github.com/reft-hpc/reft/tmpfs"
)

const (
	manifestFile = "MANIFEST"
	dataFile     = "data"
	markerFile   = "COMMITTED"
	badFile      = "BAD"
	tmpPrefix    = ".tmp-"
	trashPrefix  = ".trash-"
)

// marker is the COMMITTED file: it pins the manifest by length and
// checksum and the data file by length, so a torn or altered copy never
// reads as committed.
type marker struct {
	Step          int64     `json:"step"`
	Seq           uint64    `json:"seq"`
	ManifestBytes int       `json:"manifest_bytes"`
	ManifestCRC   uint32    `json:"manifest_crc32c"`
	DataBytes     int64     `json:"data_bytes"`
	Node          string    `json:"node"`
	Written       time.Time `json:"written"`
	// Epoch is the writer's (absent before fencing: the zero epoch).
	Epoch Epoch `json:"epoch"`
}

// Epoch orders the job's runs: a requeue (SLURM_RESTART_COUNT) starts a
// newer one, and within it each relaunch of reft run is a new srun step,
// with a higher Slurm step id (the committing rank's, from its hello). A
// writer from an older epoch is stale (a node wrongly declared lost, a
// partitioned one, a write queued before the job moved on): it must not
// remove or replace what a newer epoch wrote.
type Epoch struct {
	Restart int `json:"restart"`
	// Step is the Slurm step id of the rank that committed the generation
	// (0 for a batch or extern step, or a client that did not say).
	Step int `json:"slurm_step"`
}

// Before reports whether e is an older epoch than o.
func (e Epoch) Before(o Epoch) bool {
	return e.Restart < o.Restart || e.Restart == o.Restart && e.Step < o.Step
}

func (e Epoch) String() string { return fmt.Sprintf("restart %d step %d", e.Restart, e.Step) }

// FencedError is a write refused because a newer epoch has written the
// rank's directory: this writer is stale.
type FencedError struct {
	Rank         int
	Step         int64
	Mine, Newest Epoch
	By           string // the node that wrote the newer generation
	NewerStep    int64
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("persistent write of rank %d step %d refused: this agent writes for %s, but %s wrote step %d for the newer %s; "+
		"this writer is stale (its node was declared lost or the job has moved on) and writes and removes nothing, so the newer checkpoints are safe",
		e.Rank, e.Step, e.Mine, e.By, e.NewerStep, e.Newest)
}

// Generation is a committed persistent generation of one rank.
type Generation struct {
	Rank     int
	Step     int64
	Dir      string
	Bad      bool
	Manifest tmpfs.Manifest
	Epoch    Epoch  // the writer's
	Node     string // the writer's node
}

// Bytes is the payload of the generation (the buffers, without padding).
func (g Generation) Bytes() int64 {
	var n int64
	for _, b := range g.Manifest.Buffers {
		n += b.Size
	}
	return n
}

// Store is one job's persistent directory, <dir>/<jobid>.
type Store struct {
	job  string
	node string
	dir  string
	uid  int // the job's user: every directory must be its own
	// epoch is Write's (WriteIn takes one per write): what a newer epoch
	// wrote is never removed, and a rank directory a newer epoch has
	// written is not written.
	epoch Epoch

	hook func(point string) // crash tests stop the process at named points
}

// OpenStore makes (or checks) <dir>/<job> for the job's user; Write
// writes for epoch.
func OpenStore(dir, job, node string, uid int, epoch Epoch) (*Store, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("persistent directory %q must be an absolute path", dir)
	}
	if job == "" || strings.ContainsAny(job, "/.") || node == "" || strings.Contains(node, "/") {
		return nil, fmt.Errorf("persistent directory: bad job id %q or node %q", job, node)
	}
	s := &Store{job: job, node: node, dir: filepath.Join(dir, job), uid: uid, epoch: epoch}
	created, err := s.mkdir(s.dir)
	if err != nil {
		return nil, err
	}
	if created {
		if err := syncDir(dir); err != nil {
			return nil, fmt.Errorf("persistent directory: fsync %s: %w", dir, err)
		}
	}
	return s, nil
}

// Dir is <dir>/<jobid>.
func (s *Store) Dir() string { return s.dir }

func (s *Store) rankDir(rank int) string { return filepath.Join(s.dir, "r"+strconv.Itoa(rank)) }

func genName(step int64) string { return "g" + strconv.FormatInt(step, 10) }

func parseGenName(name string) (int64, bool) {
	st, err := strconv.ParseInt(strings.TrimPrefix(name, "g"), 10, 64)
	return st, err == nil && st >= 0 && genName(st) == name
}

func (s *Store) at(point string) {
	if s.hook != nil {
		s.hook(point)
	}
}

// mkdir makes d with mode 0700, or checks that an existing d is a directory
// of the job's user; a wider mode of our own is narrowed. Another owner is
// refused: its owner could read or replace the job's checkpoints.
func (s *Store) mkdir(d string) (created bool, err error) {
	if err := os.Mkdir(d, 0o700); err == nil {
		return true, os.Chmod(d, 0o700) // whatever the umask
	} else if !errors.Is(err, os.ErrExist) {
		return false, fmt.Errorf("persistent directory: create %s: %w (persist_dir / [persist] dir must be writable by the job's user)", d, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(d, &st); err != nil {
		return false, fmt.Errorf("persistent directory: inspect %s: %w", d, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != s.uid {
		return false, fmt.Errorf("persistent directory: refusing %s: it must be a directory of uid %d, but is uid %d mode %o; "+
			"someone else may have made it to read or replace this job's checkpoints: remove it", d, s.uid, st.Uid, st.Mode&0o7777)
	}
	if st.Mode&0o077 != 0 {
		if err := os.Chmod(d, 0o700); err != nil {
			return false, fmt.Errorf("persistent directory: chmod 0700 %s: %w", d, err)
		}
	}
	return false, nil
}

// Written is the outcome of one Write.
type Written struct {
	Dir     string
	Bytes   int64 // data file size
	Already bool  // an identical generation was there; nothing written
	Removed []int64
}

// Write copies the generation r pins to <dir>/<job>/r<rank>/g<step>,
// streaming the arena chunk by chunk and checking each chunk's CRC-32C as
// it goes (memory corrupted since the commit is never persisted). Then it
// applies retention: the new step and the newest older one are kept,
// steps above the new one and above abandonedAbove (>= 0: a step the job
// has restored since the last write) are removed.
func (s *Store) Write(ctx context.Context, r *tmpfs.Reader, abandonedAbove int64) (Written, error) {
	return s.WriteIn(ctx, r, abandonedAbove, s.epoch)
}

// WriteIn is Write for a writer of epoch e.
func (s *Store) WriteIn(ctx context.Context, r *tmpfs.Reader, abandonedAbove int64, e Epoch) (Written, error) {
	m := r.Manifest()
	rank, step := m.Rank, m.Step
	rdir := s.rankDir(rank)
	final := filepath.Join(rdir, genName(step))
	created, err := s.mkdir(rdir)
	if err != nil {
		return Written{}, err
	}
	if created {
		if err := syncDir(s.dir); err != nil {
			return Written{}, fmt.Errorf("persistent write: fsync %s: %w", s.dir, err)
		}
	}
	if err := s.fence(rank, step, e); err != nil {
		return Written{}, err
	}
	if old, err := s.read(rank, final, step); err == nil && !old.Bad && sameChecksums(&old.Manifest, m) {
		// The same bytes (a deterministic job redoing the step, or an
		// agent restart): the copy is this timeline's; only retention.
		return Written{Dir: final, Already: true, Removed: s.prune(rank, step, abandonedAbove, e)}, nil
	}
	s.removeStale(rdir)
	tmp := filepath.Join(rdir, fmt.Sprintf("%s%s-%s-%d", tmpPrefix, genName(step), s.node, os.Getpid()))
	if err := os.RemoveAll(tmp); err != nil {
		return Written{}, fmt.Errorf("persistent write: remove leftover %s: %w", tmp, err)
	}
	if _, err := s.mkdir(tmp); err != nil {
		return Written{}, err
	}
	n, err := s.fill(ctx, tmp, r, e)
	if err != nil {
		os.RemoveAll(tmp)
		return Written{}, err
	}
	s.at("write:synced")
	// Again before anything becomes visible: a newer epoch may have
	// written while this copy was filled (a shared filesystem offers no
	// compare-and-swap; this narrows the window to the rename itself).
	if err := s.fence(rank, step, e); err != nil {
		os.RemoveAll(tmp)
		return Written{}, err
	}
	if err := s.replace(tmp, final); err != nil {
		os.RemoveAll(tmp)
		return Written{}, err
	}
	s.at("write:renamed")
	removed := s.prune(rank, step, abandonedAbove, e)
	return Written{Dir: final, Bytes: n, Removed: removed}, nil
}

// fill writes data, MANIFEST and COMMITTED into the temporary directory tmp.
func (s *Store) fill(ctx context.Context, tmp string, r *tmpfs.Reader, e Epoch) (int64, error) {
	m := r.Manifest()
	fail := func(what string, err error) (int64, error) {
		return 0, fmt.Errorf("persistent write of rank %d step %d: %s: %w", m.Rank, m.Step, what, err)
	}
	f, err := os.OpenFile(filepath.Join(tmp, dataFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fail("create data file", err)
	}
	defer f.Close()
	w := &dataWriter{f: f, zeros: make([]byte, 64<<10)}
	half := func() {
		if w.off >= m.ArenaSize/2 {
			s.at("write:half")
		}
	}
	for _, b := range m.Buffers {
		if err := w.padTo(b.Offset); err != nil {
			return fail("write data file", err)
		}
		if what, err := copyBuffer(ctx, w, r, b, half); err != nil {
			return fail(what, err)
		}
	}
	if err := w.padTo(m.ArenaSize); err != nil {
		return fail("write data file", err)
	}
	off := w.off
	if err := f.Sync(); err != nil {
		return fail("fsync data file", err)
	}
	if err := f.Close(); err != nil {
		return fail("close data file", err)
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return fail("manifest", err)
	}
	if err := writeSynced(filepath.Join(tmp, manifestFile), raw); err != nil {
		return fail("write manifest", err)
	}
	mk, _ := json.Marshal(marker{Step: m.Step, Seq: m.Seq, ManifestBytes: len(raw), ManifestCRC: crc32c.Checksum(raw),
		DataBytes: off, Node: s.node, Written: time.Now().UTC(), Epoch: e})
	if err := writeSynced(filepath.Join(tmp, markerFile), mk); err != nil {
		return fail("write commit marker", err)
	}
	if err := syncDir(tmp); err != nil {
		return fail("fsync directory", err)
	}
	return off, nil
}

// dataWriter writes a generation's data file: the buffers at their arena
// offsets, zeros between them and to the arena's end. off is where the
// next byte goes.
type dataWriter struct {
	f     *os.File
	off   int64
	zeros []byte
}

func (w *dataWriter) padTo(to int64) error {
	for w.off < to {
		k := min(to-w.off, int64(len(w.zeros)))
		if _, err := w.f.Write(w.zeros[:k]); err != nil {
			return err
		}
		w.off += k
	}
	return nil
}

// copyBuffer writes buffer b's chunks from the arena r, each checked
// against its CRC-32C first (memory corrupted since the commit is not
// persisted), calling after each; what says which step failed.
func copyBuffer(ctx context.Context, w *dataWriter, r *tmpfs.Reader, b tmpfs.Buffer, after func()) (what string, err error) {
	for i := range b.CRC32C {
		if err := ctx.Err(); err != nil {
			return "stopped", err
		}
		p, want, err := r.Chunk(b.Name, i)
		if err != nil {
			return "read arena", err
		}
		if got := crc32c.Checksum(p); got != want {
			return "arena", fmt.Errorf("%w: buffer %q chunk %d stored %#08x, memory now %#08x; not persisted (host memory corrupted since the commit)",
				tmpfs.ErrCorrupt, b.Name, i, want, got)
		}
		if _, err := w.f.Write(p); err != nil {
			return "write data file", err
		}
		w.off += int64(len(p))
		after()
	}
	return "", nil
}

// replace renames tmp to final. A final of the same step from an abandoned
// timeline is moved aside first and removed once the new one is in place.
func (s *Store) replace(tmp, final string) error {
	var trash string
	if _, err := os.Lstat(final); err == nil {
		trash = filepath.Join(filepath.Dir(final), fmt.Sprintf("%s%s-%s-%d", trashPrefix, filepath.Base(final), s.node, os.Getpid()))
		if err := os.Rename(final, trash); err != nil {
			return fmt.Errorf("persistent write: move the older %s aside: %w", final, err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("persistent write: rename %s into place: %w", tmp, err)
	}
	if err := syncDir(filepath.Dir(final)); err != nil {
		return fmt.Errorf("persistent write: fsync %s: %w", filepath.Dir(final), err)
	}
	if trash != "" {
		removeGen(trash)
	}
	return nil
}

// staleAfter is how long another node's temporary directory is left
// alone: its writer may still be filling it (a slow write of a large
// arena to NFS), or be of a newer epoch. Older, its writer crashed.
const staleAfter = time.Hour

// removeStale removes what crashed writers left in a rank directory: this
// node's temporary directories (its one writer is this one), and other
// nodes' once they are older than staleAfter.
func (s *Store) removeStale(rdir string) {
	ents, _ := os.ReadDir(rdir)
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, tmpPrefix) && !strings.HasPrefix(name, trashPrefix) {
			continue
		}
		if !strings.Contains(name, "-"+s.node+"-") {
			if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < staleAfter {
				continue
			}
		}
		os.RemoveAll(filepath.Join(rdir, name))
	}
}

// fence refuses a write of rank when a committed generation of the rank
// is from a newer epoch than this writer's.
func (s *Store) fence(rank int, step int64, e Epoch) error {
	gens, _ := s.List(rank)
	for _, g := range gens {
		if e.Before(g.Epoch) {
			return &FencedError{Rank: rank, Step: step, Mine: e, Newest: g.Epoch, By: g.Node, NewerStep: g.Step}
		}
	}
	return nil
}

// prune keeps step and the newest good generation below it, and removes
// everything else: older generations, newer ones (an abandoned timeline:
// the job is at step now) and those above abandonedAbove.
func (s *Store) prune(rank int, step, abandonedAbove int64, e Epoch) []int64 {
	gens, _ := s.List(rank)
	older := false
	var removed []int64
	for _, g := range gens { // newest first
		keep := false
		switch {
		case g.Step == step, e.Before(g.Epoch):
			// A newer epoch's generation is never this writer's to remove.
			keep = true
		case g.Step > step, abandonedAbove >= 0 && g.Step > abandonedAbove, g.Bad:
		case !older:
			keep, older = true, true
		}
		if !keep {
			removeGen(g.Dir)
			removed = append(removed, g.Step)
		}
	}
	// Directories that never committed (not made by a writer of this
	// package) are not generations; remove them with the rest.
	ents, _ := os.ReadDir(s.rankDir(rank))
	for _, e := range ents {
		if st, ok := parseGenName(e.Name()); ok && !slices.ContainsFunc(gens, func(g Generation) bool { return g.Step == st }) {
			os.RemoveAll(filepath.Join(s.rankDir(rank), e.Name()))
		}
	}
	return removed
}

// removeGen removes the commit marker first, so that no reader counts the
// generation as committed while its files go.
func removeGen(dir string) {
	os.Remove(filepath.Join(dir, markerFile))
	os.RemoveAll(dir)
}

// List returns the committed generations of rank, newest (largest step)
// first, bad ones flagged.
func (s *Store) List(rank int) ([]Generation, error) {
	rdir := s.rankDir(rank)
	ents, err := os.ReadDir(rdir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("persistent directory: list %s: %w", rdir, err)
	}
	var out []Generation
	for _, e := range ents {
		step, ok := parseGenName(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		g, err := s.read(rank, filepath.Join(rdir, e.Name()), step)
		if err != nil {
			continue // not committed
		}
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b Generation) int { return cmp.Compare(b.Step, a.Step) })
	return out, nil
}

// read reads and checks a generation directory; an error means it is not
// a committed generation of rank and step.
func (s *Store) read(rank int, dir string, step int64) (Generation, error) {
	mb, err := os.ReadFile(filepath.Join(dir, markerFile))
	if err != nil {
		return Generation{}, fmt.Errorf("no commit marker: %w", err)
	}
	var mk marker
	if err := json.Unmarshal(mb, &mk); err != nil {
		return Generation{}, fmt.Errorf("unreadable commit marker: %w", err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil {
		return Generation{}, fmt.Errorf("no manifest: %w", err)
	}
	if len(raw) != mk.ManifestBytes || crc32c.Checksum(raw) != mk.ManifestCRC || mk.Step != step {
		return Generation{}, errors.New("manifest does not match its commit marker (torn or altered)")
	}
	g := Generation{Rank: rank, Step: step, Dir: dir, Epoch: mk.Epoch, Node: mk.Node}
	if err := json.Unmarshal(raw, &g.Manifest); err != nil {
		return Generation{}, fmt.Errorf("unreadable manifest: %w", err)
	}
	if m := g.Manifest; m.Rank != rank || m.Step != step || m.JobID != s.job || m.ArenaSize != mk.DataBytes || m.ChunkSize <= 0 {
		return Generation{}, fmt.Errorf("manifest is for job %s rank %d step %d (%d bytes), found as job %s rank %d step %d (%d bytes)",
			m.JobID, m.Rank, m.Step, m.ArenaSize, s.job, rank, step, mk.DataBytes)
	}
	if err := checkCoverage(&g.Manifest); err != nil {
		return Generation{}, err
	}
	_, err = os.Stat(filepath.Join(dir, badFile))
	g.Bad = err == nil
	return g, nil
}

// checkCoverage: every byte a restore copies is covered by a checksum.
// The buffers lie in order in the arena, each with one checksum per chunk.
func checkCoverage(m *tmpfs.Manifest) error {
	var end int64
	for _, b := range m.Buffers {
		// Compared without Offset+Size, which a crafted manifest can make
		// wrap around past the check.
		if b.Offset < end || b.Size < 0 || b.Offset > m.ArenaSize || b.Size > m.ArenaSize-b.Offset ||
			int64(len(b.CRC32C)) != numChunks(b.Size, m.ChunkSize) {
			return fmt.Errorf("manifest: buffer %q at %d+%d with %d checksums does not fit the %d-byte arena in %d-byte chunks",
				b.Name, b.Offset, b.Size, len(b.CRC32C), m.ArenaSize, m.ChunkSize)
		}
		end = b.Offset + b.Size
	}
	return nil
}

// numChunks is how many chunks of cs bytes hold n bytes, without the
// overflow of (n+cs-1)/cs for sizes near the int64 limit.
func numChunks(n, cs int64) int64 {
	c := n / cs
	if n%cs != 0 {
		c++
	}
	return c
}

// CorruptError names the persisted chunks whose bytes do not match their
// CRC-32C.
type CorruptError struct {
	File   string
	Rank   int
	Step   int64
	Chunks []tmpfs.BadChunk
	Short  string // the data file is shorter or longer than the manifest says
}

func (e *CorruptError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "persistent checkpoint %s (rank %d step %d) is corrupt:", e.File, e.Rank, e.Step)
	if e.Short != "" {
		b.WriteString(" " + e.Short + ";")
	}
	for i, c := range e.Chunks {
		if i == 8 {
			fmt.Fprintf(&b, " and %d more chunk(s);", len(e.Chunks)-i)
			break
		}
		fmt.Fprintf(&b, " buffer %q chunk %d (file bytes %d..%d) stored %#08x read %#08x;", c.Buffer, c.Index, c.Offset, c.Offset+c.Length, c.Want, c.Got)
	}
	b.WriteString(" it is marked bad; restore an older step")
	return b.String()
}

func (e *CorruptError) Unwrap() error { return tmpfs.ErrCorrupt }

// Load reads generation g into the arena regions dst gives per buffer,
// verifying every chunk's CRC-32C as it lands. A mismatch is a
// *CorruptError naming the file and every bad chunk; the generation is
// marked bad so that it is not listed again.
func (s *Store) Load(g Generation, dst func(name string) ([]byte, error)) error {
	m := g.Manifest
	path := filepath.Join(g.Dir, dataFile)
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("persistent restore of rank %d step %d: %w", g.Rank, g.Step, err)
	}
	defer f.Close()
	cerr := &CorruptError{File: path, Rank: g.Rank, Step: g.Step}
	if st, err := f.Stat(); err != nil {
		return fmt.Errorf("persistent restore: stat %s: %w", path, err)
	} else if st.Size() != m.ArenaSize {
		cerr.Short = fmt.Sprintf("the data file has %d bytes, the manifest %d", st.Size(), m.ArenaSize)
		s.markBad(g, cerr)
		return cerr
	}
	for _, b := range m.Buffers {
		p, err := dst(b.Name)
		if err != nil {
			return fmt.Errorf("persistent restore of rank %d step %d: %w", g.Rank, g.Step, err)
		}
		if int64(len(p)) != b.Size {
			return fmt.Errorf("persistent restore of rank %d step %d: buffer %q has %d bytes, the arena region %d", g.Rank, g.Step, b.Name, b.Size, len(p))
		}
		for i, want := range b.CRC32C {
			lo, hi := int64(i)*m.ChunkSize, min(int64(i+1)*m.ChunkSize, b.Size)
			if _, err := f.ReadAt(p[lo:hi], b.Offset+lo); err != nil {
				return fmt.Errorf("persistent restore: read %s at %d: %w", path, b.Offset+lo, err)
			}
			if got := crc32c.Checksum(p[lo:hi]); got != want {
				cerr.Chunks = append(cerr.Chunks, tmpfs.BadChunk{Buffer: b.Name, Index: i, Offset: b.Offset + lo, Length: hi - lo, Want: want, Got: got})
			}
		}
	}
	if len(cerr.Chunks) > 0 {
		s.markBad(g, cerr)
		return cerr
	}
	return nil
}

func (s *Store) markBad(g Generation, err error) {
	_ = writeSynced(filepath.Join(g.Dir, badFile), []byte(err.Error()+"\n"))
}

func sameChecksums(a, b *tmpfs.Manifest) bool {
	if a.ArenaSize != b.ArenaSize || a.ChunkSize != b.ChunkSize || len(a.Buffers) != len(b.Buffers) {
		return false
	}
	for i := range a.Buffers {
		x, y := a.Buffers[i], b.Buffers[i]
		if x.Name != y.Name || x.Offset != y.Offset || x.Size != y.Size || !slices.Equal(x.CRC32C, y.CRC32C) {
			return false
		}
	}
	return true
}

// writeSynced creates path (0600) with data and fsyncs it.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
