// Package logging builds the zerolog loggers of reft's daemons.
//
// Every line is JSON in <log dir>/<jobid>/<node>.jsonl and carries the job,
// step, node and restart count, so that `reft log` can join the lines of all
// nodes. When the console writer is a terminal, the same lines are also
// printed there in human-readable form.
package logging

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// Fields identify where a line comes from.
type Fields struct {
	Job     string // Slurm job id
	Step    string // Slurm step id ("extern", "batch", "0", ...)
	Node    string // Slurm node name
	Restart int    // SLURM_RESTART_COUNT of the job
}

// Options configure [Open].
type Options struct {
	Dir     string    // log directory; the file is Dir/<job>/<node>.jsonl
	Level   string    // trace, debug, info, warn or error
	Console io.Writer // also log here, human readable, if it is a terminal; may be nil
	// UID is the uid that must own the job's log directory and file: the
	// job's, which the process runs as. nil: os.Getuid (tests pose as
	// another user with it).
	UID func() int
}

// Path returns the JSON log file of a job on a node.
func Path(dir, job, node string) string {
	return filepath.Join(dir, safe(job), safe(node)+".jsonl")
}

// Open creates (or appends to) the job's log file and returns a logger that
// writes every line to it with f attached. Close the returned io.Closer when
// done.
func Open(o Options, f Fields) (zerolog.Logger, io.Closer, error) {
	lvl, err := zerolog.ParseLevel(o.Level)
	if err != nil || o.Level == "" {
		return zerolog.Nop(), nil, fmt.Errorf("log level %q: valid levels: trace, debug, info, warn, error", o.Level)
	}
	// The directory is shared with every user of the node: the job's
	// own directory in it is checked, and the file opened through it.
	uid := o.UID
	if uid == nil {
		uid = os.Getuid
	}
	d, err := JobDir(o.Dir, f.Job, uid())
	if err != nil {
		return zerolog.Nop(), nil, fmt.Errorf("the job's log: %w", err)
	}
	defer d.Close()
	file, err := OpenIn(d, safe(f.Node)+".jsonl", os.O_WRONLY|os.O_CREATE|os.O_APPEND, uid())
	if err != nil {
		return zerolog.Nop(), nil, fmt.Errorf("the job's log: %w", err)
	}
	var w io.Writer = file
	if IsTerminal(o.Console) {
		w = zerolog.MultiLevelWriter(file, ConsoleWriter(o.Console))
	}
	return With(zerolog.New(w).Level(lvl), f), file, nil
}

// With attaches the identifying fields and a timestamp to a logger.
func With(l zerolog.Logger, f Fields) zerolog.Logger {
	return l.With().Timestamp().
		Str("job", f.Job).Str("step", f.Step).Str("node", f.Node).Int("restart", f.Restart).
		Logger()
}

// ConsoleWriter is the human-readable form for terminals.
func ConsoleWriter(w io.Writer) io.Writer {
	return zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly,
		PartsOrder:    []string{"time", "level", "node", "message"},
		FieldsExclude: []string{"node"}}
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && f != nil && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

func init() {
	zerolog.TimeFieldFormat = time.RFC3339Nano
}

// safe keeps a path component from escaping the log directory.
func safe(s string) string {
	if s == "" || s == "." || s == ".." {
		return "_"
	}
	return strings.NewReplacer("/", "_", "\x00", "_").Replace(s)
}
