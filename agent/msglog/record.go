package msglog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/proto"
	"github.com/reft-hpc/reft/internal/crc32c"
)

// A record is a stored message's identity, written next to its arena as
// <arena>.rec so that the job's next agent on the node can adopt the
// message (Store.Adopt). It is a file of its own, not a header in the
// arena, because the rank maps the whole arena writable and copies its
// message to offset 0: a header there would be the rank's to clobber, and
// would shift the protocol's layout. It is written to a temporary name and
// renamed, so a reader sees a whole record or none.
//
// Layout, RecordSize bytes, integers little-endian:
//
//	0   magic "RFTMLOG1"
//	8   arena number (uint64; the N of arena-N)
//	16  rank (uint32)
//	20  step (int64)
//	28  seq (uint32)
//	32  size (int64, payload bytes)
//	40  CRC-32C of the payload (uint32)
//	44  job id length (uint8), then the job id, zero-padded to 64 bytes
//	109 stream length (uint8), then the stream, zero-padded to 64 bytes
//	174 CRC-32C of bytes 0..173 (uint32)
type Record struct {
	Job   string
	Arena uint64
	Rank  int
	Key   Key
	Size  int64
	CRC   uint32
}

// RecordSize is a record file's exact length.
const RecordSize = 178

const (
	recordMagic  = "RFTMLOG1"
	maxRecordJob = 64
	offJob       = 44
	offStream    = offJob + 1 + maxRecordJob
	offSum       = offStream + 1 + proto.MaxLogStream
	recordExt    = ".rec"
	tempPrefix   = ".tmp-"
)

// ErrBadRecord is wrapped by every DecodeRecord error.
var ErrBadRecord = errors.New("bad message log record")

func (r Record) check() error {
	switch {
	case r.Job == "" || len(r.Job) > maxRecordJob:
		return fmt.Errorf("job id %q must be 1 to %d bytes", r.Job, maxRecordJob)
	case r.Rank < 0 || r.Rank > math.MaxInt32:
		return fmt.Errorf("rank %d is out of range", r.Rank)
	case r.Size <= 0:
		return fmt.Errorf("size %d must be positive", r.Size)
	}
	return proto.CheckLogKey(r.Key)
}

// EncodeRecord returns r's RecordSize bytes.
func EncodeRecord(r Record) ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("msglog: record of arena-%d: %w", r.Arena, err)
	}
	b := make([]byte, RecordSize)
	copy(b, recordMagic)
	le := binary.LittleEndian
	le.PutUint64(b[8:], r.Arena)
	le.PutUint32(b[16:], uint32(r.Rank))
	le.PutUint64(b[20:], uint64(r.Key.Step))
	le.PutUint32(b[28:], uint32(r.Key.Seq))
	le.PutUint64(b[32:], uint64(r.Size))
	le.PutUint32(b[40:], r.CRC)
	b[offJob] = byte(len(r.Job))
	copy(b[offJob+1:], r.Job)
	b[offStream] = byte(len(r.Key.Stream))
	copy(b[offStream+1:], r.Key.Stream)
	le.PutUint32(b[offSum:], crc32c.Checksum(b[:offSum]))
	return b, nil
}

// DecodeRecord reads a record written by EncodeRecord. It refuses
// anything else (length, magic, checksum, nonzero padding, an invalid
// key, size or job) with an error wrapping ErrBadRecord.
func DecodeRecord(b []byte) (Record, error) {
	bad := func(format string, a ...any) (Record, error) {
		return Record{}, fmt.Errorf("%w: %s", ErrBadRecord, fmt.Sprintf(format, a...))
	}
	if len(b) != RecordSize {
		return bad("%d bytes, a record has %d (truncated, or not a record)", len(b), RecordSize)
	}
	if string(b[:8]) != recordMagic {
		return bad("magic %q is not %q", b[:8], recordMagic)
	}
	le := binary.LittleEndian
	if got, want := crc32c.Checksum(b[:offSum]), le.Uint32(b[offSum:]); got != want {
		return bad("CRC-32C %#08x, the record says %#08x (damaged)", got, want)
	}
	field := func(off, max int) (string, bool) {
		n := int(b[off])
		if n > max {
			return "", false
		}
		for _, c := range b[off+1+n : off+1+max] {
			if c != 0 {
				return "", false
			}
		}
		return string(b[off+1 : off+1+n]), true
	}
	job, ok1 := field(offJob, maxRecordJob)
	stream, ok2 := field(offStream, proto.MaxLogStream)
	if !ok1 || !ok2 {
		return bad("a job id or stream field is longer than its room or not zero-padded")
	}
	r := Record{
		Job:   job,
		Arena: le.Uint64(b[8:]),
		Rank:  int(le.Uint32(b[16:])),
		Key:   Key{Stream: stream, Step: int64(le.Uint64(b[20:])), Seq: int(le.Uint32(b[28:]))},
		Size:  int64(le.Uint64(b[32:])),
		CRC:   le.Uint32(b[40:]),
	}
	if err := r.check(); err != nil {
		return bad("%v", err)
	}
	return r, nil
}

// writeRecord stores r as dir/<name>.rec: a temporary file, then a rename.
func writeRecord(dir, name string, r Record) error {
	b, err := EncodeRecord(r)
	if err != nil {
		return err
	}
	final := filepath.Join(dir, name+recordExt)
	tmp := filepath.Join(dir, tempPrefix+name+recordExt)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("msglog: write the record of %s: %w", name, err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, final)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("msglog: write the record of %s: %w", name, err)
	}
	return nil
}

// readRecord reads dir/<name>.rec, which must be a regular file of uid
// (when uid >= 0), opened without following a link.
func readRecord(path string, uid int) (Record, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ELOOP) {
		return Record{}, fmt.Errorf("%w: a symlink", errForeign)
	}
	if err != nil {
		return Record{}, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return Record{}, err
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return Record{}, fmt.Errorf("%w: not a regular file (type %#o)", errForeign, st.Mode&unix.S_IFMT)
	case uid >= 0 && int(st.Uid) != uid:
		return Record{}, fmt.Errorf("%w: owned by uid %d, not the job's user %d", errForeign, st.Uid, uid)
	case st.Size != RecordSize:
		return Record{}, fmt.Errorf("%w: %d bytes, a record has %d", ErrBadRecord, st.Size, RecordSize)
	}
	b := make([]byte, RecordSize)
	if _, err := f.ReadAt(b, 0); err != nil {
		return Record{}, err
	}
	return DecodeRecord(b)
}

// errForeign: a file of the log's directory that this job's agent did not
// write (another user's, another job's, not a regular file).
var errForeign = errors.New("not this job's")
