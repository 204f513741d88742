package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/agent/runpath"
)

// CarryName is the file, in the job's run directory on a node, where an
// agent leaves its Recorder's counts for the job's next agent on the node.
//
// A job's agents on a node come and go within the job: reft run stops the
// survivors' agents after a node loss and starts new ones on the shrunk
// allocation. Without a carry, the failure counter they exist to show
// would be 1 only between the verdict and the stop (under a second), and
// a scrape every 15 s would almost never see it. With it, the Recorder's
// counters and histograms count over the job's agents on the node, as a
// Prometheus counter should: they reset only when the job ends.
const CarryName = runpath.CarryName

// carryMax bounds the file read back: a few kilobytes in practice.
const carryMax = 1 << 20

// carryVersion is the file's format; another one is refused.
const carryVersion = 1

// carryFile is CarryName's content.
type carryFile struct {
	Version int            `json:"version"`
	Job     string         `json:"job"`
	Node    string         `json:"node"`
	Metrics *proto.Metrics `json:"metrics"`
}

// Carry adds prev (an earlier agent's Recorder.Status, from ReadCarry) to
// what r reports from now on; prev is checked as ParseCarry checks it. Call
// it before r's Status is first asked for: it must not run concurrently
// with Status.
func (r *Recorder) Carry(prev *proto.Metrics) error {
	if r == nil || prev == nil {
		return nil
	}
	if err := checkCarried(prev); err != nil {
		return fmt.Errorf("metrics carry: %w", err)
	}
	r.carried = prev
	return nil
}

// SaveCarry writes r's Status for the job's next agent on the node into
// the directory dir (the job's run directory, which the agent made 0700
// and checked): runpath.CarryTempName, removed first if a killed agent
// left it and created O_EXCL|O_NOFOLLOW, renamed onto CarryName, so a
// reader sees the old file or the new. Both names are fixed, so that the
// plugin's cleanup at the job's end removes whatever an agent left (it
// removes runpath.RunDirFiles only). One agent of a job runs on a node at
// a time (its lock), so no two SaveCarry race on the names.
func (r *Recorder) SaveCarry(dir *os.File, job, node string) error {
	if r == nil {
		return nil
	}
	b, err := json.Marshal(carryFile{Version: carryVersion, Job: job, Node: node, Metrics: r.Status()})
	if err != nil {
		return fmt.Errorf("metrics carry: %w", err)
	}
	tmp := runpath.CarryTempName
	dfd := int(dir.Fd())
	if err := unix.Unlinkat(dfd, tmp, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("metrics carry: removing a stale %s in %s: %w", tmp, dir.Name(), err)
	}
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("metrics carry: creating %s in %s: %w", tmp, dir.Name(), err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, CarryName)
	}
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("metrics carry: writing %s/%s: %w", dir.Name(), CarryName, err)
	}
	return nil
}

// ReadCarry reads CarryName from dir (the job's run directory): nil, nil
// when there is none (the job's first agent on the node). The file must be
// a regular file of this uid, not a link; a file of another format, job or
// node, or with counts the Recorder could not have made, is an error that
// says so, and the caller starts from zero.
func ReadCarry(dir *os.File, job, node string) (*proto.Metrics, error) {
	fd, err := unix.Openat(int(dir.Fd()), CarryName, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	path := dir.Name() + "/" + CarryName
	if err != nil {
		return nil, fmt.Errorf("metrics carry %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("metrics carry %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Getuid() {
		return nil, fmt.Errorf("metrics carry %s: not a regular file of uid %d (mode %o, uid %d)", path, os.Getuid(), st.Mode, st.Uid)
	}
	b, err := io.ReadAll(io.LimitReader(f, carryMax+1))
	if err != nil {
		return nil, fmt.Errorf("metrics carry %s: %w", path, err)
	}
	m, err := ParseCarry(b, job, node)
	if err != nil {
		return nil, fmt.Errorf("metrics carry %s: %w", path, err)
	}
	return m, nil
}

// ParseCarry decodes a CarryName file's content b, which must be of job
// and node, and checks that its counts are ones a Recorder makes: every
// histogram has the Recorder's buckets for it, cumulative, within its
// count, with a finite non-negative sum; failure classes and restore
// sources are the known ones.
func ParseCarry(b []byte, job, node string) (*proto.Metrics, error) {
	if len(b) > carryMax {
		return nil, fmt.Errorf("larger than %d bytes", carryMax)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c carryFile
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("not a carry file: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not a carry file: data after its JSON object")
	}
	switch {
	case c.Version != carryVersion:
		return nil, fmt.Errorf("format version %d, this agent reads %d", c.Version, carryVersion)
	case c.Job != job || c.Node != node:
		return nil, fmt.Errorf("of job %q node %q, not job %q node %q", c.Job, c.Node, job, node)
	case c.Metrics == nil:
		return nil, errors.New("no metrics")
	}
	if err := checkCarried(c.Metrics); err != nil {
		return nil, err
	}
	return c.Metrics, nil
}

// namedHist is a histogram of a carry and the Recorder's buckets for it.
type namedHist struct {
	name    string
	h       *proto.Histogram
	buckets []float64
}

// checkCarried: m's counts are ones a Recorder makes.
func checkCarried(m *proto.Metrics) error {
	if m.ReplicationSchedule != nil {
		return errors.New("a replication schedule: the Recorder keeps none")
	}
	hists := []namedHist{
		{"snapshot_seconds", m.SnapshotSeconds, snapshotBuckets},
		{"encode_seconds", m.EncodeSeconds, encodeBuckets},
		{"detection_seconds", m.DetectionSeconds, detectionBuckets},
		{"replication_seconds", m.ReplicationSeconds, replicationBuckets},
	}
	for src, h := range m.RestoreSeconds {
		if !slices.Contains(RestoreSources, src) {
			return fmt.Errorf("restore_seconds of unknown source %q", src)
		}
		hists = append(hists, namedHist{"restore_seconds " + src, h, restoreBuckets})
	}
	for _, x := range hists {
		if err := checkHist(x.h, x.buckets); err != nil {
			return fmt.Errorf("%s: %w", x.name, err)
		}
	}
	for cl := range m.FailuresDetected {
		if !slices.Contains(FailureClasses, cl) {
			return fmt.Errorf("failures_detected of unknown class %q", cl)
		}
	}
	return nil
}

// checkHist: h (nil: none) has exactly buckets' upper bounds, cumulative
// counts within h.Count, and a finite non-negative sum.
func checkHist(h *proto.Histogram, buckets []float64) error {
	if h == nil {
		return nil
	}
	if math.IsNaN(h.Sum) || math.IsInf(h.Sum, 0) || h.Sum < 0 {
		return fmt.Errorf("sum %v", h.Sum)
	}
	if len(h.Buckets) != len(buckets) {
		return fmt.Errorf("%d buckets, the Recorder has %d", len(h.Buckets), len(buckets))
	}
	var prev uint64
	for i, b := range h.Buckets {
		if b.LE != buckets[i] {
			return fmt.Errorf("bucket %d's bound %v, the Recorder's is %v", i, b.LE, buckets[i])
		}
		if b.Count < prev || b.Count > h.Count {
			return fmt.Errorf("bucket %d's count %d not between %d and the count %d", i, b.Count, prev, h.Count)
		}
		prev = b.Count
	}
	return nil
}

// addMetrics is a + b (b nil: a), counters and histograms summed; both
// come from Recorders, so their histograms have the same buckets
// (ParseCarry checked b's).
func addMetrics(a, b *proto.Metrics) *proto.Metrics {
	if b == nil {
		return a
	}
	a.SnapshotSeconds = addHist(a.SnapshotSeconds, b.SnapshotSeconds)
	a.EncodeSeconds = addHist(a.EncodeSeconds, b.EncodeSeconds)
	a.DetectionSeconds = addHist(a.DetectionSeconds, b.DetectionSeconds)
	a.ReplicationSeconds = addHist(a.ReplicationSeconds, b.ReplicationSeconds)
	a.ReplicationBytes += b.ReplicationBytes
	for src, h := range b.RestoreSeconds {
		a.RestoreSeconds[src] = addHist(a.RestoreSeconds[src], h)
	}
	for cl, n := range b.FailuresDetected {
		a.FailuresDetected[cl] += n
	}
	return a
}

func addHist(a, b *proto.Histogram) *proto.Histogram {
	if b == nil {
		return a
	}
	if a == nil {
		c := *b
		c.Buckets = slices.Clone(b.Buckets)
		return &c
	}
	a.Count += b.Count
	a.Sum += b.Sum
	for i := range a.Buckets {
		a.Buckets[i].Count += b.Buckets[i].Count
	}
	return a
}
