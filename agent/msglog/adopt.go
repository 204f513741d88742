package msglog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/reft-hpc/reft/hostmem"
)

// Why a file of an earlier agent's log was removed (Adopted.Lost's keys,
// the msglog_lost event's reasons).
const (
	LostTruncated = "truncated"  // the arena is smaller than its record's message
	LostBadRecord = "bad_record" // the record fails to decode (damaged, cut short)
	LostForeign   = "foreign"    // another job's or user's, or not a regular file
	LostNotArena  = "not_arena"  // the arena is a symlink, not a regular file, another user's
	LostNoArena   = "no_arena"   // a record whose arena is gone
	LostDuplicate = "duplicate"  // a second record of a rank's key
	LostUnusable  = "unreadable" // the arena or record could not be opened or mapped
	LostStaleTemp = "stale_temp" // a record's temporary file: an agent stopped while writing it
	LostUnknown   = "unknown"    // a name this log never makes
	lostDetailMax = 8
)

// Adopted is what Store.Adopt found of an earlier agent's log.
type Adopted struct {
	Messages int   // adopted messages
	Bytes    int64 // their payload bytes
	Ranks    int   // ranks with at least one
	// Unused is the arenas without a record that were removed: appends
	// never committed and arenas kept for reuse. No message was lost.
	Unused int
	// Lost counts what was removed because it could not be used, by why
	// (the Lost* constants): a message (its arena and record) once, a
	// stray file once. Details names the first few with the error; Errors
	// are removals that failed.
	Lost    map[string]int
	Details []string
	Errors  []error
}

// LostCount is how many messages and stray files were removed as
// unusable.
func (a Adopted) LostCount() int {
	n := 0
	for _, c := range a.Lost {
		n += c
	}
	return n
}

// lose counts one lost message or file under why, naming what (a file
// name, or a message's two) with err among the first few.
func (a *Adopted) lose(why, what string, err error) {
	a.Lost[why]++
	if len(a.Details) < lostDetailMax {
		a.Details = append(a.Details, fmt.Sprintf("%s: %s: %v", what, why, err))
	}
}

// Adopt takes over the messages an earlier agent of the job left in
// Config.Dir: each arena with a record of this job and user that
// decodes, whose arena is an arena file of the user at least as large as
// the message, is stored again under its rank and key and counted against
// the rank's cap and the held bytes. Its bytes are checked at read, as
// every message's. Everything else in the directory is removed and
// counted by why. Call it once, before any other method; an error is
// returned only when the directory cannot be read.
func (s *Store) Adopt() (Adopted, error) {
	ad := Adopted{Lost: map[string]int{}}
	ap := adopter{s: s, ad: &ad}
	ents, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return ad, fmt.Errorf("msglog: adopt the log an earlier agent left: %w", err)
	}
	arenas, records := map[string]uint64{}, map[string]bool{}
	for _, e := range ents {
		name := e.Name()
		if n, ok := parseArena(name); ok {
			arenas[name] = n
			s.next = max(s.next, n+1)
			continue
		}
		if base, ok := strings.CutSuffix(name, recordExt); ok {
			if _, isArena := parseArena(base); isArena {
				records[base] = true
				continue
			}
		}
		why := LostUnknown
		if strings.HasPrefix(name, tempPrefix) {
			why = LostStaleTemp
		}
		ap.discard(why, filepath.Join(s.cfg.Dir, name), errors.New("not a file this log keeps"), false)
	}
	// In arena order, so that a duplicate keeps the older message.
	names := make([]string, 0, len(arenas))
	for name := range arenas {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool { return arenas[names[i]] < arenas[names[j]] })
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range names {
		path := filepath.Join(s.cfg.Dir, name)
		if !records[name] {
			ad.Unused++
			ap.discard("", path, nil, true)
			continue
		}
		delete(records, name)
		rec, why, err := ap.record(name, arenas[name])
		if err == nil {
			why, err = ap.adopt(name, rec)
		}
		if err != nil {
			// One message lost: counted once, its two files named.
			ad.lose(why, name+" and its record "+name+recordExt, err)
			ap.discard("", path, nil, true)
			ap.discard("", path+recordExt, nil, false)
			continue
		}
		ad.Messages++
		ad.Bytes += rec.Size
	}
	for name := range records {
		ap.discard(LostNoArena, filepath.Join(s.cfg.Dir, name+recordExt), errors.New("a record whose arena is gone"), false)
	}
	for _, rl := range s.ranks {
		if len(rl.msgs) > 0 {
			ad.Ranks++
		}
	}
	return ad, nil
}

// adopter is one Store.Adopt pass.
type adopter struct {
	s  *Store
	ad *Adopted
}

// record reads the record of arena name (number n) and checks that it is
// this job's and names this arena; else it says why not.
func (ap adopter) record(name string, n uint64) (Record, string, error) {
	s := ap.s
	rec, err := readRecord(filepath.Join(s.cfg.Dir, name+recordExt), s.cfg.UID)
	switch {
	case errors.Is(err, ErrBadRecord):
		return rec, LostBadRecord, err
	case errors.Is(err, errForeign):
		return rec, LostForeign, err
	case err != nil:
		return rec, LostUnusable, err
	case rec.Job != s.cfg.Job:
		return rec, LostForeign, fmt.Errorf("%w: the record is job %s's, this agent is job %s's", errForeign, rec.Job, s.cfg.Job)
	case rec.Arena != n:
		return rec, LostForeign, fmt.Errorf("%w: the record names arena-%d", errForeign, rec.Arena)
	}
	return rec, "", nil
}

// adopt maps arena name and stores rec's message in it; else it says why
// not. Store.mu is held.
func (ap adopter) adopt(name string, rec Record) (string, error) {
	s := ap.s
	rl := s.rank(rec.Rank)
	if rl.msgs[rec.Key] != nil {
		return LostDuplicate, fmt.Errorf("rank %d's %s is held by an older arena already", rec.Rank, rec.Key)
	}
	a, err := s.cfg.Adopt(filepath.Join(s.cfg.Dir, name))
	if err != nil {
		if errors.Is(err, hostmem.ErrNotArena) {
			return LostNotArena, err
		}
		return LostUnusable, err
	}
	if a.Size() < rec.Size {
		a.Close()
		return LostTruncated, fmt.Errorf("the arena has %d bytes, the record's message %d", a.Size(), rec.Size)
	}
	rl.msgs[rec.Key] = &msg{arena: a, size: rec.Size, crc: rec.CRC}
	rl.arenas += a.Size()
	s.held.Add(rec.Size)
	return "", nil
}

// discard removes path (an arena through Config.Discard, which follows a
// hugetlbfs link to its own file only) and counts it under why ("": not
// a loss).
func (ap adopter) discard(why, path string, cause error, arena bool) {
	s, ad := ap.s, ap.ad
	if why != "" {
		ad.lose(why, filepath.Base(path), cause)
	}
	var err error
	if arena && s.cfg.Discard != nil {
		err = s.cfg.Discard(path)
	} else if err = os.Remove(path); os.IsNotExist(err) {
		err = nil
	}
	if err != nil {
		ad.Errors = append(ad.Errors, err)
	}
}

func parseArena(name string) (uint64, bool) {
	n, err := strconv.ParseUint(strings.TrimPrefix(name, "arena-"), 10, 64)
	return n, err == nil && "arena-"+strconv.FormatUint(n, 10) == name
}
