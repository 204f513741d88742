package metrics

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/reft-hpc/reft/agent/proto"
)

// Every is how often the agent rewrites its textfile: node_exporter reads
// it at each scrape, usually every 15 to 60 s.
const Every = 5 * time.Second

// Textfile is a job's metrics file on a node, <dir>/reft_<job>_<node>.prom,
// in node_exporter's textfile directory.
//
// The agent runs as the job's user, so the directory is shared by every
// user's jobs: a root-made sticky world-writable one (1777, like /tmp),
// where nobody can remove or rename another's file. prometheus'
// WriteToTextfile chmods its temp file by name; here every step goes
// through the directory's descriptor and the file's own: the temp file is
// created O_EXCL|O_NOFOLLOW (a planted link or file fails it), fchmod'ed
// 0644 for node_exporter, and renamed onto the final name, so a scrape
// sees the old file or the new, never half of one. A directory that is
// writable by others but not sticky is refused.
//
// Write and Remove must not run concurrently (Run calls both from one
// goroutine); Close after the last.
type Textfile struct {
	dir  *os.File
	path string // for messages
	name string
}

// FileName is the textfile's name for a job's agent on a node.
func FileName(job, node string) string { return "reft_" + job + "_" + node + ".prom" }

// OpenTextfile opens dir for the job's file; it must be an existing
// directory, not a link, sticky if others may write it.
func OpenTextfile(dir, job, node string) (*Textfile, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("metrics.textfile_dir %s: %w (the admin makes it: install -d -m 1777 %s)", dir, err, dir)
	}
	d := os.NewFile(uintptr(fd), dir)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		d.Close()
		return nil, fmt.Errorf("metrics.textfile_dir %s: %w", dir, err)
	}
	if st.Mode&(unix.S_IWGRP|unix.S_IWOTH) != 0 && st.Mode&unix.S_ISVTX == 0 {
		d.Close()
		return nil, fmt.Errorf("metrics.textfile_dir %s is mode %04o: writable by others without the sticky bit, any user could replace this job's metrics (chmod 1777 %s)",
			dir, st.Mode&07777, dir)
	}
	if job == "" || node == "" {
		d.Close()
		return nil, errors.New("metrics: a textfile needs the job and the node")
	}
	name := FileName(job, node)
	return &Textfile{dir: d, path: dir + "/" + name, name: name}, nil
}

// Path is the textfile's path.
func (t *Textfile) Path() string { return t.path }

// Write replaces the file with the families of st.
func (t *Textfile) Write(st proto.Status) error {
	var buf bytes.Buffer
	if err := Write(&buf, st); err != nil {
		return err
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	// A dot name: node_exporter reads *.prom only.
	return t.writeAs(buf.Bytes(), "."+t.name+"."+hex.EncodeToString(rnd[:]))
}

// writeAs writes b to the temp file tmp, then renames it onto the file.
func (t *Textfile) writeAs(b []byte, tmp string) error {
	dfd := int(t.dir.Fd())
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("metrics: creating %s in %s: %w", tmp, t.dir.Name(), err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(b)
	if err == nil {
		err = unix.Fchmod(fd, 0o644) // whatever the umask: node_exporter runs as another user
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, t.name)
	}
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("metrics: writing %s: %w", t.path, err)
	}
	return nil
}

// Remove removes the file; one already gone is no error.
func (t *Textfile) Remove() error {
	if err := unix.Unlinkat(int(t.dir.Fd()), t.name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("metrics: removing %s: %w", t.path, err)
	}
	return nil
}

// Close closes the directory.
func (t *Textfile) Close() error { return t.dir.Close() }

// Run writes status() to t now and every `every` until ctx ends, then
// removes the file and closes t. A failed write is logged once with why
// (and once when writes work again); the agent goes on without metrics
// meanwhile. status is called from Run's goroutine only.
func Run(ctx context.Context, t *Textfile, status func() proto.Status, every time.Duration, log zerolog.Logger) {
	RunKicked(ctx, t, status, every, nil, log)
}

// RunKicked is Run that also writes at once at every receive from kick
// (the agent kicks it when its detector publishes a failure, which must
// reach the file before a shrinking job stops the agent); the next write
// after a kick is again `every` later. A nil kick never fires.
func RunKicked(ctx context.Context, t *Textfile, status func() proto.Status, every time.Duration, kick <-chan struct{}, log zerolog.Logger) {
	defer t.Close()
	failing := false
	tk := time.NewTicker(every)
	defer tk.Stop()
	for {
		err := t.Write(status())
		switch {
		case err != nil && !failing:
			log.Error().Err(err).Str("file", t.Path()).Msg("metrics textfile not written; the agent goes on without it, and says so again when it works")
		case err == nil && failing:
			log.Info().Str("file", t.Path()).Msg("metrics textfile written again")
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			if err := t.Remove(); err != nil {
				log.Warn().Err(err).Msg("metrics textfile not removed")
			}
			return
		case <-tk.C:
		case <-kick:
			tk.Reset(every)
		}
	}
}
